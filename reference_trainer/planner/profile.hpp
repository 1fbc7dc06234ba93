// A machine profile: what the planner's step-time model (step_time.hpp) needs to
// know of one machine, measured there by `primecfg-train --calibrate=FILE`
// (calibrate.cpp) and read back through primecfg like any config: typed, ranges
// checked, unknown keys refused, every error with file:line:col.
//
// The compute of a transformer block is measured, not derived: calibration runs the
// trainer itself on 1 and 3 blocks of each shape (with and without checkpointing),
// so the fused kernels, casts, hooks and launch gaps are in the figure. The
// attention's share is then rescaled to other sequence lengths from the measured
// SDPA throughput, and the rest of the block linearly in tokens.
// docs/memory-planner.md ("Step time") derives every term.
#pragma once

#include <primecfg/describe.hpp>
#include <primecfg/validate.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace primecfg::train::plan {

// Where a profile came from: shown on every plan that uses it.
struct ProfileProvenance {
  std::string device;       // the GPU's name as CUDA reports it
  std::string machine;      // host: CPU cores, memory
  std::string measured_at;  // UTC date and time
  std::string commit;       // primecfg's commit (or "unknown")
  std::string torch;        // LibTorch version
  std::string command;      // how it was measured
  // The fused CUDA kernels that were on (KernelOptions::on()): the GPU times are theirs.
  // nullopt: not recorded (profiles written before the field).
  std::optional<std::vector<std::string>> kernels;
  // The fingerprint of those kernels' sources (tools/source_fingerprint.py): a build whose
  // kernels differ has another. nullopt: not recorded (profiles written before the field).
  std::optional<std::string> kernel_sources;

  static constexpr auto fields() {
    using P = ProfileProvenance;
    return describe(field(&P::device, "GPU name as CUDA reports it."),
                    field(&P::machine, "The host: CPU model, cores, memory."),
                    field(&P::measured_at, "When (UTC)."), field(&P::commit, "primecfg commit."),
                    field(&P::torch, "LibTorch version."), field(&P::command, "The calibrating command."),
                    field(&P::kernels,
                          "The fused CUDA kernels that were on while measuring (kernels.* option names; "
                          "empty: none), whose times the profile holds."),
                    field(&P::kernel_sources,
                          "Fingerprint of the fused kernels' sources of the build that measured "
                          "(tools/source_fingerprint.py): another build's kernels have another."));
  }
};

// One transformer block's shape, run by the trainer on `tokens` tokens (one sequence).
struct BlockTiming {
  std::string architecture = "llama";  // its folder, models/<name>/ (model/architecture.hpp)
  std::int64_t hidden = 0, intermediate = 0, heads = 0, kv_heads = 0, head_dim = 0;
  bool qk_norm = false;
  // Routed experts (0: none): how many, how many a token uses, each one's width.
  std::int64_t experts = 0, top_k = 0, moe_intermediate = 0;
  bool fp8 = false;  // its linears in FP8 (timed with model.quantization)
  std::int64_t tokens = 0;
  double forward_s = 0;   // one block's forward, its attention included
  double backward_s = 0;  // one block's backward (without the optimizer update)

  // The same weights and attention layout (the timing's length may differ).
  bool same_shape(const BlockTiming& o) const {
    return architecture == o.architecture && hidden == o.hidden && intermediate == o.intermediate &&
           heads == o.heads && kv_heads == o.kv_heads && head_dim == o.head_dim && qk_norm == o.qk_norm &&
           experts == o.experts && top_k == o.top_k && moe_intermediate == o.moe_intermediate && fp8 == o.fp8;
  }

  static constexpr auto fields() {
    using B = BlockTiming;
    return describe(field(&B::architecture, "The block's architecture: its folder, models/<name>/."),
                    field(&B::hidden, "Hidden size.", ge(1)),
                    field(&B::intermediate, "MLP intermediate size.", ge(1)),
                    field(&B::heads, "Query heads.", ge(1)), field(&B::kv_heads, "Key/value heads.", ge(1)),
                    field(&B::head_dim, "Head dimension.", ge(1)),
                    field(&B::qk_norm, "RMSNorm on queries and keys (Qwen3)."),
                    field(&B::experts, "Routed experts (0: a dense block).", ge(0)),
                    field(&B::top_k, "Experts each token is routed to.", ge(0)),
                    field(&B::moe_intermediate, "Each routed expert's MLP width.", ge(0)),
                    field(&B::fp8, "Its linears in FP8 (timed with model.quantization)."),
                    field(&B::tokens, "Tokens of the measured micro-batch (one sequence).", ge(1)),
                    field(&B::forward_s, "One block's forward, seconds.", gt(0)),
                    field(&B::backward_s, "One block's backward without the update, seconds.", gt(0)));
  }
};

