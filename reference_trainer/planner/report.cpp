// The planner's reports (planner.hpp): the text tables and the JSON of `--plan`, the
// refusal before a run that is predicted not to fit, the advice after an out-of-memory.
#include "planner/planner.hpp"

#include "base/strict_json.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace primecfg::train::plan {

using i64 = std::int64_t;

// ---------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------

namespace {

std::string human(i64 bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (i64{1} << 30)) return fmt::format("{:.2f} GiB", b / (1 << 30));
  if (bytes >= (i64{1} << 20)) return fmt::format("{:.1f} MiB", b / (1 << 20));
  if (bytes >= (i64{1} << 10)) return fmt::format("{:.1f} KiB", b / (1 << 10));
  return fmt::format("{} B", bytes);
}

std::string gib(i64 bytes) { return fmt::format("{:.2f}", static_cast<double>(bytes) / (1 << 30)); }

std::string yes_no(std::optional<bool> v) { return v ? (*v ? "yes" : "NO") : "?"; }

// A table: one row per term (in first-seen order), one column per mode.
void table(std::string& out, const std::vector<const MemoryPlan*>& cols,
           const std::vector<std::pair<std::string, std::string>>& labels) {
  std::vector<std::string> names;
  for (const auto* c : cols)
    for (const auto& t : c->terms)
      if (std::find(names.begin(), names.end(), t.name) == names.end()) names.push_back(t.name);
  for (const auto& n : names) {
    std::string label = n;
    for (const auto& [k, v] : labels)
      if (k == n) label = v;
    bool shown = false;
    for (const auto* c : cols) shown |= c->term(n) != 0;
    if (!shown) continue;
    out += fmt::format("  {:<34}", label);
    for (const auto* c : cols) {
      const i64 b = c->term(n);
      out += fmt::format("{:>13}", b ? human(b) : "-");
    }
    out += "\n";
  }
}

std::string shape_line(const Plan& p) {
  const auto& s = p.shape;
  // A routed model's MLP is its experts (intermediate_size is its dense blocks' MLP).
  std::string mlp = fmt::format("MLP {}", s.intermediate);
  if (s.moe) {
    bool dense = false;
    for (int l = 0; l < s.layers; ++l) dense = dense || !s.moe->routed(l);
    mlp = fmt::format("{} experts x {} (top {}){}", s.moe->experts, s.moe->intermediate, s.moe->top_k,
                      dense ? fmt::format(", dense MLP {}", s.intermediate) : "");
  }
  return fmt::format("{:.2f}M params: {} blocks, hidden {}, {}/{} heads x {}, {}, vocab {}{}{}",
                     static_cast<double>(p.params) / 1e6, s.layers, s.hidden, s.heads, s.kv_heads, s.head_dim,
                     mlp, s.vocab_size, s.qk_norm ? ", QK-norm" : "",
                     s.tie_embeddings ? ", tied embeddings" : "");
}

const std::vector<std::pair<std::string, std::string>>& gpu_labels() {
  static const std::vector<std::pair<std::string, std::string>> l = {
      {"weights", "weights (compute copy)"},
      {"blocks_whole", "blocks gathered whole"},
      {"startup_param", "startup: one whole parameter"},
      {"masters", "FP32 masters"},
      {"grads", "FP32 gradient accumulators"},
      {"moments", "optimizer moments"},
      {"weight_shard", "weight shard (at rest)"},
      {"grad_buckets", "reduce-scatter buckets (blocks)"},
      {"grad_buckets_root", "reduce-scatter buckets (root)"},
      {"gather_temp", "all-gather of a padded weight"},
      {"moment_window", "moment window (streamed)"},
      {"workspace", "cuBLAS workspace"},
      {"graph_workspace", "cuBLAS workspace, CUDA graph"},
      {"init_draw", "startup: fp32 draw"},
      {"activations", "activations (on the device)"},
      {"activations_below_top", "  of which below the last block"},
      {"block_recompute", "last block in backward"},
      {"block_in_use", "running block: experts stacked"},
      {"ep_exchange", "expert parallelism: rows exchanged"},
      {"ep_unbalanced", "  not planned: worst routing adds"},
      {"inputs", "inputs + RoPE tables"},
      {"mask", "attention masks"},
      {"mask_below_top", "  masks below the last block"},
      {"mask_top", "  last block's mask"},
      {"final_norm", "final norm input"},
      {"hidden", "final hidden states"},
      {"ce_grad_h", "CE grad w.r.t. hidden"},
      {"ce_grad_w", "CE grad of LM head (fp32)"},
      {"ce_chunk", "logits / CE chunk"},
      {"ce_backward", "LM-head backward buffers"},
      {"backward_temps", "backward temporaries (one block)"},
      {"embed_grad", "embedding gradient(s)"},
      {"embed_grad_held", "  tied LM-head gradient held"},
      {"grads_head", "bf16 grad held: LM head"},
      {"grads_top", "bf16 grads held: last block"},
      {"grads_blocks", "bf16 grads held: all blocks"},
      {"grads_blocks_but_running", "  all but the first block's experts"},
      {"grads_embedding", "bf16 grad held: embedding"},
      {"head_grad_out", "LM-head gradient into its bucket"},
      {"embed_grad_out", "embedding gradient into its bucket"},
      {"head_share_sum", "tied head's share, summed over ranks"},
      {"step_transient", "optimizer-step temporaries"},
      {"checkpoint_weight", "checkpoint: one whole weight"},
  };
  return l;
}

