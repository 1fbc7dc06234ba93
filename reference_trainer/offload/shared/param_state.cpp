#include "offload/shared/param_state.hpp"

#include <torch/csrc/autograd/function_hook.h>

#include <memory>
#include <utility>

namespace primecfg::train {

namespace {

// Fires after autograd accumulated a parameter's gradient.
struct GradReadyHook final : torch::autograd::PostAccumulateGradHook {
  std::function<void(const torch::autograd::Variable&)> fn;
  explicit GradReadyHook(std::function<void(const torch::autograd::Variable&)> f) : fn(std::move(f)) {}
  void operator()(const torch::autograd::Variable& t) override { fn(t); }
};

}  // namespace

std::vector<ParamState> place_state(Transformer& model, const OptSettings& opt, const Placement& where,
                                    const Sharding* dp) {
  std::vector<ParamState> states;
  auto& params = model.params();
  for (std::size_t i = 0; i < params.size(); ++i) {
    NamedParam& p = params[i];
    ParamState s;
    s.p = &p;
    std::vector<std::int64_t> sizes(p.tensor.sizes().begin(), p.tensor.sizes().end());
    if (dp) {
      s.shard = dp->span(i);
      sizes = {s.shard->per_rank};
      s.weight = dp->weight_shard(i);
    } else {
      s.weight = p.tensor.detach();
    }
    const bool bf16_weights = p.tensor.scalar_type() == torch::kBFloat16;
    s.master = torch::empty(sizes, bf16_weights ? where.master : where.master_fp32_weights);
    if (where.device_grads) s.grad = torch::zeros(sizes, where.grads);
    const int moments = moment_count(opt, p);
    if (moments >= 1) s.m1 = torch::zeros(sizes, where.moments);
    if (moments >= 2) s.m2 = torch::zeros(sizes, where.moments);
    states.push_back(std::move(s));
  }
  return states;
}

void master_from_weights(ParamState& s) {
  torch::NoGradGuard ng;
  if (!s.shard) {
    s.master.copy_(s.p->tensor);
    return;
  }
  s.master.zero_();  // the padding stays zero
  if (s.shard->length > 0)
    s.master.narrow(0, 0, s.shard->length).copy_(s.weight.narrow(0, 0, s.shard->length));
}

void add_host_bytes(double& acc, const Tensor& t) {
  if (t.defined() && t.device().is_cpu()) acc += static_cast<double>(t.nbytes());
}

std::map<std::string, double> host_state_bytes(const std::vector<ParamState>& states) {
  std::map<std::string, double> out{{"masters", 0}, {"grads", 0}, {"moments", 0}, {"staging", 0}};
  for (const auto& s : states) {
    add_host_bytes(out["masters"], s.master);
    add_host_bytes(out["grads"], s.grad);
    add_host_bytes(out["moments"], s.m1);
    add_host_bytes(out["moments"], s.m2);
  }
  return out;
}

void GradHooks::install(std::vector<ParamState>& states, HostTrace& trace, const std::int64_t& step,
                        Fn on_grad, Sharding* dp) {
  states_ = &states;
  trace_ = &trace;
  step_ = &step;
  on_grad_ = std::move(on_grad);
  dp_ = dp;
  if (dp_) dp_->set_sink([this](std::size_t i, Tensor& piece) { on_grad_(i, (*states_)[i], piece); });
  for (std::size_t i = 0; i < states.size(); ++i) {
    torch::autograd::impl::set_post_acc_grad_hooks(
        states[i].p->tensor, std::make_unique<GradReadyHook>([this, i](const torch::autograd::Variable&) {
          torch::NoGradGuard ng;
          ParamState& s = (*states_)[i];
          Tensor& g = s.p->tensor.mutable_grad();
          if (!g.defined()) return;
          if (s.p->frozen) g.zero_();  // as if it had none: no share of the norm, moments stay zero
          const auto h_hook = HostTrace::now();
          if (dp_)
            dp_->add_grad(i, g);
          else
            on_grad_(i, s, g);
          g = Tensor();
          if (trace_->on()) trace_->span("hooks", "hook " + s.p->name, h_hook, HostTrace::now(), *step_);
        }));
  }
}

void GradHooks::remove() {
  if (!states_) return;
  for (auto& s : *states_) torch::autograd::impl::set_post_acc_grad_hooks(s.p->tensor, nullptr);
  states_ = nullptr;
}

}  // namespace primecfg::train
