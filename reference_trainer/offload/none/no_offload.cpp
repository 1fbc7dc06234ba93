#include "offload/none/no_offload.hpp"

namespace primecfg::train {

NoOffloadPipeline::NoOffloadPipeline(Transformer& model, const OptSettings& opt, const RunOptions& run,
                                     Sharding* dp)
    : opt_(opt),
      dp_(dp),
      trace_(run.profile.host_trace),
      update_(run.kernels.fused && run.kernels.adamw),
      hand_over_(!dp && update_.applies_to(model, opt)) {
  const auto dev = torch::TensorOptions().dtype(torch::kFloat32).device(model.device());
  states_ = place_state(model, opt, Placement{dev, dev, /*device_grads=*/!hand_over_, dev, dev}, dp);
  masters_from_model();
  hooks_.install(
      states_, trace_, step_,
      [this](std::size_t i, ParamState& s, Tensor& g) {
        if (!handing_over_) return grads_.add(i, s, g);
        // Autograd sums every use of a parameter before its hook: one gradient a step.
        TORCH_CHECK(!compute_grads_[i].defined(), "NoOffload: a second gradient for ", s.p->name,
                    " in a step of one micro-batch");
        compute_grads_[i] = g;
      },
      dp);
}

void NoOffloadPipeline::capture_failed() {
  // The hooks may have run for some parameters, and autograd may have left a gradient it
  // had not handed over yet: both in the graph's pool, neither of this step's eager run.
  for (auto& s : states_) s.p->tensor.mutable_grad() = Tensor();
  if (handing_over_) compute_grads_.assign(states_.size(), Tensor());
  graph_grads_.clear();
}

void NoOffloadPipeline::masters_from_model() {
  torch::NoGradGuard ng;
  for (auto& s : states_) master_from_weights(s);
}

void NoOffloadPipeline::begin_step(double lr, std::int64_t step, bool single_micro_batch) {
  lr_ = lr;
  step_ = step;
  handing_over_ = hand_over_ && single_micro_batch;
  if (handing_over_) {
    compute_grads_.assign(states_.size(), Tensor());
    return;
  }
  // A step of several micro-batches sums them in FP32: the accumulators are made the
  // first time one comes (DeviceAccumulators overwrites them with the first gradient).
  for (auto& s : states_)
    if (!s.grad.defined()) s.grad = torch::empty_like(s.master);
  grads_.begin_step(states_.size());
}

double NoOffloadPipeline::finish_step() {
  const auto began = spans_.finish_begins(step_);
  Tensor norm;
  if (handing_over_) {
    // A parameter the step did not use has a zero gradient, as with the accumulators; the
    // kernel reads each gradient as one dense run of values.
    for (std::size_t i = 0; i < states_.size(); ++i) {
      Tensor& g = compute_grads_[i];
      if (!g.defined())
        g = torch::zeros_like(states_[i].weight);
      else if (!g.is_contiguous())
        g = g.contiguous();
    }
    norm = update_.step(states_, opt_, lr_, step_, dp_, &compute_grads_);
    compute_grads_.clear();  // freed once the update has read them (the allocator orders it)
  } else {
    grads_.zero_missing(states_);
    norm = update_.step(states_, opt_, lr_, step_, dp_);
  }
  const double n = norm.item<double>();
  spans_.finish_ends(began, step_);
  return n;
}

}  // namespace primecfg::train