const std::vector<std::pair<std::string, std::string>>& phase_labels() {
  static const std::vector<std::pair<std::string, std::string>> l = {
      {"forward_block", "forward of the last block"},
      {"forward", "end of forward (LM head + CE)"},
      {"backward_head", "backward of the LM head"},
      {"head_reduce", "LM-head grad reduce-scatter"},
      {"backward_block", "backward of the last block"},
      {"backward_first_block", "backward of the first block"},
      {"backward_embedding", "backward of the embedding"},
      {"embedding_reduce", "embedding grad reduce-scatter"},
      {"optimizer_step", "optimizer step"},
      {"startup", "startup"},
      {"step", "training step"},
      {"checkpoint", "checkpoint save"},
  };
  return l;
}

// The phase at a peak, in a column 12 characters wide (the rows above give it in full).
std::string short_phase(const std::string& key) {
  static const std::vector<std::pair<std::string, std::string>> l = {
      {"forward_block", "block fwd"},
      {"forward", "forward"},
      {"backward_head", "head bwd"},
      {"head_reduce", "head rs"},
      {"backward_block", "block bwd"},
      {"backward_first_block", "block 0 bwd"},
      {"backward_embedding", "embed bwd"},
      {"embedding_reduce", "embed rs"},
      {"optimizer_step", "optim step"},
      {"startup", "startup"},
      {"step", "step"},
      {"checkpoint", "checkpoint"},
  };
  for (const auto& [k, v] : l)
    if (k == key) return v;
  return key;
}

std::string label(const std::vector<std::pair<std::string, std::string>>& labels, const std::string& key) {
  for (const auto& [k, v] : labels)
    if (k == key) return v;
  return key;
}

const std::vector<std::pair<std::string, std::string>>& host_labels() {
  static const std::vector<std::pair<std::string, std::string>> l = {
      {"runtime", "LibTorch + CUDA runtime"},
      {"data", "data"},
      {"moments", "optimizer moments"},
      {"masters", "FP32 masters"},
      {"grads", "FP32 gradient accumulators"},
      {"grad_ring", "gradient staging ring (pinned)"},
      {"upload_ring", "weight upload ring (pinned)"},
      {"head_grad", "tied LM head gradient (pinned)"},
      {"state_transient", "host temporaries"},
      {"activations_offloaded", "block inputs offloaded (ac)"},
      {"init", "safetensors mapped at startup"},
      {"checkpoint", "checkpoint: one tensor's copy"},
  };
  return l;
}

void mode_section(std::string& out, const std::vector<ModePlan>& modes) {
  out += fmt::format("  {:<34}", "");
  for (const auto& m : modes) out += fmt::format("{:>13}", mode_name(m.mode));
  out += "\n";
}

}  // namespace

