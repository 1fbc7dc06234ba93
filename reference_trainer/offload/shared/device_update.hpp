// The parts of NoOffload that OptimizerOffload shares: FP32 gradient accumulators on
// the device, the global norm with clipping, and the update of every parameter in
// multi-tensor launches (OptimizerOffload runs it on the CPU, where its "pinned"
// moments are plain host memory beside the masters).
//
// Internal to primecfg-train.
#pragma once

#include "offload/shared/param_state.hpp"

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace primecfg::train {

// Device accumulators over the micro-batches of a step. The first gradient of the
// step is copied into the accumulator and later ones added, so the accumulators are
// not zeroed at the start (a launch per parameter, and a pass over 4 bytes per
// parameter, saved each step); those that got no gradient are zeroed at the end.
class DeviceAccumulators {
 public:
  void begin_step(std::size_t params) { fresh_.assign(params, 1); }
  // From the gradient hook of parameter i.
  void add(std::size_t i, ParamState& s, const Tensor& g) {
    if (fresh_[i]) {
      s.grad.copy_(g);
      fresh_[i] = 0;
    } else {
      s.grad.add_(g);
    }
  }
  // After backward: parameters without a gradient this step get zeros.
  void zero_missing(std::vector<ParamState>& states) {
    for (std::size_t i = 0; i < states.size(); ++i)
      if (fresh_[i]) states[i].grad.zero_();
  }

 private:
  std::vector<char> fresh_;  // no gradient yet this step (hooks write, main reads after backward)
};

// The global gradient norm before clipping (FP32 norms per parameter, squared and
// summed in FP64, then over the ranks with `dp`), on the device; with `max_norm` the
// gradients are scaled to it. No host round trip before the update.
Tensor clip_grad_norm(std::vector<ParamState>& states, const std::optional<double>& max_norm, Sharding* dp);

// Every parameter's update, the new weights copied into the model.
void update_resident(std::vector<ParamState>& states, const OptSettings& opt, double lr, std::int64_t step);

}  // namespace primecfg::train
