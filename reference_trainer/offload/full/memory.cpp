// FullOffload's memory model (the interface of planner/memory_model.hpp), beside its pipeline
// (full_offload.cpp, worker.cpp, tied.cpp): masters, moments and gradient
// accumulators live in host memory and the CPU worker runs the update, so the GPU
// keeps only the compute weights; gradients go down through a pinned staging ring and
// new bf16 weights come up through another.
#include "offload/full/ring.hpp"
#include "planner/memory_model.hpp"

#include "nn/loss_chunking.hpp"

#include <algorithm>

namespace primecfg::train::plan::detail {

namespace {

class FullOffloadMemory final : public MemoryModel {
 public:
  DeviceState device_state() const override {
    return {!FullOffload::masters_on_host, !FullOffload::grads_on_host, !FullOffload::moments_on_host};
  }

  std::vector<std::string> device_buffers(const Workload&, Builder&) const override { return {}; }

  // With a tied embedding and few tokens the loss walks the vocabulary, so that the
  // CPU update of the head's rows starts during the loss (loss_chunks()).
  LossWalk loss_walk(const Workload& w) const override {
    return vocab_chunked_loss(w.s.tie_embeddings, w.N) ? LossWalk::vocabulary : LossWalk::tokens;
  }

  UpdateAt update_at(const Workload&) const override { return UpdateAt::host; }
  bool hands_over_grads(const Workload&) const override { return false; }
  bool replays_graph(const Workload&) const override { return false; }

  HostTerms host_terms(const Workload& w, Builder& b) const override {
    const i64 dt = w.dt;
    const bool pinned = w.a.cuda;
    auto pin = [&](i64 bytes) { return pinned_bytes(w, bytes); };
    i64 masters = 0, grads = 0, moments = 0;
    for (const auto& p : w.params) {
      const i64 n = piece_numel(w, p);  // the FP32 state: this rank's piece
      // bf16-model masters stay in pageable memory; fp32 weights upload straight from
      // pinned masters.
      masters += dt == 2 || !pinned ? 4 * n : pin(4 * n);
      grads += 4 * n;
      moments += moment_count(w.opt, p) * 4 * n;
    }
    // The rings, the weights' copies and the temporaries below stay full size.
    const i64 max_n = largest_numel(w);
    HostTerms t;
    b.add("moments", moments, "optimizer moments");
    b.add("masters", masters, "FP32 master weights");
    t.state = {"moments", "masters"};
    // Accumulators exist only when a step has several micro-batches.
    if (w.micro_batches > 1) {
      b.add("grads", grads, "FP32 gradient accumulators (gradient accumulation)");
      t.state.emplace_back("grads");
    }
    const i64 ring = full_ring_bytes(w);
    b.add("grad_ring", pin(ring), "pinned staging ring the gradients land in");
    t.state.emplace_back("grad_ring");
    if (pinned && dt == 2) {
      b.add("upload_ring", pin(ring), "pinned ring of new bf16 weights going up");
      t.state.emplace_back("upload_ring");
    }
    // A tied embedding's LM-head gradient lands in a buffer of its own (its update
    // runs in slices whenever the CPU has nothing else to do): this rank's piece of it.
    if (w.s.tie_embeddings) {
      b.add("head_grad", pin(shard_numel(w.s.vocab_size * w.s.hidden, w.shard_world) * dt),
            "pinned buffer of the tied LM head's gradient (this rank's piece)");
      t.state.emplace_back("head_grad");
    }
    // Startup copies the bf16 weights into the FP32 masters through a bf16 host copy;
    // with accumulation the worker squares an FP32 accumulator for the norm.
    b.add("state_transient", std::max(dt == 2 && pinned ? 2 * max_n : 0, w.micro_batches > 1 ? 4 * max_n : 0),
          "largest parameter's host temporaries (master init / norm)");
    t.step = {"state_transient"};
    return t;
  }

  // Freed gradients stay reserved until their copy into the staging ring ran; the
  // ring bounds how many are in flight.
  i64 reserved_gpu(const Workload& w) const override { return w.a.cuda ? full_ring_bytes(w) : 0; }
};

}  // namespace

template <>
const MemoryModel& memory_model<FullOffload>() {
  static const FullOffloadMemory model;
  return model;
}

}  // namespace primecfg::train::plan::detail