namespace {

std::string seconds(double s) { return s < 1 ? fmt::format("{:.3f} s", s) : fmt::format("{:.2f} s", s); }

// The step-time model's prediction per mode: what each part takes, what overlaps
// leave, and where the model is unsure.
void step_time_section(std::string& out, const Plan& p) {
  const auto& prov = p.assumptions.profile->provenance;
  out += fmt::format("\nStep time, predicted{} (profile: {}, {}, measured {}; {})\n",
                     p.assumptions.world > 1 ? " per rank" : "", prov.device, prov.machine, prov.measured_at,
                     p.assumptions.profile_source);
  mode_section(out, p.modes);
  auto row = [&](std::string_view name, auto get) {
    out += fmt::format("  {:<34}", name);
    for (const auto& m : p.modes) {
      const double v = get(*m.time);
      out += fmt::format("{:>13}", v > 0 ? seconds(v) : "-");
    }
    out += "\n";
  };
  row("forward (GPU)", [](const StepTime& t) { return t.forward; });
  row("recompute (model.ac)", [](const StepTime& t) { return t.recompute; });
  row("backward (GPU)", [](const StepTime& t) { return t.backward; });
  row("optimizer on the GPU", [](const StepTime& t) { return t.gpu_update; });
  row("PCIe copies of the mode", [](const StepTime& t) { return t.link; });
  row("CPU update", [](const StepTime& t) { return t.cpu_update; });
  row("collectives", [](const StepTime& t) { return t.collectives; });
  row("activation offloading copies", [](const StepTime& t) { return t.ac_offload; });
  row("STEP (with overlaps)", [](const StepTime& t) { return t.step; });
  out += fmt::format("  {:<34}", "  bound by");
  for (const auto& m : p.modes) out += fmt::format("{:>13}", m.time->bound);
  out += "\n";
  out += fmt::format("  {:<34}", "tokens/s");
  for (const auto& m : p.modes) out += fmt::format("{:>13.0f}", m.time->tokens_per_s);
  out += "\n";
  out += fmt::format("  {:<34}", "MFU");
  for (const auto& m : p.modes) out += fmt::format("{:>12.1f}%", 100 * m.time->mfu);
  out += "\n";
  std::vector<std::string> said;
  for (const auto& m : p.modes)
    for (const auto& u : m.time->unsure)
      if (std::find(said.begin(), said.end(), u) == said.end()) {
        said.push_back(u);
        out += "  unsure: " + u + "\n";
      }
}

// offload = "optimizer"'s copy pipeline as the run will set it (PipelineChoice).
std::string pipeline_line(const PipelineChoice& c) {
  return fmt::format("  optimizer's pipeline: deferred write-backs {:g}{} ({}: {})\n", c.deferred_share,
                     c.ring_bytes ? fmt::format(", moment window {} MiB", *c.ring_bytes >> 20) : "",
                     c.chosen ? "chosen" : "given", c.why);
}

}  // namespace

