// offload = "none": masters, gradient accumulators and moments all on the device;
// after backward, the norm, clipping and the update in one fused pass (or ATen's
// multi-tensor launches: offload/shared/device_update.hpp). Where the fused AdamW takes
// the update of an unsharded run, a step of one micro-batch hands it autograd's bf16
// gradients as they are, and the FP32 accumulators are made only for a step of several.
//
// Internal to primecfg-train. The calls the training loop makes are listed in
// offload/pipeline.hpp.
#pragma once

#include "base/host_trace.hpp"
#include "base/run_error.hpp"
#include "offload/shared/device_update.hpp"
#include "offload/shared/param_state.hpp"
#include "options.hpp"

#include <primecfg/offload.hpp>

#include <map>
#include <string>
#include <vector>

namespace primecfg::train {

class NoOffloadPipeline {
 public:
  using strategy = NoOffload;

  NoOffloadPipeline(Transformer& model, const OptSettings& opt, const RunOptions& run, Sharding* dp);
  NoOffloadPipeline(const NoOffloadPipeline&) = delete;
  NoOffloadPipeline& operator=(const NoOffloadPipeline&) = delete;
  ~NoOffloadPipeline() { hooks_.remove(); }

  std::vector<ParamState>& states() { return states_; }
  void masters_from_model();
  void sync_host() {}

  void begin_step(double lr, std::int64_t step, bool single_micro_batch);
  void begin_last_micro_batch(const std::vector<std::int64_t>&, const std::vector<std::int64_t>&) {
    spans_.forward_begins();
  }
  void before_backward() { spans_.backward_begins(step_); }
  const Transformer::BlockHook* block_hook() const { return nullptr; }
  Transformer::LossHooks loss_hooks(bool) const { return {}; }
  Transformer::LossChunks loss_chunks(std::int64_t) const { return Transformer::LossChunks::tokens; }
  double finish_step();
  void end_step() { spans_.step_ends(step_); }
  // The hand-over's hooks only keep autograd's gradients: a replay of the capture writes
  // the same tensors, which the update then reads.
  bool replayable() const { return hand_over_; }
  void captured() { graph_grads_ = compute_grads_; }
  void replayed() { compute_grads_ = graph_grads_; }
  void capture_failed();

  std::map<std::string, double> pipeline_stats() const { return {}; }
  std::map<std::string, double> host_bytes() const { return host_state_bytes(states_); }

 private:
  OptSettings opt_;
  Sharding* dp_;
  HostTrace trace_;
  StepSpans spans_{trace_};
  std::vector<ParamState> states_;
  DeviceAccumulators grads_;
  ResidentUpdate update_;
  bool hand_over_;                     // the fused update may read autograd's gradients
  bool handing_over_ = false;          // this step does (one micro-batch)
  std::vector<Tensor> compute_grads_;  // this step's, from the hooks, until the update
  std::vector<Tensor> graph_grads_;    // those of the captured backward, which each replay rewrites
  GradHooks hooks_;
  double lr_ = 0;
  std::int64_t step_ = 0;
};

}  // namespace primecfg::train