// Everything outside the blocks for one (hidden, vocab, tied) pair: embedding, final
// norm, LM head with the fused cross-entropy, and the step's fixed host work.
struct HeadTiming {
  std::int64_t hidden = 0, vocab = 0;
  bool tied = true;
  std::int64_t tokens = 0;
  double forward_s = 0;   // lookup, final norm, LM head and loss forward
  double backward_s = 0;  // their backward, the step's fixed work included

  bool same_shape(const HeadTiming& o) const {
    return hidden == o.hidden && vocab == o.vocab && tied == o.tied;
  }

  static constexpr auto fields() {
    using H = HeadTiming;
    return describe(field(&H::hidden, "Hidden size.", ge(1)), field(&H::vocab, "Vocabulary size.", ge(1)),
                    field(&H::tied, "LM head tied to the embedding."),
                    field(&H::tokens, "Tokens of the measured micro-batch.", ge(1)),
                    field(&H::forward_s, "Embedding, final norm, LM head and loss forward, seconds.", gt(0)),
                    field(&H::backward_s, "Their backward and the step's fixed work, seconds.", gt(0)));
  }
};

// Causal attention (SDPA's flash kernel, bf16) at one sequence length.
struct AttentionTiming {
  std::int64_t seq_len = 0;
  std::int64_t head_dim = 128;
  double forward_tflops = 0;   // counted as 2 * seq_len^2 * heads * head_dim (causal half)
  double backward_tflops = 0;  // counted as 2.5 times the forward's FLOPs

  static constexpr auto fields() {
    using A = AttentionTiming;
    return describe(field(&A::seq_len, "Sequence length.", ge(1)),
                    field(&A::head_dim, "Head dimension.", ge(1)),
                    field(&A::forward_tflops, "Forward TFLOP/s (causal FLOPs).", gt(0)),
                    field(&A::backward_tflops, "Backward TFLOP/s (2.5 x the forward's FLOPs).", gt(0)));
  }
};

struct GpuProfile {
  double peak_tflops = 989;       // dense bf16, for MFU
  double memory_gbs = 0;          // device memory: bytes read + written per second by a large copy
  double adamw_params_per_s = 0;  // torch's fused AdamW on the device (none, optimizer)
  double launch_us = 0;           // one small kernel, launched and waited for in a stream of them
  std::vector<BlockTiming> blocks;
  std::vector<HeadTiming> heads;
  std::vector<AttentionTiming> attention;

  static constexpr auto fields() {
    using G = GpuProfile;
    return describe(
        field(&G::peak_tflops, "Dense bf16 peak TFLOP/s (MFU's denominator).", gt(0)),
        field(&G::memory_gbs, "Device memory bandwidth, GB/s (read + write of a copy).", gt(0)),
        field(&G::adamw_params_per_s, "Fused AdamW update on the device, parameters per second.", gt(0)),
        field(&G::launch_us,
              "Time per kernel of a stream of tiny kernels, microseconds (0: not measured). Recorded, not "
              "added: the measured block and head times hold their own launches.",
              ge(0)),
        field(&G::blocks, "Transformer blocks run by the trainer."),
        field(&G::heads, "Embedding, LM head and loss run by the trainer."),
        field(&G::attention, "Causal SDPA throughput by sequence length."));
  }
};

// PCIe between host and device, pinned host memory (GB/s = 1e9 bytes/s).
struct LinkProfile {
  double h2d_gbs = 0, d2h_gbs = 0;            // one direction alone
  double h2d_both_gbs = 0, d2h_both_gbs = 0;  // each direction while both run
  double pageable_factor = 0.5;               // pageable memory's share of the pinned rate
  // What one copy costs beyond its bytes while both directions run, in microseconds:
  // the offload pipelines queue one per tensor and moment (thousands a step for routed
  // experts). nullopt in profiles written before it (counted as 0, said unsure).
  std::optional<double> copy_us;

  static constexpr auto fields() {
    using L = LinkProfile;
    return describe(
        field(&L::h2d_gbs, "Host to device alone, GB/s.", gt(0)),
        field(&L::d2h_gbs, "Device to host alone, GB/s.", gt(0)),
        field(&L::h2d_both_gbs, "Host to device while device to host runs too, GB/s.", gt(0)),
        field(&L::d2h_both_gbs, "Device to host while host to device runs too, GB/s.", gt(0)),
        field(&L::pageable_factor, "Pageable host memory's rate as a share of pinned.", gt(0), le(1)),
        field(&L::copy_us,
              "One copy's cost beyond its bytes while both directions run, microseconds: copies of "
              "8 MiB against one copy of as many bytes, each way at once.",
              ge(0)));
  }
};

// The resident runtime of one architecture's processes (HostProfile::runtime_bytes, for
// models of models/<architecture>/ only): the kernels a process loads are part of it, and
// routed experts load more than a dense block does.
struct ArchitectureRuntime {
  std::string architecture;
  std::int64_t bytes = 0;

  static constexpr auto fields() {
    using R = ArchitectureRuntime;
    return describe(field(&R::architecture, "The architecture: its folder, models/<name>/."),
                    field(&R::bytes, "The largest runtime of its models' one-block runs, bytes.", gt(0)));
  }
};