std::string format_text(const Plan& p, const Advice* advice) {
  const auto& a = p.assumptions;
  std::string out;
  out += fmt::format("Memory plan: {} ({})\n", p.model_name, shape_line(p));
  out += fmt::format(
      "micro-batch {} x {} tokens ({} per step), {} compute, optimizer {}, activation checkpointing {}{}\n",
      p.micro_batch, p.seq_len, p.batch, a.compute_bytes == 2 ? "bf16" : "fp32", p.optimizer,
      p.ac ? (p.ac_freq == 1 ? std::string("on (every block)")
                             : fmt::format("on (every {} blocks)", p.ac_freq))
      : p.selective_experts
          ? (p.ac_freq == 1 ? std::string("selective (the routed experts of every block)")
                            : fmt::format("selective (the routed experts of every {} blocks)", p.ac_freq))
          : "off",
      p.ac_inputs_kept ? fmt::format(", offloading (model.ac_offloading): {} block inputs to host memory, "
                                     "{} kept on the device",
                                     p.ac_inputs_offloaded, p.ac_inputs_kept)
                       : "");
  out += fmt::format("GPU: {} ({}); host: {} ({})\n", a.gpu_capacity ? human(*a.gpu_capacity) : "unknown",
                     a.gpu_capacity_source, a.host_capacity ? human(*a.host_capacity) : "unknown",
                     a.host_capacity_source);
  // One process (world 1) prints as it always did; the lines below exist only for ranks.
  if (a.world > 1)
    out += fmt::format(
        "Ranks: {} ({}), {} per node ({}). {}Compute weights, FP32 masters, gradient accumulators and "
        "optimizer moments sharded 1/{} (padded); whole weights only for the root (embedding, final norm, "
        "LM head) and the blocks in use ({}); gradient buckets of {} (--dist.bucket-mib; at least the "
        "largest parameter) in {}. GPU figures are per rank; host per rank, then per node.\n",
        a.world, a.world_source, a.per_node(), a.ranks_per_node_source,
        p.replicas > 1 ? fmt::format("HSDP: {} replicas of {}-rank shard groups (model.dp_replicate). ",
                                     p.replicas, p.shard_world)
                       : "",
        p.shard_world,
        p.reshard_after_forward
            ? "model.reshard_after_forward: two at a time"
            : "reshard_after_forward = false: every block from its forward to its backward",
        human(a.bucket_bytes), p.reduce_bytes == 2 ? "bf16" : "fp32");
  const auto& act = p.activations;
  out += fmt::format(
      "\nActivations of one micro-batch ({} tokens): one block keeps {} ({} B/token{}); all {} blocks {} "
      "without checkpointing, {} with it (+ one block recomputed in backward). CE chunk: {} tokens.\n",
      act.tokens, human(act.per_block_full), act.tokens ? act.per_block_full / act.tokens : 0,
      act.per_block_in_use
          ? fmt::format("; while it runs, {} of its experts stacked", human(act.per_block_in_use))
          : "",
      p.shape.layers, human(act.saved_without_ac), human(act.saved_with_ac), act.ce_chunk_tokens);

  std::vector<const MemoryPlan*> g, h;
  for (const auto& m : p.modes) {
    g.push_back(&m.gpu);
    h.push_back(&m.host);
  }
  out += "\nGPU memory, by term (offload mode in columns)\n";
  mode_section(out, p.modes);
  table(out, g, gpu_labels());
  out += "  phases (sum of the terms alive then):\n";
  for (std::size_t i = 0; i < p.modes.front().gpu.phases.size(); ++i) {
    const std::string& name = p.modes.front().gpu.phases[i].name;
    out += fmt::format("    {:<32}", label(phase_labels(), name));
    for (const auto& m : p.modes) {
      const Phase* ph = m.gpu.phase(name);
      out += fmt::format("{:>13}", ph ? human(ph->bytes) : "-");
    }
    out += "\n";
  }
  out += fmt::format("  {:<34}", "PEAK ALLOCATED");
  for (const auto& m : p.modes) out += fmt::format("{:>13}", human(m.gpu.peak));
  out += "\n";
  out += fmt::format("  {:<34}", "  at");
  for (const auto& m : p.modes) out += fmt::format("{:>13}", short_phase(m.gpu.peak_phase));
  out += "\n";
  out += fmt::format("  {:<34}", "device total (+slack, context)");
  for (const auto& m : p.modes) out += fmt::format("{:>13}", human(m.gpu_total));
  out += "\n";
  out += fmt::format("  {:<34}", "fits the GPU");
  for (const auto& m : p.modes) out += fmt::format("{:>13}", yes_no(m.gpu_fits));
  out += "\n";
  out += pipeline_line(p.mode(Offload::optimizer).pipeline);

  out += "\nHost memory, by term\n";
  mode_section(out, p.modes);
  table(out, h, host_labels());
  out += fmt::format("  {:<34}", a.world > 1 ? "PEAK RESIDENT (one rank)" : "PEAK RESIDENT");
  for (const auto& m : p.modes) out += fmt::format("{:>13}", human(m.host.peak));
  out += "\n";
  out += fmt::format("  {:<34}", "  at");
  for (const auto& m : p.modes) out += fmt::format("{:>13}", short_phase(m.host.peak_phase));
  out += "\n";
  if (a.world > 1) {
    out += fmt::format("  {:<34}", fmt::format("PER NODE ({} ranks)", a.per_node()));
    for (const auto& m : p.modes) out += fmt::format("{:>13}", human(m.host_node));
    out += "\n";
  }
  out += fmt::format("  {:<34}", "fits the host");
  for (const auto& m : p.modes) out += fmt::format("{:>13}", yes_no(m.host_fits));
  out += "\n";

  if (p.modes.front().time)
    step_time_section(out, p);
  else
    out +=
        "\nStep time: not predicted: no machine profile (primecfg-train --calibrate=FILE measures this "
        "machine, --plan-profile=FILE uses it).\n";

  out += fmt::format("\nWith model.ac {}:\n", p.ac ? "off" : "on (freq 1)");
  mode_section(out, p.modes_other);
  out += fmt::format("  {:<34}", "peak allocated");
  for (const auto& m : p.modes_other) out += fmt::format("{:>13}", human(m.gpu.peak));
  out += "\n";
  out += fmt::format("  {:<34}", "fits (GPU and host)");
  for (const auto& m : p.modes_other) out += fmt::format("{:>13}", m.fits() ? "yes" : "NO");
  out += "\n";
  if (p.modes_other.front().time) {
    out += fmt::format("  {:<34}", "predicted step");
    for (const auto& m : p.modes_other) out += fmt::format("{:>13}", seconds(m.time->step));
    out += "\n";
  }

  std::vector<std::string> fit;
  for (const auto& m : p.modes)
    if (m.fits()) fit.emplace_back(mode_name(m.mode));
  out += "\n";
  if (!a.gpu_capacity || !a.host_capacity) out += "Capacity unknown for part of the machine: '?' above.\n";
  if (!fit.empty()) {
    std::string list;
    for (const auto& f : fit) list += (list.empty() ? "" : ", ") + f;
    out += fmt::format("Fits this machine: offload = {}\n", list);
  }
  if (advice)
    out += format_advice(*advice);
  else if (fit.empty())
    out += "No offload mode fits this machine with this config.\n";
  for (const auto& n : p.notes) out += "note: " + n + "\n";
  out += fmt::format(
      "assumptions: allocator slack {:.0f}%, CUDA context {}, runtime on host {} ({}), pinned buffers "
      "rounded "
      "to powers of two: {} (docs/memory-planner.md)\n",
      a.allocator_slack * 100, human(a.cuda_context), human(a.host_runtime), a.host_runtime_source,
      a.pinned_pow2 ? "yes" : "no");
  return out;
}

