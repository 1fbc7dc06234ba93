// The planner's memory model, private to the planner (the API is planner.hpp): what
// one plan knows of the config and the model before a mode is chosen (Workload), how
// terms add up to phases (Builder), and the terms and phases of one mode (plan_mode).
// planner/memory.cpp holds the terms every mode shares; what differs between modes
// is each mode's memory model beside its pipeline, behind the interface of
// planner/memory_model.hpp, which includes this header. docs/memory-planner.md derives every term.
#pragma once

#include "distributed/mesh.hpp"
#include "model/architecture.hpp"
#include "optim/state.hpp"
#include "planner/planner.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace primecfg::train::plan::detail {

using i64 = std::int64_t;

struct OptInfo {
  OptKind kind = OptKind::adamw;
  bool momentum = false;  // SGD: momentum > 0
  bool clip = false;      // max_norm set
  bool nesterov = false;
  std::string name;
};

OptInfo optimizer_info(const OptimizerConfig& cfg);

// Everything about one micro-batch and the model that does not depend on the mode.
struct Workload {
  ModelShape s;
  std::vector<ParamShape> params;
  OptInfo opt;
  Assumptions a;
  i64 dt = 2;            // compute dtype bytes
  i64 reduce_bytes = 4;  // model.reduce_dtype: element of a gradient reduce-scatter bucket
  i64 B = 1, T = 1, N = 1, batch = 1;
  bool ac = false;  // ac.mode = "full"
  i64 ac_freq = 1;
  // ac.mode = "selective" (target "routed_experts"): every ac_freq-th block recomputes its
  // routed experts in the backward, when activation checkpointing is not planned in full.
  bool selective_experts = false;
  // model.ac_offloading (which needs ac with freq 1): the block inputs beyond a window
  // of ac_inflight go to host memory, pinned when ac_pinned.
  bool ac_offload = false;
  i64 ac_inflight = 5;
  bool ac_pinned = true;
  bool masked = false;
  bool fp8 = false;  // model.quantization: the blocks' linears in FP8 (their step time)
  i64 ce_chunk = 0;
  i64 micro_batches = 1;  // per optimizer step, on one rank
  bool ckpt = false, ckpt_optimizer = false;
  i64 hf_weight_bytes = 0;            // safetensors files mapped while loading an HF directory
  i64 jsonl_bytes = 0;                // size of data.path
  bool reshard_after_forward = true;  // model.reshard_after_forward (sharded runs)
  // The ranks that split the state: the world, or one shard group of HSDP's
  // (world / model.dp_replicate).
  i64 shard_world = 1;
  // The mesh those ranks are (expert parallelism: model.ep), and the model's routed
  // experts per block (0: none).
  MeshDims mesh;
  i64 experts = 0;
};

// Adds up one plan: its terms, each phase as the sum of the terms it names (names
// of absent or empty terms drop out), and the peak as the largest phase (the first
// of equals).
struct Builder {
  MemoryPlan m;
  void add(std::string name, i64 bytes, std::string what);
  void phase(std::string name, std::vector<std::string> names);
  MemoryPlan done();
};

// What the shared terms and the modes' terms both count with.
i64 round_up(i64 bytes, i64 block);
// The rounding of device allocations: the CUDA caching allocator's block, none on a CPU.
i64 device_rounding(const Workload& w);
// A pinned host buffer of `bytes` as the pinned allocator holds it: buffers are
// pinned only on CUDA, where the allocator may round each up to a power of two.
i64 pinned_bytes(const Workload& w, i64 bytes);
// Elements of one parameter's FP32 state on a rank: rank 0's piece, padding included,
// which is the largest and the size every rank allocates (distributed/shard_layout.hpp).
// The parameter itself at world 1.
i64 shard_numel(i64 numel, i64 world);
// The same for parameter p on the workload's mesh (distributed/piece_layout.hpp): with
// expert parallelism rank 0 holds pieces of the first experts / ep routed experts only
// (every rank as many), split over dp_shard_mod_ep, and none of the others.
i64 piece_numel(const Workload& w, const ParamShape& p);
// The ranks that split p (the all-gather's and the reduce-scatter's members), and
// whether rank 0 gathers it whole for the forward (not a routed expert another runs).
i64 piece_members(const Workload& w, const ParamShape& p);
bool gathered(const Workload& w, const ParamShape& p);
// FP32 moment buffers of one parameter (optim/state.hpp, as the trainer allocates them).
int moment_count(const OptInfo& o, const ParamShape& p);
// The compute-dtype bytes of the whole model, and the elements of its largest parameter.
i64 model_bytes(const Workload& w);
i64 largest_numel(const Workload& w);

// One block's activation terms per token (its architecture's, model/architecture.hpp),
// with the kernels and the dtype of this workload.
BlockMemory block_memory(const Workload& w, bool recompute_routed_experts = false);

// Blocks whose activations are checkpointed (none without model.ac).
i64 checkpointed_blocks(i64 layers, bool ac, i64 freq);

// The GPU and host plans of one mode, their totals, and whether they fit.
ModePlan plan_mode(const Workload& w, Offload mode, bool ac);

}  // namespace primecfg::train::plan::detail
