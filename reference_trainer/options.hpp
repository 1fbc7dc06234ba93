// primecfg-train's own options: how to run, beyond what to train. They are read
// through primecfg like the training config (so they get did-you-mean, ranges,
// --help, provenance and a dump), from flags such as `--device=cuda` or
// `--offload.cpu-threads=8`, and from a TOML file given with `--options=FILE`.
// Nothing of the trainer is read from environment variables (a launcher's RANK,
// WORLD_SIZE, ... say where the process stands, not how to run: distributed/launch.hpp).
#pragma once

#include "distributed/launch.hpp"

#include <primecfg/describe.hpp>
#include <primecfg/validate.hpp>

#include <fmt/format.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace primecfg::train {

enum class CpuIsa { avx512, avx2, scalar };

// The copy pipelines of OptimizerOffload and FullOffload. None of these changes a
// result, only memory and speed.
struct OffloadOptions {
  std::optional<double> ring_mib = std::nullopt;
  std::optional<std::int64_t> cpu_threads = std::nullopt;
  double timeout_s = 600;
  std::optional<CpuIsa> cpu_isa = std::nullopt;
  std::optional<double> deferred_share = std::nullopt;

  // Bytes of each staging ring / moment window asked for (nullopt: automatic).
  std::optional<std::int64_t> ring_bytes() const {
    if (!ring_mib) return std::nullopt;
    return static_cast<std::int64_t>(*ring_mib * 1024 * 1024);
  }

  static constexpr auto fields() {
    using O = OffloadOptions;
    return describe(
        field(&O::ring_mib,
              "Size of each staging ring and of the GPU moment window, MiB (None: automatic; never less "
              "than the largest tensor it holds).",
              gt(0)),
        field(&O::cpu_threads,
              "CPU optimizer threads of offload = \"full\" (None: the usable cores less one).", ge(1)),
        field(&O::timeout_s, "How long one wait of a copy pipeline may take before the run fails, seconds.",
              gt(0)),
        field(&O::cpu_isa,
              "The widest instruction set the CPU optimizer kernels may use (None: the best this CPU has; "
              "all give the same bits)."),
        field(&O::deferred_share,
              "offload = \"optimizer\" without clipping: the share of the GPU moment window whose moments, "
              "updated last in backward, go back to host memory beside the next forward instead of at once "
              "(0: all at once; None: chosen by the planner's step-time model, 0.5 with a 4 GiB window "
              "where the moment copies bound the step, else 0; `--plan` shows the choice).",
              ge(0), lt(1)));
  }
};

// Traces of where the time goes (bench/trainer/profile_gpu.sh, pipeline_timeline.py).
struct ProfileOptions {
  std::optional<std::filesystem::path> trace = std::nullopt;
  bool cpu_ops = true;
  std::optional<std::filesystem::path> host_trace = std::nullopt;
  std::optional<std::filesystem::path> memory = std::nullopt;

  static constexpr auto fields() {
    using P = ProfileOptions;
    return describe(field(&P::trace, "Write a Kineto (Chrome) trace of the run's last two steps here."),
                    field(&P::cpu_ops,
                          "Record host operators in the trace too (off: only GPU kernels and copies, "
                          "which leaves a host-bound step as it is)."),
                    field(&P::host_trace,
                          "Write the offload pipeline's host threads (hooks, worker, uploads) as a Chrome "
                          "trace here."),
                    field(&P::memory,
                          "Record every GPU allocation of the run with its C++ stack and write the CUDA "
                          "allocator's snapshot here (torch.cuda.memory._snapshot's pickle; "
                          "bench/trainer/memory_peak.py lists what is live at the peak). CUDA only."));
  }
};

// primecfg's fused CUDA kernels (nn/kernels/, optim/kernels/), which apply to bf16 tensors on a GPU only:
// the CPU and FP32 always run ATen's operators.
struct KernelOptions {
  bool fused = true;
  bool norm_rope = true;
  bool cross_entropy = true;
  bool adamw = true;
  bool fp8_cast = true;

