#include "offload/shared/device_update.hpp"

namespace primecfg::train {

Tensor clip_grad_norm(std::vector<ParamState>& states, const std::optional<double>& max_norm, Sharding* dp) {
  std::vector<Tensor> grads;
  for (auto& s : states) grads.push_back(s.grad);
  Tensor sq = at::stack(at::_foreach_norm(grads, 2)).to(torch::kFloat64).square().sum();
  if (dp) dp->sum_pieces(sq, "the sum of the gradient norms");
  Tensor norm = sq.sqrt();
  if (max_norm)
    at::_foreach_mul_(grads, (norm + 1e-6).reciprocal().mul(*max_norm).clamp_max(1.0).to(torch::kFloat32));
  return norm;
}

void update_resident(std::vector<ParamState>& states, const OptSettings& opt, double lr, std::int64_t step) {
  torch::NoGradGuard ng;
  if (opt.kind == OptKind::adamw) {
    // One multi-tensor launch for all parameters (the same arithmetic as one
    // call per parameter).
    std::vector<Tensor> ps, gs, a, b;
    for (auto& s : states) {
      ps.push_back(s.master);
      gs.push_back(s.grad);
      a.push_back(s.m1);
      b.push_back(s.m2);
    }
    Tensor step_t = torch::full({}, static_cast<double>(step), states[0].master.options());
    std::vector<Tensor> steps(states.size(), step_t);
    at::_fused_adamw_(ps, gs, a, b, {}, steps, lr, opt.beta1, opt.beta2, opt.weight_decay, opt.eps, false,
                      false);
  } else {
    for (auto& s : states)
      update_on_device(opt, *s.p, s.master, s.grad, s.m1.defined() ? &s.m1 : nullptr,
                       s.m2.defined() ? &s.m2 : nullptr, lr, step);
  }
  // The new weights, in one multi-tensor launch.
  std::vector<Tensor> weights, masters;
  for (auto& s : states) {
    weights.push_back(s.weight);
    masters.push_back(s.master);
  }
  at::_foreach_copy_(weights, masters);
}

}  // namespace primecfg::train