namespace {

using strict_json::ordered;

template <class T>
ordered or_null(const std::optional<T>& v) {
  return v ? ordered(*v) : ordered(nullptr);
}

// A memory plan (the GPU's gets total_bytes and fits after these members).
ordered json_mem(const MemoryPlan& m) {
  ordered terms = ordered::object(), phases = ordered::array();
  for (const auto& t : m.terms) terms[t.name] = t.bytes;
  for (const auto& p : m.phases) phases.push_back({{"name", p.name}, {"bytes", p.bytes}, {"terms", p.terms}});
  return {{"peak_bytes", m.peak},
          {"peak_gib", gib(m.peak)},
          {"peak_phase", m.peak_phase},
          {"terms", terms},
          {"phases", phases}};
}

ordered json_modes(const std::vector<ModePlan>& modes) {
  ordered out = ordered::array();
  for (const auto& m : modes) {
    ordered gpu = json_mem(m.gpu), host = json_mem(m.host);
    gpu["total_bytes"] = m.gpu_total;
    gpu["fits"] = or_null(m.gpu_fits);
    host["node_peak_bytes"] = m.host_node;  // every rank of one node: what host.fits compares
    host["node_peak_gib"] = gib(m.host_node);
    host["fits"] = or_null(m.host_fits);
    ordered time = nullptr;
    if (const auto& t = m.time)
      time = {{"step_s", t->step},
              {"bound", t->bound},
              {"tokens_per_s", t->tokens_per_s},
              {"mfu", t->mfu},
              {"forward_s", t->forward},
              {"recompute_s", t->recompute},
              {"backward_s", t->backward},
              {"gpu_update_s", t->gpu_update},
              {"link_s", t->link},
              {"cpu_update_s", t->cpu_update},
              {"collectives_s", t->collectives},
              {"ac_offload_s", t->ac_offload},
              {"unsure", t->unsure}};
    ordered pipeline = nullptr;
    if (m.mode == Offload::optimizer)
      pipeline = {{"deferred_share", m.pipeline.deferred_share},
                  {"ring_bytes", or_null(m.pipeline.ring_bytes)},
                  {"chosen", m.pipeline.chosen},
                  {"why", m.pipeline.why}};
    out.push_back({{"offload", mode_name(m.mode)},
                   {"ac", m.ac},
                   {"pipeline", pipeline},
                   {"gpu", gpu},
                   {"host", host},
                   {"fits", m.fits()},
                   {"step_time", time}});
  }
  return out;
}

}  // namespace

