// The memory planner (planner.hpp): the model resolved as the trainer does, and a
// config planned in all three offload modes. The memory model is memory.cpp (with
// each mode's part beside its pipeline: planner/memory_model.hpp), the reports
// report.cpp, the recommendation advice.cpp, the machine's capacities machine.cpp.
#include "planner/planner.hpp"

#include "distributed/mesh.hpp"
#include "nn/activation_window.hpp"
#include "nn/loss_chunking.hpp"
#include "planner/memory.hpp"
#include "planner/memory_model.hpp"
#include "planner/step_time.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <system_error>
#include <type_traits>
#include <variant>

namespace primecfg::train::plan {

namespace fs = std::filesystem;
using i64 = std::int64_t;

// From the memory model (memory.hpp).
using detail::block_memory;
using detail::checkpointed_blocks;
using detail::optimizer_info;
using detail::plan_mode;
using detail::step_time;
using detail::Workload;

// ---------------------------------------------------------------------------
// Model shapes
// ---------------------------------------------------------------------------

namespace {}  // namespace

std::optional<ModelShape> preset_shape(std::string_view name) { return preset(name); }

ModelShape shape_from_hf_config(const fs::path& path) {
  try {
    return read_hf_config(path);
  } catch (const model_config_error& e) {
    throw plan_error(e.what());
  }
}

ModelShape resolve_model(const ModelConfig& model) {
  try {
    return train::resolve_model(model.name, model.debug ? model.debug->num_layers : std::nullopt).args;
  } catch (const model_config_error& e) {
    throw plan_error(fmt::format("model.name: {}", e.what()));
  }
}

// ---------------------------------------------------------------------------
// Plans
// ---------------------------------------------------------------------------

i64 MemoryPlan::term(std::string_view name) const {
  for (const auto& t : terms)
    if (t.name == name) return t.bytes;
  return 0;
}

const Phase* MemoryPlan::phase(std::string_view name) const {
  for (const auto& p : phases)
    if (p.name == name) return &p;
  return nullptr;
}

const ModePlan& Plan::mode(Offload m, bool toggled_ac) const {
  const auto& v = toggled_ac ? modes_other : modes;
  for (const auto& mp : v)
    if (mp.mode == m) return mp;
  throw plan_error("no plan for that mode");
}

std::string_view mode_name(Offload m) {
  return visit_offload(m, []<class Strategy>(Strategy) { return Strategy::name; });
}

namespace {

i64 dir_safetensors_bytes(const fs::path& dir) {
  std::error_code ec;
  i64 total = 0;
  if (!fs::is_directory(dir, ec)) return 0;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors") total += static_cast<i64>(e.file_size(ec));
  return total;
}

}  // namespace

// ---------------------------------------------------------------------------
// Ranks
// ---------------------------------------------------------------------------

void check_ranks(const Assumptions& a) {
  const i64 n = a.per_node();
  if (a.world < 1)
    throw plan_error(fmt::format("{} = {}: the world size must be at least 1", a.world_source, a.world));
  if (n < 1) throw plan_error(fmt::format("{} = {}: must be at least 1", a.ranks_per_node_source, n));
  if (n > a.world)
    throw plan_error(fmt::format("{} = {}: more ranks on one node than in the world ({} = {})",
                                 a.ranks_per_node_source, n, a.world_source, a.world));
  // Every node runs the same number of ranks (torchrun's --nproc-per-node): a world
  // that is not a multiple would leave a node partly filled, whose host memory this
  // plan would misstate.
  if (a.world % n != 0)
    throw plan_error(fmt::format("{} = {} is not a multiple of {} = {}: every node runs as many ranks",
                                 a.world_source, a.world, a.ranks_per_node_source, n));
}

void apply_ranks(Assumptions& a, const TrainerOptions& o, const Launch& env) {
  a.bucket_bytes = static_cast<i64>(o.dist.bucket_mib * static_cast<double>(i64{1} << 20));
  a.bucket_copy = a.cuda && o.dist.backend == DistBackend::gloo;
  if (o.plan_world_size) {
    a.world = *o.plan_world_size;
    a.world_source = "--plan-world-size";
  } else {
    a.world = env.world;
    a.process_group = env.launched;
    // Without a launcher the error to fix names the option.
    a.world_source = env.several() ? "WORLD_SIZE" : "--plan-world-size";
  }
  if (o.plan_ranks_per_node) {
    a.ranks_per_node = *o.plan_ranks_per_node;
    a.ranks_per_node_source = "--plan-ranks-per-node";
  } else if (env.several()) {
    // Launch defaults LOCAL_WORLD_SIZE to WORLD_SIZE: one node holds every rank.
    a.ranks_per_node = env.local_world;
    a.ranks_per_node_source = "LOCAL_WORLD_SIZE";
  } else if (o.plan_world_size && a.world > kRanksPerNode) {
    // Ranks planned from the command line fill nodes of 8 GPUs, as the advice's do: 64
    // ranks on one node is not a machine anyone rents.
    a.ranks_per_node = kRanksPerNode;
    a.ranks_per_node_source = fmt::format("--plan-ranks-per-node unset: {} a node", kRanksPerNode);
  } else {
    a.ranks_per_node = std::nullopt;  // the world size: one node
    a.ranks_per_node_source = "--plan-ranks-per-node unset: one node";
  }
  check_ranks(a);
}

namespace {

// offload = "optimizer" planned with its pipeline (PipelineChoice): the options given,
// else deferral where the step time says PCIe bounds the step, with the larger window
// where --offload.ring-mib is not given and the device holds it.
ModePlan with_pipeline(const Workload& w, ModePlan mp) {
  PipelineChoice& c = mp.pipeline;
  c.ring_bytes = w.a.ring_bytes;
  if (w.a.deferred_share) {
    c.deferred_share = *w.a.deferred_share;
    c.why = "--offload.deferred-share";
    return mp;
  }
  c.chosen = true;
  if (!w.a.cuda || w.opt.clip) {
    c.why =
        w.a.cuda ? "deferral needs the updates in the gradient hooks, which clipping rules out" : "CPU run";
    return mp;
  }
  if (!mp.time) {
    c.why = "no machine profile for this device: no step time to choose by";
    return mp;
  }
  if (!w.a.profile_chooses_here) {
    c.why = fmt::format(
        "a run on this machine's {} has no machine profile of its own to choose by (the plan's step "
        "times are the {}'s); --calibrate=FILE here, then --plan-profile=FILE, lets it choose",
        w.a.gpu_name.value_or("GPU"), w.a.profile ? w.a.profile->provenance.device : "profile");
    return mp;
  }
  const StepTime& t = *mp.time;
  const double compute = t.forward + t.recompute + t.backward + t.gpu_update;
  if (t.bound != "PCIe") {
    c.why = fmt::format("{} bounds the step ({:.3f} s of compute, {:.3f} s of moment copies)", t.bound,
                        compute, t.link);
    return mp;
  }
  c.deferred_share = kDeferredShare;
  c.why = fmt::format("the moment copies bound the step ({:.3f} s, against {:.3f} s of compute)", t.link,
                      compute);
  // Planned again with what was chosen (the step model replays the window and the
  // deferral): the larger window where the device holds it, else the automatic one.
  Workload chosen = w;
  chosen.a.deferred_share = kDeferredShare;
  if (!w.a.ring_bytes) {
    chosen.a.ring_bytes = kDeferredWindow;
    ModePlan big = plan_mode(chosen, Offload::optimizer, mp.ac);
    if (big.gpu_fits.value_or(true)) {
      big.time = step_time(chosen, Offload::optimizer, mp.ac, *w.a.profile);
      big.pipeline = c;
      big.pipeline.ring_bytes = kDeferredWindow;
      return big;
    }
    c.why += fmt::format("; the {} MiB window does not fit the device", kDeferredWindow >> 20);
    chosen.a.ring_bytes = std::nullopt;
  }
  ModePlan deferred = plan_mode(chosen, Offload::optimizer, mp.ac);
  deferred.time = step_time(chosen, Offload::optimizer, mp.ac, *w.a.profile);
  deferred.pipeline = c;
  return deferred;
}

}  // namespace

bool has_pipeline_choice(const SFTConfig& cfg) { return cfg.model.offload == Offload::optimizer; }

std::string deferral_refusal(const SFTConfig& cfg, bool cuda) {
  if (cfg.model.offload != Offload::optimizer)
    return fmt::format("model.offload = \"{}\"",
                       visit_offload(cfg.model.offload, []<class S>(S) { return std::string(S::name); }));
  if (optimizer_info(cfg.optim).clip) return "clipping (optim.max_norm; \"None\" turns it off)";
  if (!cuda) return "no GPU";
  return "";
}

void take_host_runtime(Assumptions& a, const MachineProfile& p, const std::string& source) {
  if (!p.host.runtime_bytes) return;
  a.host_runtime = *p.host.runtime_bytes;
  a.host_runtime_by_architecture = p.host.runtime_by_architecture;
  a.host_runtime_source = fmt::format("measured by --calibrate on {} ({})", p.provenance.device, source);
}

namespace {

// The runtime measured for the model's own architecture, where the profile has it.
void take_architecture_runtime(Assumptions& a, const ModelShape& s) {
  const std::string arch = block_key(s).architecture;
  for (const ArchitectureRuntime& r : a.host_runtime_by_architecture)
    if (r.architecture == arch) {
      a.host_runtime = r.bytes;
      a.host_runtime_source += fmt::format(", for {} models", arch);
      return;
    }
}

}  // namespace

Plan make_plan(const SFTConfig& cfg, const Assumptions& a) {
  return make_plan(cfg, resolve_model(cfg.model), a);
}

Plan make_plan(const SFTConfig& cfg, const ModelShape& shape, const Assumptions& a) {
  check_ranks(a);
  Workload w;
  w.s = shape;
  w.params = shape.params();
  w.opt = optimizer_info(cfg.optim);
  w.a = a;
  if (a.profile) take_host_runtime(w.a, *a.profile, a.profile_source);
  take_architecture_runtime(w.a, shape);
  w.dt = a.compute_bytes;
  w.reduce_bytes = cfg.model.reduce_dtype == Dtype::bfloat16 ? 2 : 4;
  w.reshard_after_forward = cfg.model.reshard_after_forward;
  w.fp8 = cfg.model.quantization.has_value();
  std::vector<MeshProblem> problems;
  // Expert parallelism (ep = "auto" too, as prime-rl resolves it) splits routed experts.
  w.experts = shape.moe ? shape.moe->experts : 0;
  const MeshDims mesh = resolve_mesh(MeshRequest::of(cfg.model, a.world, w.experts), problems);
  for (const auto& pr : problems)
    throw plan_error(fmt::format("{}: {} (the world size is {})", pr.field, pr.message, a.world_source));
  w.mesh = mesh;
  w.shard_world = mesh.fsdp();
  std::visit(
      [&](const auto& d) {
        using C = std::decay_t<decltype(d)>;
        w.B = d.micro_batch_size;
        w.T = d.seq_len;
        w.batch = d.batch_size;
        if constexpr (std::is_same_v<C, FakeDataConfig>) {
          w.masked = d.length == FakeLength::variable;  // fixed rows hold one document each
        } else {
          w.masked = true;  // packed documents or padding: the trainer builds a document mask
          std::error_code ec;
          if (d.path) w.jsonl_bytes = static_cast<i64>(fs::file_size(*d.path, ec));
          if (ec) w.jsonl_bytes = 0;
        }
      },
      cfg.data);
  w.N = w.B * w.T;
  w.ac = cfg.model.ac && cfg.model.ac->mode == AcMode::full;
  w.selective_experts = cfg.model.ac && cfg.model.ac->mode == AcMode::selective;
  w.ac_freq = cfg.model.ac ? std::max<i64>(1, cfg.model.ac->freq) : 1;
  if (const auto& off = cfg.model.ac_offloading) {
    w.ac_offload = true;
    w.ac_inflight = std::max<i64>(1, off->max_inflight_activations);
    w.ac_pinned = off->pin_memory;
  }
  const i64 chunk = ce_chunk_tokens(cfg.model.fused_lm_head_token_chunk_size, shape.vocab_size, w.N);
  w.ce_chunk = std::min(chunk, w.N);
  // A rank's share: each runs batch / micro_batch_size / world of them (the trainer
  // refuses a count the ranks cannot share evenly), and accumulates only with more than one.
  w.micro_batches = std::max<i64>(1, w.batch / std::max<i64>(1, w.B) / a.world);
  w.ckpt = cfg.ckpt.has_value();
  w.ckpt_optimizer = cfg.ckpt && !cfg.ckpt->skip_optimizer;
  if (const auto dir = hf_directory(cfg.model.name);
      dir && !(cfg.model.debug && cfg.model.debug->random_init))
    w.hf_weight_bytes = dir_safetensors_bytes(*dir);

  Plan p;
  p.model_name = cfg.model.name;
  p.shape = shape;
  p.params = shape.total_params();
  p.micro_batch = w.B;
  p.seq_len = w.T;
  p.batch = w.batch;
  p.optimizer = w.opt.name;
  p.ac = w.ac;
  p.selective_experts = w.selective_experts;
  p.ac_freq = w.ac_freq;
  if (w.ac && w.ac_offload) {
    const i64 blocks = checkpointed_blocks(shape.layers, true, w.ac_freq);
    p.ac_inputs_kept = block_inputs_kept(blocks, w.ac_inflight);
    p.ac_inputs_offloaded = block_inputs_offloaded(blocks, w.ac_inflight);
  }
  p.attention_mask = w.masked;
  p.reduce_bytes = static_cast<int>(w.reduce_bytes);
  p.reshard_after_forward = w.reshard_after_forward;
  p.replicas = cfg.model.dp_replicate;
  p.shard_world = w.shard_world;
  p.assumptions = w.a;

  auto& act = p.activations;
  act.tokens = w.N;
  const BlockMemory block = block_memory(w);
  act.per_block_in_use = block.in_use_per_block;
  act.per_block_full = w.N * block.saved;
  act.per_block_checkpointed = w.N * shape.hidden * w.dt;
  act.saved_without_ac = shape.layers * act.per_block_full;
  const i64 n_ckpt = checkpointed_blocks(shape.layers, true, w.ac_freq);
  act.saved_with_ac = n_ckpt * act.per_block_checkpointed + (shape.layers - n_ckpt) * act.per_block_full;
  act.ce_chunk_tokens = w.ce_chunk;

  for (Offload m : offload_modes) {
    for (bool ac : {w.ac, !w.ac}) {
      ModePlan mp = plan_mode(w, m, ac);
      if (a.profile) mp.time = step_time(w, m, ac, *a.profile);
      if (mp.time && detail::memory_model_of(m).replays_graph(w))
        mp.time->unsure.push_back(
            fmt::format("{}: the CUDA graph's gain is not in the step time (measured on the H200: -51% at "
                        "Qwen3-0.6B/1024, -1.3% at 8192; the profile's blocks ran eagerly)",
                        mode_name(m)));
      if (m == Offload::optimizer) mp = with_pipeline(w, std::move(mp));
      (ac == w.ac ? p.modes : p.modes_other).push_back(std::move(mp));
    }
  }

  if (a.profile && a.gpu_name && *a.gpu_name != a.profile->provenance.device)
    p.notes.push_back(fmt::format(
        "the machine profile ({}) was measured on {}, and this machine's GPU is {}: its step times and host "
        "runtime are that machine's (`primecfg-train --calibrate=FILE` here measures this one, "
        "--plan-profile=FILE uses it)",
        a.profile_source, a.profile->provenance.device, *a.gpu_name));
  if (w.masked)
    p.notes.push_back(
        "packed rows need a document mask: SDPA then cannot use the flash kernel; the plan assumes a fused "
        "kernel that keeps one additive mask per block (a math fallback would need far more)");
  if (std::holds_alternative<MuonConfig>(cfg.optim))
    p.notes.push_back("muon: the orthogonalisation temporaries are an estimate");
  if (cfg.model.quantization) {
    // What FP8 adds is transient, in a linear's backward (nn/fp8.cpp), the larger of two
    // moments of its widest linear at every token of the micro-batch: while dX is formed,
    // dY cast both ways and W^T's e4m3 copy; while dW is formed, both e4m3 operands (cast
    // token-major) and dW (bf16, as cuBLASLt writes it). With ATen's casts (no fused kernels) also the
    // token-major bf16 copy of the wider operand being cast and a cast's FP32 slices (3 of
    // 2^24 elements).
    i64 widest = std::max(shape.intermediate, shape.heads * shape.head_dim);
    if (shape.moe) widest = std::max(widest, shape.moe->intermediate);
    const i64 D = shape.hidden, padded = (w.N + 127) / 128 * 128;
    const i64 bytes = std::max(2 * padded * widest + D * widest, padded * (D + widest) + 2 * D * widest) +
                      (a.fused_fp8_casts ? 0 : 2 * padded * widest + 3 * (i64{4} << 24));
    p.notes.push_back(fmt::format(
        "model.quantization (FP8): its memory is planned as bf16's: the FP8 forward saves what bf16's does "
        "(its input and "
        "weight, as prime-rl's), but a linear's FP8 backward holds up to {:.2f} GiB more for a moment (the "
        "widest, {} x {}, at {} tokens: dY cast both ways for dX, or the operands cast for dW and dW)",
        static_cast<double>(bytes) / (1 << 30), widest, D, w.N));
  }
  if (!a.cuda) p.notes.push_back("CPU run: device memory is host memory; the modes differ only in layout");
  if (a.world > 1)
    p.notes.push_back(
        "sharded run: the staging rings of full offload and the host temporaries are planned at full size "
        "on every rank, and a checkpoint's copy of one whole weight too (rank 0 alone writes them)");
  return p;
}

}  // namespace primecfg::train::plan
