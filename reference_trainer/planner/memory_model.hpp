// What an offload mode tells the memory planner: the interface of a mode's memory
// model, and the one mapping from a strategy of <primecfg/offload.hpp> to its model.
// The planner owns the interface and never includes offload/: each mode implements it
// beside its pipeline, so the dependency runs one way (offload/ -> planner/).
//
// Each mode's model sits beside its pipeline (offload/none/memory.cpp,
// offload/optimizer/memory.cpp, offload/full/memory.cpp) and counts what that
// pipeline allocates; planner/memory.cpp counts what every mode shares (weights,
// activations, the LM head, backward) and adds it all up into phases, asking the
// mode's model wherever the modes differ, so it tests no mode itself.
// docs/memory-planner.md derives every term. No LibTorch: part of the planner.
#pragma once

#include "planner/memory.hpp"

#include <primecfg/offload.hpp>

#include <string>
#include <vector>

namespace primecfg::train::plan::detail {

// The FP32 training state a mode keeps in device memory between steps (per rank: the
// rank's shard). What is not there lives on the host, in the mode's host terms.
struct DeviceState {
  bool masters = false, grads = false, moments = false;
};

// How the fused LM head + cross-entropy walks the logits, as the pipeline's
// loss_chunks() asks the Transformer (Transformer::LossChunks; nn/loss_chunking.hpp).
// The two walks keep different terms, which the planner counts.
enum class LossWalk { tokens, vocabulary };

// Where the optimizer update runs, and so in which phases its device temporaries
// (the step_transient term) are alive.
enum class UpdateAt {
  optimizer_phase,  // on the device once backward is done: the optimizer_step phase
  gradient_hooks,   // on the device in each parameter's gradient hook: the backward phases too
  host,             // on the CPU: no device temporaries, no optimizer_step phase
};

// The host terms a mode added, by when they are alive.
struct HostTerms {
  std::vector<std::string> state;  // through the whole run (the step and a checkpoint's save)
  std::vector<std::string> step;   // during the step only
};

class MemoryModel {
 public:
  virtual ~MemoryModel() = default;
  // Which FP32 state stays on the device. A checkpoint with the optimizer state copies
  // that state (masters, moments) to the host before writing it.
  virtual DeviceState device_state() const = 0;
  // Adds the mode's own device buffers that stay allocated from step to step (windows
  // the state streams through); returns the names of those it added.
  virtual std::vector<std::string> device_buffers(const Workload& w, Builder& gpu) const = 0;
  virtual LossWalk loss_walk(const Workload& w) const = 0;
  virtual UpdateAt update_at(const Workload& w) const = 0;
  // Whether the update reads autograd's compute-dtype gradients as backward made them,
  // each held from its backward to the update, in place of FP32 accumulators (which
  // then do not exist).
  virtual bool hands_over_grads(const Workload& w) const = 0;
  // Whether the forward and backward replay a CUDA graph (--cuda-graph; trainer.cpp's
  // graph_refusal and use_graph say when): its capture stream has a cuBLAS workspace of
  // its own.
  virtual bool replays_graph(const Workload& w) const = 0;
  // Adds the mode's host terms beside the process's runtime and data.
  virtual HostTerms host_terms(const Workload& w, Builder& host) const = 0;
  // Device bytes held beyond the allocated peak that the allocator's slack does not
  // cover (what the device must hold on top of the GPU plan's peak).
  virtual i64 reserved_gpu(const Workload& w) const = 0;
};

// The model of a strategy. The primary template is deleted: a strategy without a
// specialisation here fails to compile where the planner visits every strategy
// (planner/memory.cpp), instead of being planned as another mode.
template <offload_strategy Strategy>
const MemoryModel& memory_model() = delete;
template <>
const MemoryModel& memory_model<NoOffload>();  // offload/none/memory.cpp
template <>
const MemoryModel& memory_model<OptimizerOffload>();  // offload/optimizer/memory.cpp
template <>
const MemoryModel& memory_model<FullOffload>();  // offload/full/memory.cpp

// The one mapping from a mode to its model: visit_offload picks the strategy (as it
// picks the pipeline).
inline const MemoryModel& memory_model_of(Offload mode) {
  return visit_offload(
      mode, []<class Strategy>(Strategy) -> const MemoryModel& { return memory_model<Strategy>(); });
}

}  // namespace primecfg::train::plan::detail
