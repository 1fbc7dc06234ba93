// NoOffload's memory model (the interface of planner/memory_model.hpp), beside its pipeline
// (no_offload.cpp): all the FP32 state stays on the GPU and the update runs there once
// backward is done, so the mode adds no terms of its own to those every mode shares; on
// the fused AdamW it trades the FP32 accumulators for autograd's bf16 gradients.
#include "planner/memory_model.hpp"

namespace primecfg::train::plan::detail {

namespace {

class NoOffloadMemory final : public MemoryModel {
 public:
  DeviceState device_state() const override {
    return {!NoOffload::masters_on_host, !NoOffload::grads_on_host, !NoOffload::moments_on_host};
  }
  std::vector<std::string> device_buffers(const Workload&, Builder&) const override { return {}; }
  LossWalk loss_walk(const Workload&) const override { return LossWalk::tokens; }
  // update_resident() (offload/shared/device_update.cpp) in finish_step().
  UpdateAt update_at(const Workload&) const override { return UpdateAt::optimizer_phase; }
  // NoOffloadPipeline on the fused AdamW (ResidentUpdate::applies_to): bf16 weights on
  // CUDA, AdamW, no sharding, and a step of one micro-batch.
  bool hands_over_grads(const Workload& w) const override {
    return w.a.cuda && w.dt == 2 && w.a.fused_adamw && w.opt.kind == OptKind::adamw && !w.a.sharded() &&
           w.micro_batches == 1;
  }
  // The hand-over's hooks only keep tensors, so its steps replay; not with activation
  // offloading (host waits) or a document mask (packed rows), nor where --no-cuda-graph.
  bool replays_graph(const Workload& w) const override {
    return hands_over_grads(w) && w.a.cuda_graph.value_or(true) && !w.ac_offload && !w.masked;
  }
  HostTerms host_terms(const Workload&, Builder&) const override { return {}; }
  i64 reserved_gpu(const Workload&) const override { return 0; }
};

}  // namespace

template <>
const MemoryModel& memory_model<NoOffload>() {
  static const NoOffloadMemory model;
  return model;
}

}  // namespace primecfg::train::plan::detail
