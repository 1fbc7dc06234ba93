// OptimizerOffload's memory model (the interface of planner/memory_model.hpp), beside its pipeline
// (optimizer_offload.cpp): masters and gradient accumulators stay on the GPU, the
// moments live in host memory (pinned on CUDA) and stream through a device window
// for the update.
#include "offload/shared/ring_size.hpp"
#include "planner/memory_model.hpp"

#include <algorithm>

namespace primecfg::train::plan::detail {

namespace {

// Without clipping (on CUDA) each parameter is updated in its gradient hook, and the
// input embedding, whose gradient comes last, keeps its moments in a buffer of its own
// (OptimizerOffloadPipeline's overlap_ and tail_, optimizer_offload.hpp).
bool updates_in_hooks(const Workload& w) { return w.a.cuda && !w.opt.clip; }

class OptimizerOffloadMemory final : public MemoryModel {
 public:
  DeviceState device_state() const override {
    return {!OptimizerOffload::masters_on_host, !OptimizerOffload::grads_on_host,
            !OptimizerOffload::moments_on_host};
  }

  std::vector<std::string> device_buffers(const Workload& w, Builder& b) const override {
    if (!w.a.cuda) return {};
    const i64 blk = device_rounding(w);
    // With the updates in the hooks the window serves every moment but the input
    // embedding's (its tail buffer).
    const bool split_tail = updates_in_hooks(w);
    i64 largest_moments = 0, total_moments = 0, tail_moments = 0;
    for (const auto& p : w.params) {
      const i64 bytes = 4 * piece_numel(w, p) * moment_count(w.opt, p);  // the rank's piece
      if (split_tail && p.name == kEmbeddingParam) {
        tail_moments = bytes;
        continue;
      }
      largest_moments = std::max(largest_moments, bytes);
      total_moments += bytes;
    }
    b.add("moment_window", round_up(ring_capacity(largest_moments, total_moments, w.a.ring_bytes), blk),
          "device window the moments stream through (kept after the first step)");
    if (tail_moments == 0) return {"moment_window"};
    b.add("moment_tail", round_up(tail_moments, blk),
          "the input embedding's moments, fetched beside the forward pass (from the second step)");
    return {"moment_window", "moment_tail"};
  }

  LossWalk loss_walk(const Workload&) const override { return LossWalk::tokens; }

  // In the hooks the update's temporaries land in backward; with clipping the updates
  // wait for the global norm and run after backward.
  UpdateAt update_at(const Workload& w) const override {
    return updates_in_hooks(w) ? UpdateAt::gradient_hooks : UpdateAt::optimizer_phase;
  }
  bool hands_over_grads(const Workload&) const override { return false; }
  bool replays_graph(const Workload&) const override { return false; }

  HostTerms host_terms(const Workload& w, Builder& b) const override {
    i64 moments = 0;
    for (const auto& p : w.params) moments += moment_count(w.opt, p) * pinned_bytes(w, 4 * piece_numel(w, p));
    b.add("moments", moments, w.a.cuda ? "optimizer moments, pinned" : "optimizer moments");
    return {{"moments"}, {}};
  }

  i64 reserved_gpu(const Workload&) const override { return 0; }
};

}  // namespace

template <>
const MemoryModel& memory_model<OptimizerOffload>() {
  static const OptimizerOffloadMemory model;
  return model;
}

}  // namespace primecfg::train::plan::detail