// The host's CPU update of offload = "full" (optim/cpu/, bf16 gradients in, bf16
// weights out), with `threads` threads, while copies to and from the device run.
struct HostProfile {
  std::int64_t cores = 0;
  std::int64_t threads = 0;
  double memory_gbs = 0;               // a large copy with `threads` threads: read + write
  double adamw_params_per_s = 0;       // alone
  double adamw_busy_params_per_s = 0;  // while pinned copies run both ways
  // AdamW in a `full` run's own pipeline (its copies, its job sizes, its threads), where
  // the CPU update sets the step; nullopt in profiles written before it.
  std::optional<double> adamw_full_params_per_s;
  double sign_sgd_params_per_s = 0;
  double sign_sgd_busy_params_per_s = 0;
  // Resident bytes of a trainer process beyond what the planner counts term by term
  // (LibTorch, the CUDA runtime's host side, loaded kernels, allocator pools): the
  // planner's host term `runtime`. nullopt: not measured (profiles written before it).
  std::optional<std::int64_t> runtime_bytes;
  // The same per architecture measured (empty in profiles written before it): what a plan
  // of a model of that architecture takes, runtime_bytes (the largest) for the others.
  std::vector<ArchitectureRuntime> runtime_by_architecture;

  static constexpr auto fields() {
    using H = HostProfile;
    return describe(
        field(&H::cores, "Usable CPU cores.", ge(1)),
        field(&H::threads, "Threads the CPU update used (full's default: cores less one).", ge(1)),
        field(&H::memory_gbs, "Host memory bandwidth with those threads, GB/s (read + write).", gt(0)),
        field(&H::adamw_params_per_s, "CPU AdamW, parameters per second, alone.", gt(0)),
        field(&H::adamw_busy_params_per_s, "CPU AdamW, parameters per second, while copies run both ways.",
              gt(0)),
        field(&H::adamw_full_params_per_s,
              "CPU AdamW, parameters per second, in a `full` run whose steps the CPU update sets: "
              "--calibrate's run of its smallest model (the update time the run's pipeline reports).",
              gt(0)),
        field(&H::sign_sgd_params_per_s, "CPU SignSGD, parameters per second, alone.", gt(0)),
        field(&H::sign_sgd_busy_params_per_s,
              "CPU SignSGD, parameters per second, while copies run both ways.", gt(0)),
        field(&H::runtime_bytes,
              "Resident bytes of a trainer process beyond the planner's own host terms (its `runtime`): "
              "the largest VmHWM of --calibrate's one-block runs less their data.",
              gt(0)),
        field(&H::runtime_by_architecture,
              "The same per architecture measured: a plan of a model of one of them takes its own."));
  }
};

// Collectives between ranks: not measured on a machine with one GPU, so stated.
struct CollectiveProfile {
  double intra_node_gbs = 0;  // bus bandwidth of all-gather / reduce-scatter within a node
  double inter_node_gbs = 0;  // the same across nodes, per GPU
  std::string source;         // where the figures come from

  static constexpr auto fields() {
    using C = CollectiveProfile;
    return describe(
        field(&C::intra_node_gbs, "All-gather / reduce-scatter bus bandwidth within a node, GB/s.", gt(0)),
        field(&C::inter_node_gbs, "The same across nodes, per GPU, GB/s.", gt(0)),
        field(&C::source, "Where these figures come from (stated: not measured by --calibrate)."));
  }
};

struct MachineProfile {
  ProfileProvenance provenance;
  GpuProfile gpu;
  LinkProfile link;
  HostProfile host;
  CollectiveProfile collectives;

  static constexpr auto fields() {
    using M = MachineProfile;
    return describe(field(&M::provenance, "Where and how this profile was measured."),
                    field(&M::gpu, "The device."), field(&M::link, "Host <-> device copies."),
                    field(&M::host, "The host: its CPU update and the process's resident runtime."),
                    field(&M::collectives, "Collectives between ranks (stated)."));
  }

  // (Empty gpu.blocks, heads or attention are refused by read_profile, after the
  // fields: an element with a bad value leaves its list empty too.)
  void validate(validation& v) {
    if (host.threads > host.cores) v.error(host.threads, "more threads than cores");
  }
};

struct profile_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A profile from a TOML file, or from text named `name` (messages say file:line:col).
// Throws profile_error with every problem found.
MachineProfile read_profile(const std::filesystem::path& file);
MachineProfile read_profile_text(std::string_view name, std::string_view toml_text);
// The profile shipped with primecfg (planner/profiles/nvidia-h200.toml, measured on
// the H200 machine); nullopt while that file holds no profile (comments only).
const std::optional<MachineProfile>& shipped_profile();
// A profile as TOML, as --calibrate writes it.
std::string profile_toml(const MachineProfile& p);

}  // namespace primecfg::train::plan