  static constexpr auto fields() {
    using K = KernelOptions;
    return describe(
        field(&K::fused,
              "Run RMSNorm and SwiGLU on primecfg's fused CUDA kernels (false: ATen's operators, "
              "as in FP32 and on the CPU)."),
        field(&K::norm_rope,
              "Also run QK-norm and RoPE as one fused kernel (false: RMSNorm's kernel, then "
              "ATen's rotation). Part of kernels.fused: off with it."),
        field(&K::cross_entropy,
              "Also compute the LM head's cross-entropy and its gradient in one kernel, in place "
              "of the bf16 logits (false: ATen's log_softmax in FP32, exp and a cast). Part of "
              "kernels.fused: off with it."),
        field(&K::adamw,
              "Also run offload = \"none\"'s AdamW update, its gradient norm and the bf16 weight "
              "copy as one fused pass over the state (false: ATen's norm, _fused_adamw_ and copy). "
              "Part of kernels.fused: off with it."),
        field(&K::fp8_cast,
              "Also cast to FP8 (model.quantization) with one fused pass per cast: amax, scale and "
              "e4m3 values, the weight gradient's operands transposed as they are cast (false: "
              "ATen's operators, the same bits). Part of kernels.fused: off with it."));
  }

  // The kernels these options turn on, by field name ("fused": RMSNorm and SwiGLU), in a
  // build that has them: what a machine profile records (planner/profile.hpp). Not
  // fp8_cast: a profile times bf16 blocks.
  std::vector<std::string> on() const {
    if (!fused) return {};
    std::vector<std::string> names{"fused"};
    if (norm_rope) names.emplace_back("norm_rope");
    if (cross_entropy) names.emplace_back("cross_entropy");
    if (adamw) names.emplace_back("adamw");
    return names;
  }

  void validate(validation& v) {
    // Written true beside fused = false is a contradiction; the default simply follows fused.
    if (norm_rope && !fused && v.is_set(norm_rope)) v.error(norm_rope, "needs kernels.fused");
    if (cross_entropy && !fused && v.is_set(cross_entropy)) v.error(cross_entropy, "needs kernels.fused");
    if (adamw && !fused && v.is_set(adamw)) v.error(adamw, "needs kernels.fused");
    if (fp8_cast && !fused && v.is_set(fp8_cast)) v.error(fp8_cast, "needs kernels.fused");
  }
};

// How checkpoints are written (what [ckpt] does not say: prime-rl's own weight
// checkpoints split the same way and have no field for it).
struct SaveOptions {
  std::int64_t max_shard_bytes = 5'000'000'000;

  static constexpr auto fields() {
    return describe(field(&SaveOptions::max_shard_bytes,
                          "Largest weight file of a checkpoint, bytes: more weights than this are split "
                          "into model-0000i-of-0000N.safetensors with model.safetensors.index.json, as "
                          "transformers and prime-rl write them (5 GB, their default; a larger tensor gets "
                          "a file of its own).",
                          ge(1)));
  }
};

enum class DistBackend { nccl, gloo };

// Sharded runs (FSDP) over several ranks (launched by torchrun or any launcher that
// sets RANK, WORLD_SIZE, ...; distributed/launch.hpp). None of these changes a result.
struct DistOptions {
  double bucket_mib = 25;
  std::optional<DistBackend> backend = std::nullopt;

  static constexpr auto fields() {
    using D = DistOptions;
    return describe(
        field(&D::bucket_mib,
              "Gradients are reduce-scattered in buckets of about this many MiB (full-size tensors; at "
              "least one parameter each). Weights are gathered a block at a time.",
              gt(0)),
        field(&D::backend,
              "Collectives library (None: NCCL on CUDA, Gloo on the CPU). gloo on CUDA copies every "
              "collective through host memory: slow, but several ranks may then share one GPU "
              "(--device=cuda:N), each with its own allocations, to measure per-rank memory on a "
              "machine with one GPU."));
  }
};

enum class ComputeDtype { bf16, fp32 };
enum class PlanFormat { text, json };

