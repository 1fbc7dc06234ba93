#include "offload/none/no_offload.hpp"

namespace primecfg::train {

NoOffloadPipeline::NoOffloadPipeline(Transformer& model, const OptSettings& opt, const RunOptions& run,
                                     Sharding* dp)
    : opt_(opt), dp_(dp), trace_(run.profile.host_trace) {
  const auto dev = torch::TensorOptions().dtype(torch::kFloat32).device(model.device());
  states_ = place_state(model, opt, Placement{dev, dev, true, dev, dev}, dp);
  masters_from_model();
  hooks_.install(
      states_, trace_, step_, [this](std::size_t i, ParamState& s, Tensor& g) { grads_.add(i, s, g); }, dp);
}

void NoOffloadPipeline::masters_from_model() {
  torch::NoGradGuard ng;
  for (auto& s : states_) master_from_weights(s);
}

void NoOffloadPipeline::begin_step(double lr, std::int64_t step, bool) {
  lr_ = lr;
  step_ = step;
  grads_.begin_step(states_.size());
}

double NoOffloadPipeline::finish_step() {
  const auto began = spans_.finish_begins(step_);
  grads_.zero_missing(states_);
  Tensor norm = clip_grad_norm(states_, opt_.max_norm, dp_);
  update_resident(states_, opt_, lr_, step_);
  const double n = norm.item<double>();
  spans_.finish_ends(began, step_);
  return n;
}

}  // namespace primecfg::train
