// The memory planner behind `primecfg-train --plan`: predicts the peak GPU
// memory and the host memory of a config in each offload mode, from the model
// shape and the config alone (no LibTorch, nothing allocated).
//
// The model of memory follows what reference_trainer/nn/transformer.cpp and the offload pipelines
// really allocate; docs/memory-planner.md derives every term. All sizes are bytes.
#pragma once

#include "distributed/launch.hpp"
#include "model/config.hpp"
#include "nn/loss_chunking.hpp"
#include "options.hpp"
#include "planner/profile.hpp"

#include <primecfg/offload.hpp>
#include <primecfg/sft.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace primecfg::train::plan {

// A failure to plan (unknown model, unreadable config.json, ...).
struct plan_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The model as the trainer builds it (model/config.hpp: one reader of config.json
// and one presets table for both).
using ModelShape = ModelArgs;

// The trainer's presets by model.name (model/config.hpp's preset()).
std::optional<ModelShape> preset_shape(std::string_view name);
// An HF config.json, read by the trainer's reader; its errors become plan_error.
ModelShape shape_from_hf_config(const std::filesystem::path& config_json);
// model.name resolved as the trainer does (preset, else a local HF directory), with
// model.debug.num_layers applied. Throws plan_error.
ModelShape resolve_model(const ModelConfig& model);

// This primecfg-train has the fused CUDA kernels (reference_trainer/nn/kernels/).
#if defined(PRIMECFG_FUSED_KERNELS)
inline constexpr bool kFusedKernels = true;
#else
inline constexpr bool kFusedKernels = false;
#endif

// Machine facts and allocator behaviour the prediction depends on. The defaults
// describe the H200 machine and LibTorch's CUDA allocators.
struct Assumptions {
  int compute_bytes = 2;       // bf16 compute (the trainer's default on CUDA); 4 for fp32
  bool cuda = true;            // pinned host buffers and cuBLAS workspace exist
  bool fused_rms_norm = true;  // CUDA: RMSNorm keeps its input; CPU: fp32 copies
  // bf16 on CUDA with the fused kernels: SwiGLU keeps gate and up for backward, not
  // silu(gate) as ATen's silu(g) * u does.
  bool fused_swiglu = kFusedKernels;
  // bf16 on CUDA with the fused kernels: the loss's token chunk holds only its bf16
  // logits, the gradient written over them (nn/kernels/cross_entropy.cu).
  bool fused_cross_entropy = kFusedKernels;
  // bf16 on CUDA with the fused kernels: offload = "none"'s AdamW runs on its fused
  // kernel, which reads autograd's bf16 gradients (optim/kernels/adamw.hpp).
  bool fused_adamw = kFusedKernels;
  // model.quantization on CUDA with the fused kernels: each FP8 cast is one pass from bf16
  // (nn/kernels/fp8_cast.hpp), without ATen's FP32 temporaries and transposed copies.
  bool fused_fp8_casts = kFusedKernels;
  // The fused kernels the run uses (KernelOptions::on(), empty in a build without them);
  // a profile measured with others says so. nullopt: not known.
  std::optional<std::vector<std::string>> kernels;
  // Their sources' fingerprint (train::build_kernel_sources(), calibrate.hpp); a profile measured with other
  // sources says so. nullopt: not known.
  std::optional<std::string> kernel_sources;
  bool fp32_out_gemm = true;  // CUDA: LM-head gradient GEMM adds into FP32 directly (no bf16 V x D product)
  std::int64_t device_block = 512;             // CUDA caching allocator rounds every tensor up to this
  bool pinned_pow2 = true;                     // pinned host allocator rounds each tensor to a power of two
  std::int64_t cublas_workspace = 32ll << 20;  // one stream's cuBLAS workspace (sm90), in the allocator
  std::int64_t cuda_context = 768ll << 20;     // CUDA context + loaded kernels, outside the allocator
  double allocator_slack = 0.05;               // reserved above allocated at the peak (fragmentation)
  // Resident bytes of the process beyond the planner's host terms (LibTorch, the CUDA
  // runtime's host side): the machine profile's host.runtime_bytes where it has one
  // (make_plan takes it; measured by --calibrate), else this. Where the profile measured
  // the model's architecture apart (host.runtime_by_architecture), make_plan takes that.
  std::int64_t host_runtime = 2ll << 30;
  std::string host_runtime_source = "assumed: the machine profile does not measure it (--calibrate does)";
  std::vector<ArchitectureRuntime> host_runtime_by_architecture;
  std::optional<std::int64_t> ring_bytes;     // --offload.ring-mib (staging rings, moment window)
  std::optional<double> deferred_share;       // --offload.deferred-share (nullopt: the plan chooses)
  std::optional<bool> cuda_graph;             // --cuda-graph (nullopt: where it applies)
  std::optional<std::int64_t> gpu_capacity;   // total device memory; nullopt: unknown
  std::optional<std::int64_t> host_capacity;  // host memory available to the run; nullopt: unknown
  std::string gpu_capacity_source, host_capacity_source;  // where the capacities came from
  // Sharded runs (FSDP, distributed/shard_layout.hpp): the ranks the weights and the
  // FP32 state are split over, the ranks that share one node's host memory (nullopt:
  // all of them), and the size of a gradient reduce-scatter bucket (dist.bucket_mib). With world 1 the plan
  // is the single-process one.
  std::int64_t world = 1;
  // Under a launcher even one rank runs the sharded step (its buffers included).
  bool process_group = false;
  bool sharded() const { return world > 1 || process_group; }
  std::optional<std::int64_t> ranks_per_node;
  std::int64_t bucket_bytes = 25ll << 20;
  // dist.backend = "gloo" on CUDA: Gloo's reduce-scatter sums a copy of each bucket.
  bool bucket_copy = false;
  std::string world_source = "--plan-world-size", ranks_per_node_source = "--plan-ranks-per-node";
  // The step-time model's machine (nullptr: no step times) and full's CPU threads per
  // rank (--offload.cpu-threads; nullopt: the cores per rank less one, as the trainer).
  const MachineProfile* profile = nullptr;
  std::string profile_source;
  std::optional<std::string> gpu_name;  // this machine's CUDA device, as CUDA names it (nullopt: none)
  // Whether a run on this machine would choose optimizer's pipeline by `profile`: a run
  // chooses only by a profile of its own GPU or one it is given (--plan-profile), so a
  // plan made beside a GPU the profile was not measured on plans what that run does.
  bool profile_chooses_here = true;
  std::optional<std::int64_t> cpu_threads;
  std::int64_t per_node() const { return ranks_per_node.value_or(world); }
};

// GPUs a node holds where nothing says (--plan-world-size alone, the advice's ranks):
// an 8-GPU node, the machine the large runs of this field rent.
inline constexpr std::int64_t kRanksPerNode = 8;

// The process's resident runtime measured in `p` (host.runtime_bytes), where it is,
// in place of the assumed one, with where it came from (`source`, the profile's file).
// make_plan does this with a.profile.
void take_host_runtime(Assumptions& a, const MachineProfile& p, const std::string& source);

// Fills the ranks of `a` as --plan and the check before a run see them: the world
// size from --plan-world-size, else the launcher's WORLD_SIZE (`env`), else 1; ranks
// per node from --plan-ranks-per-node, else LOCAL_WORLD_SIZE, else the world size;
// the bucket from dist.bucket_mib. Throws plan_error, naming the option or variable,
// when the ranks per node exceed the world size or do not divide it.
void apply_ranks(Assumptions& a, const TrainerOptions& o, const Launch& env);
// The same check on `a` alone (make_plan runs it too).
void check_ranks(const Assumptions& a);

// One named amount of memory.
struct Term {
  std::string name;
  std::int64_t bytes = 0;
  std::string what;  // one line: what it is
};

// A moment of the step and the memory alive then (a sum of terms).
struct Phase {
  std::string name;
  std::int64_t bytes = 0;
  std::vector<std::string> terms;  // names of the terms it adds up
};

struct MemoryPlan {
  std::vector<Term> terms;
  std::vector<Phase> phases;
  std::string peak_phase;
  std::int64_t peak = 0;

  std::int64_t term(std::string_view name) const;  // 0 when absent
  const Phase* phase(std::string_view name) const;
};

// How a machine profile knows a model's block: its shape was measured, or its matmul
// throughput is interpolated between the measured blocks' by FLOPs per token, or the
// block is smaller (larger) than any measured one and takes the nearest one's.
enum class Coverage { measured, interpolated, smaller, larger };
Coverage block_coverage(const MachineProfile& p, const ModelShape& s);
// The same among `blocks` (one kind of them: bf16 or FP8).
Coverage block_coverage(const std::vector<BlockTiming>& blocks, const ModelShape& s);
// The profile's key for the blocks of s (architecture and shape; tokens and times unset):
// what --calibrate writes and the step model looks up.
BlockTiming block_key(const ModelShape& s);

// One rank's predicted step in one mode (step_time.cpp; docs/memory-planner.md,
// "Step time"), from a machine profile. Seconds per optimizer step, all micro-batches.
struct StepTime {
  double forward = 0, recompute = 0, backward = 0;  // GPU compute (recompute: model.ac)
  double gpu_update = 0;                            // the optimizer on the GPU (none, optimizer)
  double link = 0;                  // host <-> device copies of the mode (moments; gradients and weights)
  double cpu_update = 0;            // full: the CPU update
  double collectives = 0;           // sharded runs: gathers and reduce-scatters (stated bandwidth)
  double ac_offload = 0;            // model.ac_offloading: the block inputs out and back
  double step = 0;                  // what the overlaps leave
  std::string bound;                // what sets the step: "GPU compute", "PCIe", "CPU update", "collectives"
  double tokens_per_s = 0;          // this rank's
  double mfu = 0;                   // as the trainer reports it (its FLOP count, the profile's peak)
  std::vector<std::string> unsure;  // where the prediction rests on less than a measurement
};

// offload = "optimizer"'s copy pipeline as the run will set it (--offload.deferred-share,
// --offload.ring-mib). Where the share is not given, the plan chooses from its step
// time: deferred write-backs, and a window of kDeferredWindow where --offload.ring-mib
// is not given and the GPU holds it, when the moment copies bound the step; none
// otherwise (deferring costs where the GPU bounds it). primecfg-train runs the choice
// of the same plan, so --plan shows the run.
inline constexpr double kDeferredShare = 0.5;
inline constexpr std::int64_t kDeferredWindow = std::int64_t{4} << 30;
struct PipelineChoice {
  double deferred_share = 0;
  std::optional<std::int64_t> ring_bytes;  // the moment window asked for (nullopt: ring_capacity's)
  bool chosen = false;                     // by the plan, not given
  std::string why;                         // one line
};

// cfg's run streams the moments (offload = "optimizer"), so its pipeline is chosen as
// planned where the options leave it open.
bool has_pipeline_choice(const SFTConfig& cfg);
// Why --offload.deferred-share above 0 defers nothing for cfg (another mode, clipping,
// no GPU: `cuda` false); "" where it applies.
std::string deferral_refusal(const SFTConfig& cfg, bool cuda);

struct ModePlan {
  Offload mode = Offload::none;
  bool ac = false;  // activation checkpointing as planned here
  MemoryPlan gpu;   // peak = peak allocated bytes of one rank (what it reports as peak_device_mem_gib)
  MemoryPlan host;  // peak = resident host bytes of one rank's process
  std::int64_t gpu_total = 0;  // gpu.peak with allocator slack + CUDA context: what the device must hold
  std::int64_t host_node = 0;  // host.peak of every rank on one node: what the node must hold
  std::optional<bool> gpu_fits, host_fits;  // per rank's GPU; per node's host
  std::optional<StepTime> time;             // with a machine profile
  PipelineChoice pipeline;                  // offload = "optimizer" only
  bool fits() const { return gpu_fits.value_or(true) && host_fits.value_or(true); }
};

// Activation bytes for one micro-batch, with and without checkpointing (for the report).
struct ActivationSummary {
  std::int64_t tokens = 0;                  // micro_batch_size x seq_len
  std::int64_t per_block_full = 0;          // what one block keeps for backward
  std::int64_t per_block_in_use = 0;        // held only while a block runs (routed experts stacked)
  std::int64_t per_block_checkpointed = 0;  // what a checkpointed block keeps (its input)
  std::int64_t saved_without_ac = 0;        // all blocks, model.ac off
  std::int64_t saved_with_ac = 0;           // all blocks, model.ac with the config's freq (1 if unset)
  std::int64_t ce_chunk_tokens = 0;         // fused LM head + cross-entropy chunk
};

struct Plan {
  std::string model_name;
  ModelShape shape;
  std::int64_t params = 0;
  std::int64_t micro_batch = 0, seq_len = 0, batch = 0;
  std::string optimizer;
  bool ac = false;
  std::int64_t ac_freq = 1;
  bool selective_experts = false;  // ac.mode = "selective": the routed experts recomputed
  // model.ac_offloading: the block inputs kept on the device (the window) and moved to
  // host memory, per micro-batch; 0 and 0 without it.
  std::int64_t ac_inputs_kept = 0, ac_inputs_offloaded = 0;
  bool attention_mask = false;  // packed rows need a document mask
  int reduce_bytes = 4;         // model.reduce_dtype: the gradient buckets' element size
  bool reshard_after_forward = true;
  std::int64_t replicas = 1;     // model.dp_replicate (HSDP)
  std::int64_t shard_world = 1;  // the ranks that split the state: world / replicas
  Assumptions assumptions;
  ActivationSummary activations;
  std::vector<ModePlan> modes;        // none, optimizer, full, with the config's ac
  std::vector<ModePlan> modes_other;  // the same with model.ac toggled
  std::vector<std::string> notes;

  const ModePlan& mode(Offload m, bool toggled_ac = false) const;
  // offload = "optimizer"'s pipeline with the config's model.ac: what its run sets.
  const PipelineChoice& pipeline() const { return mode(Offload::optimizer).pipeline; }
};

// Plans cfg in all three modes. Throws plan_error when the model cannot be resolved.
Plan make_plan(const SFTConfig& cfg, const Assumptions& a);
// The same for an already resolved shape (tests, and callers that know the shape).
Plan make_plan(const SFTConfig& cfg, const ModelShape& shape, const Assumptions& a);

// What --plan recommends (advice.cpp): the fastest mode that fits, with why;
// where none fits, each change that makes one fit (model.ac, a shorter seq_len, a
// smaller micro-batch, more ranks), found by planning the changed config.
struct Advice {
  std::optional<Offload> mode;       // the mode to use; nullopt when none fits
  std::string summary;               // one paragraph
  std::vector<std::string> changes;  // where none fits: what would make one fit
  // Where no change in `changes` does it alone: combinations of them, the cheapest
  // (most tokens per second of one GPU) first, at most kCombinationsShown.
  std::vector<std::string> combined;
};
inline constexpr std::size_t kCombinationsShown = 3;
Advice advise(const SFTConfig& cfg, const Plan& p);
std::string format_advice(const Advice& advice);

// The plan as text and JSON; with `advice`, its recommendation too.
std::string format_text(const Plan& p, const Advice* advice = nullptr);
std::string format_json(const Plan& p, const Advice* advice = nullptr);

// Before a run: empty when `mode` is predicted to fit (or the capacities are unknown),
// else what does not fit, by how much, and which modes (or model.ac) are predicted to fit.
std::string fit_refusal(const Plan& p, Offload mode);

// What to tell the user after a device out-of-memory error in `mode`: the planner's
// prediction for that mode and which mode (or setting) is predicted to fit.
std::string oom_advice(const Plan& p, Offload mode);

// The same after host memory ran out in `mode`: the planner's host estimate for the
// config (per process and per node) and, on a CPU device, where the device's share
// lives too (host memory), with what the machine offers (`limit`: the process's
// address-space limit, if one is set).
std::string host_oom_advice(const Plan& p, Offload mode, bool cpu_device, std::optional<std::int64_t> limit);

std::string_view mode_name(Offload m);

}  // namespace primecfg::train::plan