// Environment variables earlier versions of primecfg-train read, and what replaced
// each: an old script that still sets one gets a note instead of silence.
struct RetiredVariable {
  const char* name;
  const char* replacement;
};
inline constexpr RetiredVariable kRetiredEnvironment[] = {
    {"PRIMECFG_PEAK_TFLOPS", "--peak-tflops"},
    {"PRIMECFG_OFFLOAD_TIMEOUT_S", "--offload.timeout-s"},
    {"PRIMECFG_OFFLOAD_RING_MB", "--offload.ring-mib"},
    {"PRIMECFG_OFFLOAD_THREADS", "--offload.cpu-threads"},
    {"PRIMECFG_CPU_ISA", "--offload.cpu-isa"},
    {"PRIMECFG_PROFILE", "--profile.trace"},
    {"PRIMECFG_PROFILE_CPU", "--profile.cpu-ops"},
    {"PRIMECFG_HOST_TRACE", "--profile.host-trace"},
    {"PRIMECFG_CPU_PREFETCH", nullptr},
    {"PRIMECFG_CPU_STREAM_MIN", nullptr},
    {"PRIMECFG_EVENT_POOL", nullptr},
    {"PRIMECFG_OFFLOAD_DEFER", nullptr},
    {"PRIMECFG_OFFLOAD_EARLY_HEAD", nullptr},
    {"PRIMECFG_OFFLOAD_EDF", nullptr},
    {"PRIMECFG_OFFLOAD_GROUP_UPDATES", nullptr},
    {"PRIMECFG_OFFLOAD_HEAD_LAST", nullptr},
    {"PRIMECFG_OFFLOAD_SPLIT_TIED", nullptr},
    {"PRIMECFG_OFFLOAD_UPLOAD_THREAD", nullptr},
    {"PRIMECFG_OFFLOAD_WINDOW_THREAD", nullptr},
};

struct TrainerOptions {
  std::optional<std::string> device = std::nullopt;
  std::optional<ComputeDtype> compute_dtype = std::nullopt;
  std::optional<std::filesystem::path> dump_logits = std::nullopt;
  bool plan = false;
  PlanFormat plan_format = PlanFormat::text;
  std::optional<double> plan_gpu_memory = std::nullopt;
  std::optional<double> plan_host_memory = std::nullopt;
  std::optional<std::int64_t> plan_world_size = std::nullopt;
  std::optional<std::int64_t> plan_ranks_per_node = std::nullopt;
  std::optional<std::filesystem::path> plan_profile = std::nullopt;
  std::optional<std::filesystem::path> calibrate = std::nullopt;
  std::vector<std::string> calibrate_models = {};
  bool memory_check = true;
  std::optional<double> peak_tflops = std::nullopt;
  OffloadOptions offload = {};
  ProfileOptions profile = {};
  DistOptions dist = {};
  KernelOptions kernels = {};
  std::optional<bool> cuda_graph = std::nullopt;
  SaveOptions save = {};

  static constexpr auto fields() {
    using T = TrainerOptions;
    return describe(
        field(&T::device, "Where to run: cpu, cuda or cuda:N (None: cuda when there is one)."),
        field(&T::compute_dtype, "Compute dtype (None: bf16 on CUDA, fp32 on the CPU)."),
        field(&T::dump_logits,
              "Train nothing: write the FP32 logits of the data's first micro-batch, with its input_ids, "
              "positions and targets, to this safetensors file (to compare with transformers)."),
        field(&T::plan,
              "Print the predicted peak GPU and host memory of the config in each offload mode, and which "
              "modes fit; run nothing."),
        field(&T::plan_format, "Output of --plan."),
        field(&T::plan_gpu_memory, "GPU capacity for --plan, GiB (None: the CUDA device's, else 139).",
              gt(0)),
        field(&T::plan_host_memory, "Host memory for --plan, GiB (None: MemAvailable of /proc/meminfo).",
              gt(0)),
        field(&T::plan_world_size,
              "Ranks for --plan (None: WORLD_SIZE of the launcher, else 1); the FP32 state is sharded "
              "over them.",
              ge(1)),
        field(&T::plan_ranks_per_node,
              "Ranks on one node for --plan, whose host memory they share (None: LOCAL_WORLD_SIZE of "
              "the launcher; else 8 when --plan-world-size is above 8, else the world size).",
              ge(1)),
        field(&T::plan_profile,
              "Machine profile for --plan's step times, written by --calibrate (None: the profile shipped "
              "with primecfg, measured on an H200 machine). A run with offload = \"optimizer\" on a GPU "
              "chooses its pipeline by it too (None: by the shipped one where this GPU is its machine)."),
        field(&T::calibrate,
              "Train nothing: measure this machine for the planner's step times (the config's model, "
              "seq_len and optimizer; --calibrate-models adds models) and write the profile here."),
        field(&T::calibrate_models,
              "More models (presets or HF directories) whose blocks --calibrate times, beside model.name."),
        field(&T::memory_check,
              "Stop a CUDA run before loading anything when the planner predicts it will not fit."),
        field(&T::peak_tflops, "Peak dense bf16 TFLOP/s of the device for MFU (None: known GPUs only).",
              gt(0)),
        field(&T::offload, "The offload pipelines."), field(&T::profile, "Profiling."),
        field(&T::dist, "Sharded data parallel (several ranks)."), field(&T::kernels, "Fused CUDA kernels."),
        field(&T::cuda_graph,
              "Replay each step's forward and backward from one CUDA graph, captured at the run's third "
              "step (the host's launches and the GPU's idle time between them are gone; same results). "
              "None: where it applies: offload = \"none\" on a GPU handing autograd's gradients to "
              "the fused AdamW (bf16, one process, one micro-batch a step), no document mask, no "
              "activation offloading; true where it does not apply is an error."),
        field(&T::save, "How checkpoints are written."));
  }