std::string format_json(const Plan& p, const Advice* advice) {
  const auto& s = p.shape;
  const auto& a = p.assumptions;
  const auto& act = p.activations;
  ordered fits = ordered::array();
  for (const auto& m : p.modes)
    if (m.fits()) fits.push_back(mode_name(m.mode));
  const ordered out = {
      {"model",
       {{"name", p.model_name},
        {"params", p.params},
        {"vocab_size", s.vocab_size},
        {"hidden", s.hidden},
        {"layers", s.layers},
        {"heads", s.heads},
        {"kv_heads", s.kv_heads},
        {"head_dim", s.head_dim},
        {"intermediate", s.intermediate},
        {"qk_norm", s.qk_norm},
        {"tie_embeddings", s.tie_embeddings}}},
      {"micro_batch_size", p.micro_batch},
      {"seq_len", p.seq_len},
      {"batch_size", p.batch},
      {"compute_dtype", a.compute_bytes == 2 ? "bf16" : "fp32"},
      {"optimizer", p.optimizer},
      {"ac", p.ac},
      {"ac_freq", p.ac_freq},
      {"ac_selective_targets",
       p.selective_experts ? strict_json::ordered::array({"routed_experts"}) : strict_json::ordered::array()},
      {"ac_offloading", p.ac_inputs_kept ? strict_json::ordered{{"inputs_kept", p.ac_inputs_kept},
                                                                {"inputs_offloaded", p.ac_inputs_offloaded}}
                                         : strict_json::ordered(nullptr)},
      {"attention_mask", p.attention_mask},
      {"world_size", a.world},
      {"ranks_per_node", a.per_node()},
      {"dp_replicate", p.replicas},
      {"shard_world_size", p.shard_world},
      {"reshard_after_forward", p.reshard_after_forward},
      {"dist",
       {{"world_source", a.world_source},
        {"ranks_per_node_source", a.ranks_per_node_source},
        {"bucket_bytes", a.bucket_bytes},
        {"reduce_dtype", p.reduce_bytes == 2 ? "bf16" : "fp32"}}},
      {"capacity",
       {{"gpu_bytes", or_null(a.gpu_capacity)},
        {"gpu_source", a.gpu_capacity_source},
        {"host_bytes", or_null(a.host_capacity)},
        {"host_source", a.host_capacity_source}}},
      {"assumptions",
       {{"device_block", a.device_block},
        {"pinned_pow2", a.pinned_pow2},
        {"cublas_workspace", a.cublas_workspace},
        {"cuda_context", a.cuda_context},
        {"allocator_slack", a.allocator_slack},
        {"host_runtime", a.host_runtime},
        {"host_runtime_source", a.host_runtime_source}}},
      {"activations",
       {{"tokens", act.tokens},
        {"per_block_full", act.per_block_full},
        {"per_block_checkpointed", act.per_block_checkpointed},
        {"saved_without_ac", act.saved_without_ac},
        {"saved_with_ac", act.saved_with_ac},
        {"ce_chunk_tokens", act.ce_chunk_tokens}}},
      {"step_time_profile", a.profile ? ordered{{"device", a.profile->provenance.device},
                                                {"machine", a.profile->provenance.machine},
                                                {"measured_at", a.profile->provenance.measured_at},
                                                {"commit", a.profile->provenance.commit},
                                                {"source", a.profile_source}}
                                      : ordered(nullptr)},
      {"modes", json_modes(p.modes)},
      {"modes_ac_toggled", json_modes(p.modes_other)},
      {"fits", fits},
      {"notes", p.notes},
  };
  if (!advice) return strict_json::dump(out) + "\n";
  ordered with = out;
  with["recommendation"] = {{"mode", advice->mode ? ordered(mode_name(*advice->mode)) : ordered(nullptr)},
                            {"summary", advice->summary},
                            {"changes", advice->changes},
                            {"combined", advice->combined}};
  return strict_json::dump(with) + "\n";
}

