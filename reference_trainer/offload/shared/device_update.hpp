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

// clip_grad_norm and update_resident in one pass over the state (two with clipping), on
// the fused AdamW kernel (optim/kernels/adamw.hpp) where it applies: AdamW, FP32
// masters and moments and bf16 weights, all on one CUDA device, in a build with the
// kernels, `enabled` (kernels.fused and kernels.adamw). Elsewhere the two calls above.
// The masters and moments come out as _fused_adamw_'s; the norm is summed per chunk
// rather than per parameter (a different rounding of the same sum).
class ResidentUpdate {
 public:
  explicit ResidentUpdate(bool enabled) : enabled_(enabled) {}

  // Whether the fused kernel would take the update of `model`'s parameters under `opt`
  // (known before the state is made). Without sharding, a step of one micro-batch can
  // then hand it autograd's bf16 gradients as they are: no FP32 accumulator, no copy.
  bool applies_to(Transformer& model, const OptSettings& opt) const;

  // The update; `compute_grads` (one per state, the bf16 gradients autograd made) in
  // place of the states' FP32 accumulators. Returns the global norm before clipping, on
  // the device (FP64).
  Tensor step(std::vector<ParamState>& states, const OptSettings& opt, double lr, std::int64_t step,
              Sharding* dp, const std::vector<Tensor>* compute_grads = nullptr);
  // Whether the last step ran on the fused kernel.
  bool fused() const { return fused_; }

 private:
  bool applies(const std::vector<ParamState>& states, const OptSettings& opt,
               const std::vector<Tensor>* compute_grads) const;
  void upload_table(const std::vector<ParamState>& states, const std::vector<Tensor>* compute_grads);

  bool enabled_;
  bool fused_ = false;
  std::vector<std::uint8_t> table_host_;  // the table as on the device
  Tensor table_, chunk_sq_, total_sq_, step_t_;
  std::int64_t chunks_ = 0;
};

}  // namespace primecfg::train