  void validate(validation& v) {
    if (device && *device != "cpu" && *device != "cuda" && !cuda_index(*device))
      v.error(device, "must be cpu, cuda or cuda:N");
    if (dist.backend == DistBackend::nccl && device && *device == "cpu")
      v.error(dist.backend, "NCCL runs on CUDA devices only; the CPU's collectives run on gloo");
    if (plan && device && *device == "cpu")
      v.error(device, "--plan models a CUDA run; --device=cpu is not supported with it");
    if (!plan) {
      if (plan_format != PlanFormat::text) v.error(plan_format, "only applies with --plan");
      if (plan_gpu_memory) v.error(plan_gpu_memory, "only applies with --plan");
      if (plan_host_memory) v.error(plan_host_memory, "only applies with --plan");
      if (plan_world_size) v.error(plan_world_size, "only applies with --plan");
      if (plan_ranks_per_node) v.error(plan_ranks_per_node, "only applies with --plan");
    }
    if (!calibrate && !calibrate_models.empty()) v.error(calibrate_models, "only applies with --calibrate");
    if (calibrate && plan) v.error(calibrate, "--calibrate and --plan are two runs: give one");
    if (calibrate && plan_profile)
      v.error(plan_profile, "--calibrate measures this machine; it reads no profile");
  }

  // The index N of "cuda:N"; nullopt for anything else.
  static std::optional<int> cuda_index(const std::string& d) {
    if (d.rfind("cuda:", 0) != 0 || d.size() == 5 || d.size() > 9) return std::nullopt;
    int n = 0;
    for (char c : d.substr(5)) {
      if (c < '0' || c > '9') return std::nullopt;
      n = n * 10 + (c - '0');
    }
    return n;
  }
};

// How to run, beyond the config: what the command line (TrainerOptions and the program's
// own flags) or a test decided. The loop passes it down to the pipelines, so it lives
// here, with the vocabulary every folder may include, and not in trainer.hpp.
struct RunOptions {
  std::optional<std::string> device;  // "cpu" or "cuda[:i]"; default: cuda when present
  std::optional<bool> bf16;           // compute dtype; default: bf16 on CUDA, FP32 on CPU
  bool print = true;                  // per-step progress on stderr
  bool demo = false;                  // print a few generated reversals at the end
  bool collect_weights = false;       // return the final FP32 masters in RunResult
  std::string resolved_config;        // written to <output_dir>/config.toml when not empty
  std::string resolved_options;       // written to <output_dir>/options.toml when not empty
  // Instead of training: the logits of the first micro-batch of the data, written to this
  // safetensors file with its input_ids, positions and targets (a check against
  // transformers; tests/trainer/hf_parity_test.py).
  std::optional<std::filesystem::path> dump_logits;
  // The offload pipelines (ring sizes, CPU threads, timeouts), profiling, and the
  // device's peak FLOP/s for MFU: primecfg-train's options (options.hpp).
  OffloadOptions offload;
  ProfileOptions profile;
  std::optional<double> peak_tflops;
  // Where this process stands among the launcher's ranks (one process: world 1), and
  // how a sharded run moves gradients and weights.
  Launch launch;
  DistOptions dist;
  KernelOptions kernels;
  std::optional<bool> cuda_graph;  // TrainerOptions::cuda_graph
  SaveOptions save;
};

}  // namespace primecfg::train