std::string fit_refusal(const Plan& p, Offload mode) {
  const auto& a = p.assumptions;
  const ModePlan& m = p.mode(mode);
  if (m.fits()) return {};
  std::string out =
      fmt::format("model.offload = \"{}\"{}{} is predicted not to fit:", mode_name(mode),
                  p.ac ? " with model.ac" : "", a.world > 1 ? fmt::format(" over {} ranks", a.world) : "");
  if (!m.gpu_fits.value_or(true))
    out += fmt::format(" GPU {} needed, {} there ({})", human(m.gpu_total), human(*a.gpu_capacity),
                       a.gpu_capacity_source);
  if (!m.host_fits.value_or(true))
    out += fmt::format("{} host {} needed{}, {} available ({})", m.gpu_fits.value_or(true) ? "" : ";",
                       human(m.host_node),
                       a.per_node() > 1 ? fmt::format(" by {} ranks on the node", a.per_node()) : "",
                       human(*a.host_capacity), a.host_capacity_source);
  std::string fit;
  for (const auto& o : p.modes)
    if (o.mode != mode && o.fits())
      fit += fmt::format("{}model.offload = \"{}\"", fit.empty() ? "" : ", ", mode_name(o.mode));
  for (const auto& o : p.modes_other)
    if (o.fits())
      fit += fmt::format("{}model.offload = \"{}\" with model.ac {}", fit.empty() ? "" : ", ",
                         mode_name(o.mode), p.ac ? "off" : "on");
  out += fit.empty() ? ". No mode is predicted to fit; shorten data.seq_len or micro_batch_size.\n"
                     : ". Predicted to fit: " + fit + ".\n";
  return out;
}

std::string host_oom_advice(const Plan& p, Offload mode, bool cpu_device, std::optional<i64> limit) {
  const auto& a = p.assumptions;
  const ModePlan& m = p.mode(mode);
  std::string out = fmt::format(
      "host memory ran out with model.offload = \"{}\". The planner's host estimate for this config (it "
      "models "
      "a CUDA run): {} per process{}",
      mode_name(mode), human(m.host.peak),
      a.per_node() > 1 ? fmt::format(", {} for the {} ranks of a node", human(m.host_node), a.per_node())
                       : "");
  if (cpu_device)
    out += fmt::format(
        ", plus {} it puts on the device, which lives in host memory too on --device=cpu: about {} in all",
        human(m.gpu.peak), human(m.host.peak + m.gpu.peak));
  out += ".\n";
  if (a.host_capacity)
    out += fmt::format("This machine offers {} ({}).\n", human(*a.host_capacity), a.host_capacity_source);
  if (limit) out += fmt::format("The process's address-space limit (ulimit -v) is {}.\n", human(*limit));
  return out;
}

std::string oom_advice(const Plan& p, Offload mode) {
  const auto& a = p.assumptions;
  const ModePlan& failed = p.mode(mode);
  std::string out = fmt::format(
      "out of GPU memory with model.offload = \"{}\"{}. The planner predicted a peak of {} allocated "
      "({} with allocator slack and CUDA context){}",
      mode_name(mode), p.ac ? " and model.ac on" : "", human(failed.gpu.peak), human(failed.gpu_total),
      a.world > 1 ? fmt::format(" per rank of {}", a.world) : "");
  if (a.gpu_capacity)
    out += fmt::format(" on a {} device{}", human(*a.gpu_capacity),
                       failed.gpu_fits.value_or(false) ? " (it predicted a fit: see docs/memory-planner.md, "
                                                         "known limits)"
                                                       : "");
  out += ".\n";
  std::vector<const ModePlan*> fit;
  for (const auto& m : p.modes)
    if (m.mode != mode && m.fits() && m.gpu_total < failed.gpu_total) fit.push_back(&m);
  if (!fit.empty()) {
    std::string list;
    for (const auto* m : fit)
      list += fmt::format("{}model.offload = \"{}\" ({})", list.empty() ? "" : ", ", mode_name(m->mode),
                          human(m->gpu_total));
    out += "Predicted to fit: " + list + ".\n";
    return out;
  }
  std::vector<const ModePlan*> fit_ac;
  for (const auto& m : p.modes_other)
    if (m.fits() && m.gpu_total < failed.gpu_total) fit_ac.push_back(&m);
  if (!fit_ac.empty()) {
    std::string list;
    for (const auto* m : fit_ac)
      list += fmt::format("{}\"{}\" ({})", list.empty() ? "" : ", ", mode_name(m->mode), human(m->gpu_total));
    out += fmt::format(
        "No other offload mode fits as is; with activation checkpointing {} these are "
        "predicted to fit: model.offload = {}.\n",
        p.ac ? "off" : "on (--model.ac)", list);
    return out;
  }
  out += "No offload mode is predicted to fit this config; reduce data.micro_batch_size or data.seq_len";
  out += p.ac ? ".\n" : ", or enable activation checkpointing (--model.ac).\n";
  return out;
}

}  // namespace primecfg::train::plan
