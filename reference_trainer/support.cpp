#include "support.hpp"

#include "distributed/mesh.hpp"
#include "model/config.hpp"
#include "model/fp8_layers.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace primecfg::train {

namespace {

using enum Decision;

// Notes are given in this order (before the launcher's sections), so that two notes at
// one place read in a fixed order.
constexpr FieldDecision decisions[] = {
    {"model.name", used, "the model built and loaded"},
    {"model.offload", used, "where the FP32 state lives (offload/)"},
    {"model.seq_len", refused, "a packed length other than data.seq_len"},
    {"model.attn", refused, "attention kernels other than SDPA"},
    {"model.impl", refused, "the hf and liger_kernel implementations"},
    {"model.optimization_dtype", refused, "masters other than FP32"},
    {"model.reduce_dtype",
     used,
     "the gradient reduction across ranks",
     {},
     "one process: no gradient is reduced across ranks"},
    {"model.reshard_after_forward",
     used,
     "whether a block's gathered weights are freed after its forward (distributed/fsdp.hpp)",
     {},
     "one process: the weights are whole, nothing is sharded"},
    {"model.cp", refused, "context parallelism"},
    {"model.cp_style", no_effect, "context parallelism is not implemented"},
    {"model.deepep_num_sms", no_effect, "only DeepEP reads it, and that is not implemented"},
    {"model.deepep_token_chunk_size", no_effect, "only DeepEP reads it, and that is not implemented"},
    {"model.moe_use_grouped_mm", used,
     "routed experts: grouped GEMM, or one matmul per expert (a note on a model without them)"},
    {"model.compile", refused, "torch.compile"},
    {"model.compile.fullgraph", no_effect, "there is no torch.compile in LibTorch"},
    {"model.ac.freq", used, "which blocks are recomputed"},
    {"model.ac.mode", used, "full recomputes whole blocks; selective the routed experts"},
    {"model.ac.targets", refused, "selective recompute of targets other than routed_experts"},
    {"model.ac_offloading.pin_memory", used, "page-locked host buffers for the offloaded block inputs"},
    {"model.ac_offloading.max_inflight_activations", used, "the block inputs kept on the device at once"},
    {"model.fused_lm_head_token_chunk_size", used, "the loss chunking"},
    {"model.dp_replicate",
     used,
     "HSDP: how many replicas of the sharded state (distributed/fsdp.hpp)",
     {},
     "one process: the weights are whole, nothing is sharded"},
    {"model.ep", used, "expert parallelism: the routed experts split over the ranks"},
    {"model.ep_comm_backend", refused, "DeepEP"},
    {"model.trust_remote_code", refused, "remote model code"},
    {"model.lora", refused, "LoRA"},
    {"model.quantization.type", used, "FP8 linears with blockwise scales (nn/fp8.hpp), on an H100 or H200"},
    {"model.quantization.enable_grouped_gemm", used,
     "routed experts in FP8 (one expert at a time; sizes not multiples of 128 are an error) or bf16"},
    {"model.quantization.ignore_patterns", used, "the linears kept in bf16 (Transformer::use_fp8)"},
    {"model.vlm", refused, "vision-language models"},
    {"model.debug.num_layers", used, "the blocks built"},
    {"model.debug.random_init", used, "random weights instead of the HF ones"},
    {"model.debug.force_balanced_routing", used,
     "routed experts: tokens spread round-robin (an error on a model without them)"},
    {"model.conversion_dir", refused, "checkpoint conversion"},
    {"model.moe_router_dtype", used,
     "the router's gate GEMM dtype (an error on a model without routed experts)"},
    {"model.moe_fused_kernel", refused, "a fused MoE kernel"},
    {"model.freeze_moe_router", used, "the routers keep their loaded weights"},
    {"model.index_cache", refused, "sparse attention"},

    {"dist_timeout_seconds",
     used,
     "the collectives' timeout",
     {},
     "one process: there are no collectives to time out"},
    {"gc", no_effect, "Python's garbage collector does not run here"},

    {"log.level", no_effect, "primecfg-train prints progress and errors only"},
    {"log.vf_level", no_effect, "the verifiers package does not run here"},
    {"log.interval", no_effect, "primecfg-train prints one line per step"},
    {"log.ranks_filter",
     no_effect,
     "rank 0 reports for every rank",
     {},
     "one process: its output is always shown"},
    {"log.json_logging", refused, "JSON logs"},
    {"log.log_data", refused, "logging the first data sample"},

    {"data.type", used, "SFT or fake data (data/loader.cpp)"},
    {"data.seq_len", used, "the packed length"},
    {"data.batch_size", used, "the samples of a step"},
    {"data.micro_batch_size", used, "the samples of a forward/backward pass"},
    {"data.num_workers", no_effect, "data is prepared in the training process"},
    {"data.stopping_strategy", no_effect, "it applies only to interleaved subsets or splits"},
    {"data.name", refused, "downloading a dataset"},
    {"data.path", used, "the JSONL file read"},
    {"data.subsets", refused, "dataset subsets"},
    {"data.splits", refused, "dataset splits"},
    {"data.probabilities", refused, "interleaving subsets or splits"},
    {"data.pack", used, "packing records into rows"},
    {"data.shuffle", used, "the order of data.path's records"},
    {"data.seed", used, "the shuffle, the reverse-text examples and the initial weights", "sft"},
    {"data.seed", refused, "a seed for fake tokens", "fake"},
    {"data.loss_mask", refused, "role masks"},
    {"data.length", used, "fixed or variable fake lengths"},
    {"data.input_ids", used, "increasing or random fake tokens"},
    {"data.generate_samples", refused, "generated fake samples"},

    {"weight_broadcast", no_effect,
     "weights go to the inference server of online evals, which the launcher runs"},
    {"renderer", no_effect, "records are tokenized before training (tools/tokenize_jsonl.py)"},
    {"renderer.name", refused, "chat templates"},

    {"tokenizer.name", refused, "a tokenizer other than the model's"},
    {"tokenizer.trust_remote_code", refused, "remote tokenizer code"},
    {"tokenizer.chat_template", refused, "chat templates (tools/tokenize_jsonl.py applies them)"},

    {"optim.type", used, "the optimizer (optim/math.hpp)"},
    {"optim.lr", used, "the optimizer's peak learning rate"},
    {"optim.weight_decay", used, "the optimizer"},
    {"optim.max_norm", used, "gradient clipping"},
    {"optim.betas1", used, "AdamW's and Muon's first moments"},
    {"optim.betas2", used, "AdamW's and Muon's second moments"},
    {"optim.momentum", used, "SGD's momentum (Muon's: the old name of mu)"},
    {"optim.nesterov", used, "SGD"},
    {"optim.mu", used, "Muon's momentum"},

    {"scheduler.type", used, "the learning-rate schedule"},
    {"scheduler.warmup_steps", used, "the learning-rate schedule"},
    {"scheduler.decay_steps", used, "the learning-rate schedule"},
    {"scheduler.min_lr", used, "the learning-rate schedule"},

    {"ckpt.interval", used, "when checkpoints are written"},
    {"ckpt.output_dir", used, "the checkpoint folder"},
    {"ckpt.keep_last", used, "pruning old checkpoints"},
    {"ckpt.keep_interval", refused, "keeping every n-th checkpoint"},
    {"ckpt.skip_progress", refused, "resuming without the step counters"},
    {"ckpt.skip_dataloader", refused, "resuming without the data position"},
    {"ckpt.skip_optimizer", used, "checkpoints without optimizer state"},
    {"ckpt.skip_scheduler", used, "restarting the schedule on resume"},
    {"ckpt.skip_gather_master_weights", no_effect,
     "each rank writes its own piece of the masters; they are never gathered"},
    {"resume.step", used, "the checkpoint resumed from"},
    {"resume.dir", refused, "resuming from another folder"},

    {"monitors.file", refused, "turning metrics.jsonl off"},
    {"monitors.file.path", refused, "another metrics file"},
    {"monitors.wandb", refused, "W&B logging"},
    {"monitors.prime", refused, "platform logging"},
    {"run.name", refused, "the launcher's run folder"},
    {"run.dir", refused, "the launcher's run folder"},
    {"val", refused, "validation during training"},
    {"heartbeat", refused, "the BetterStack heartbeat"},

    {"max_steps", used, "the steps run"},
    {"output_dir", used, "the run's folder"},
    {"clean", used, "emptying a used output_dir"},
    {"matmul_precision", refused, "FP32 matmul precisions other than high"},
    {"memory_profiler_path", refused, "memory profiles"},
    {"trace_path", refused, "profiler traces"},
    {"dry_run", refused, "a launcher setting"},
    {"env_vars", refused, "setting environment variables"},

    {"eval", launcher_only, "online evaluation"},
    {"inference", launcher_only, "inference servers"},
    {"deployment", launcher_only, "GPU placement"},
    {"slurm", launcher_only, "SLURM submission"},
};

constexpr FieldDecision rl_only[] = {
    {"loss", refused, "the RL loss"},
    {"weight_broadcast", refused, "sending weights to inference"},
    {"metrics_server", refused, "the Prometheus endpoint"},
    {"enable_router_replay", refused, "MoE router replay"},
    {"enable_token_export", refused, "exporting trained tokens"},
    {"rollout_transport", no_effect, "it trains on [data.fake], no rollouts arrive"},
};

// A path check_support refuses. Its constructor runs when compiling: a refusal whose
// path is not `refused` in the table does not build, so the two cannot drift apart.
struct refused_path {
  std::string_view path;
  consteval refused_path(const char* p) : path(p) {
    bool listed = false;
    for (const FieldDecision& f : decisions) listed = listed || (f.path == path && f.decision == refused);
    if (!listed) throw "check_support refuses a path that the decisions table does not list as refused";
  }
};

// The alternative (`type`) of the tagged union a path is in; empty outside unions.
std::string_view alternative_of(const SFTConfig& cfg, std::string_view path) {
  auto type = [](const auto& u) { return std::visit([](const auto& a) { return a.type; }, u); };
  if (path.starts_with("data.")) return type(cfg.data);
  if (path.starts_with("optim.")) return type(cfg.optim);
  if (path.starts_with("scheduler.")) return type(cfg.scheduler);
  return {};
}

class checker {
 public:
  checker(const provenance_map& where, std::vector<diagnostic>& out) : where_(where), out_(out) {}

  // Where a field (or, for a table, its first key) was set; default when nowhere.
  provenance source(std::string_view path) const {
    const std::string key(path);
    if (auto it = where_.find(key); it != where_.end()) return it->second;
    auto it = where_.lower_bound(key + ".");
    if (it != where_.end() && it->first.rfind(key + ".", 0) == 0) return it->second;
    return {};
  }
  bool explicitly_set(std::string_view path) const { return !source(path).is_default(); }

  // A path as this config spells it: a TrainerConfig's fake data is [data.fake], not [data].
  std::string spelled(std::string_view path) const {
    if (path.starts_with("data.") && explicitly_set("data.fake"))
      return "data.fake." + std::string(path.substr(5));
    return std::string(path);
  }

  void refuse(refused_path path, std::string message) { error(spelled(path.path), std::move(message)); }
  void error(std::string_view path, std::string message) { add(severity::error, path, std::move(message)); }
  void note(std::string_view path, std::string message) { add(severity::note, path, std::move(message)); }

 private:
  void add(severity s, std::string_view path, std::string message) {
    diagnostic d;
    d.level = s;
    d.kind = error_kind::value_error;
    d.path = std::string(path);
    d.where = source(path);
    d.message = std::move(message);
    out_.push_back(std::move(d));
  }
  const provenance_map& where_;
  std::vector<diagnostic>& out_;
};

}  // namespace

std::span<const FieldDecision> field_decisions() { return decisions; }
std::span<const FieldDecision> rl_only_decisions() { return rl_only; }

std::vector<diagnostic> check_support(const SFTConfig& cfg, const provenance_map& where, int world) {
  std::vector<diagnostic> out;
  checker c(where, out);
  const auto& m = cfg.model;
  const std::string not_impl = "is not implemented by primecfg-train";

  if (m.cp > 1)
    c.refuse("model.cp", fmt::format("context parallelism (cp = {}) {}; set cp = 1", m.cp, not_impl));
  // The mesh's rules (distributed/mesh.cpp), and expert parallelism's own. ep = "auto"
  // (prime-rl's default; 1 is this library's) is expert parallelism for a model with
  // routed experts on several ranks. A model that does not resolve is reported where it
  // is read (ep = "auto" is then taken as 1 here).
  bool has_experts = false, resolved = false;
  std::int64_t experts = 0, hidden = 0, expert_intermediate = 0;
  try {
    const ModelArgs args = resolve_model(m.name).args;
    has_experts = args.moe.has_value();
    experts = has_experts ? args.moe->experts : 0;
    hidden = args.hidden;
    expert_intermediate = has_experts ? args.moe->intermediate : 0;
    resolved = true;
  } catch (const model_config_error&) {
  }
  // The routed experts' settings on a model without them: prime-rl ignores them there;
  // here a value that would do nothing is an error, or (a kernel choice) a note.
  if (resolved && !has_experts) {
    const std::string none = fmt::format("{} has no routed experts, so this would do nothing", m.name);
    if (m.moe_router_dtype != Dtype::float32) c.error("model.moe_router_dtype", none);
    if (m.debug && m.debug->force_balanced_routing) c.error("model.debug.force_balanced_routing", none);
    if (m.freeze_moe_router) c.error("model.freeze_moe_router", none);
    if (!m.moe_use_grouped_mm) c.note("model.moe_use_grouped_mm", none);
  }
  std::vector<MeshProblem> mesh;
  resolve_mesh(MeshRequest::of(m, world, resolved ? std::optional<long long>(experts) : std::nullopt), mesh);
  if (has_experts && world > 1 && !c.explicitly_set("model.ep") &&
      (m.impl == ModelImpl::custom || m.impl == ModelImpl::auto_))
    c.error(
        "model.ep",
        fmt::format("unset, and {} has routed experts: prime-rl's default ep = \"auto\" would split them "
                    "over {} ranks (expert parallelism), this trainer's default 1 trains with FSDP alone; "
                    "set ep = \"auto\" or a degree for expert parallelism, or ep = 1 for FSDP alone",
                    m.name, std::min(world / std::max<std::int64_t>(1, m.dp_replicate), std::int64_t{8})));
  for (const auto& p : mesh)
    if (!(p.field == "model.cp" && m.cp > 1)) c.error(p.field, p.message);
  if (m.lora) c.refuse("model.lora", "LoRA " + not_impl + "; remove [model.lora]");
  if (m.quantization) {
    // Which linears are FP8 is decided when the model is built (Transformer::use_fp8); the
    // device when it runs (--plan may plan for a GPU this machine lacks).
    if (m.quantization->enable_grouped_gemm && has_experts)
      if (const auto why = fp8::experts_stay_bf16(hidden, expert_intermediate))
        c.error("model.quantization.enable_grouped_gemm",
                fmt::format("true, and {}'s routed experts {}; set it to false to keep them in bf16", m.name,
                            *why));
    for (const auto& pattern : m.quantization->ignore_patterns)
      if (const auto why = fp8::invalid_pattern(pattern)) c.error("model.quantization.ignore_patterns", *why);
  }
  if (m.vlm)
    c.refuse("model.vlm", "vision-language models are " + std::string("not supported by primecfg-train"));
  // prime-rl's offloading hooks move every tensor saved for backward, which with freq > 1
  // includes whole blocks' activations; here only the checkpointed blocks' inputs move.
  if (m.ac_offloading && m.ac && m.ac->freq > 1)
    c.error(
        "model.ac.freq",
        fmt::format("activation offloading (model.ac_offloading) with freq = {} would move the blocks that "
                    "are not checkpointed too, as prime-rl does; primecfg-train offloads the checkpointed "
                    "block inputs only: set freq = 1, or ac_offloading = \"None\"",
                    m.ac->freq));
  if (m.ac && m.ac->mode == AcMode::selective) {
    // prime-rl's targets; of them this trainer recomputes the routed experts only.
    std::vector<std::string> others;
    for (const std::string& t : m.ac->targets)
      if (t != "routed_experts") others.push_back(fmt::format("\"{}\"", t));
    if (!others.empty())
      c.refuse("model.ac.targets",
               fmt::format("selective recompute of {} {}; the one target it recomputes is "
                           "\"routed_experts\" (or set mode = \"full\")",
                           fmt::join(others, ", "), not_impl));
    else if (resolved && !has_experts)
      c.error(
          "model.ac.targets",
          fmt::format("\"routed_experts\": {} has no routed experts, so no block would recompute anything "
                      "(prime-rl refuses a target no layer supports); use mode = \"full\"",
                      m.name));
    if (m.ac_offloading)
      c.error(
          "model.ac_offloading",
          "moves the inputs of fully checkpointed blocks to host memory, and with ac.mode = \"selective\" "
          "no block is; prime-rl's offloading of every saved tensor is not implemented: set ac.mode = "
          "\"full\" or ac_offloading = \"None\"");
  }
  if (m.trust_remote_code)
    c.refuse("model.trust_remote_code", "remote model code cannot run in a C++ trainer");
  if (m.optimization_dtype != Dtype::float32)
    c.refuse("model.optimization_dtype", "masters are always FP32 in primecfg-train; set \"float32\"");
  if (m.impl == ModelImpl::hf || m.impl == ModelImpl::liger_kernel)
    c.refuse("model.impl", "only the built-in (custom) model implementation exists in primecfg-train");
  // auto picks the best kernel there is: for primecfg-train that is SDPA.
  if (m.attn == Attention::eager || m.attn == Attention::flash_attention_3 ||
      m.attn == Attention::flash_attention_4)
    c.refuse("model.attn",
             "primecfg-train uses scaled_dot_product_attention; set attn = \"sdpa\" or \"auto\"");
  // The same exact attention, by another kernel: said, since the user named a kernel.
  if (m.attn == Attention::flash_attention_2)
    c.note("model.attn",
           "runs as scaled_dot_product_attention (its flash kernel on CUDA where it applies); the "
           "results are those of exact attention either way");
  if (m.ep_comm_backend != EpCommBackend::torch)
    c.refuse("model.ep_comm_backend", "DeepEP " + not_impl + "; set ep_comm_backend = \"torch\"");
  if (m.moe_fused_kernel)
    c.refuse("model.moe_fused_kernel", "the fused MoE kernel " + not_impl + "; set false");
  if (m.index_cache) c.refuse("model.index_cache", "sparse attention " + not_impl);
  if (m.conversion_dir) c.refuse("model.conversion_dir", "checkpoint conversion " + not_impl);
  if (m.compile && c.explicitly_set("model.compile"))
    c.refuse("model.compile", "torch.compile does not exist in LibTorch; set compile = \"None\"");
  if (m.seq_len) {
    const std::int64_t data_len = cfg.seq_len();
    if (*m.seq_len != data_len)
      c.refuse(
          "model.seq_len",
          fmt::format("differs from data.seq_len = {}; the SFT trainer packs to data.seq_len", data_len));
  }

  if (const auto* d = std::get_if<SFTDataConfig>(&cfg.data)) {
    if (!d->path && d->name != SFTDataConfig{}.name)
      c.refuse("data.name",
               fmt::format("\"{}\" cannot be downloaded; primecfg-train generates \"{}\" itself, or "
                           "set data.path to a local JSONL file",
                           d->name, SFTDataConfig{}.name));
    const LossMaskConfig def{};
    const auto& lm = d->loss_mask;
    if (lm.system != def.system || lm.user != def.user || lm.assistant != def.assistant ||
        lm.tool != def.tool)
      c.refuse("data.loss_mask",
               "records are prompt/completion pairs (loss on the completion); role masks " + not_impl);
    for (const auto& [path, set] :
         {std::pair{refused_path("data.subsets"), d->subsets.has_value()},
          std::pair{refused_path("data.splits"), d->splits.has_value()},
          std::pair{refused_path("data.probabilities"), d->probabilities.has_value()}})
      if (set)
        c.refuse(path, "dataset subsets, splits and their interleaving " + not_impl +
                           " (the data is one JSONL file, data.path)");
  }
  if (const auto* f = std::get_if<FakeDataConfig>(&cfg.data)) {
    // SFT's [data] type = "fake", or a TrainerConfig's [data.fake] (refuse spells it so).
    if (f->seed != FakeDataConfig{}.seed)
      c.refuse("data.seed", "fake tokens come from a fixed generator here; a seed for them " + not_impl);
    if (f->generate_samples) c.refuse("data.generate_samples", "generated fake samples " + not_impl);
  }
  if (cfg.val) c.refuse("val", "validation during training " + not_impl + "; remove [val]");
  if (cfg.run.name || cfg.run.dir)
    c.refuse(cfg.run.dir ? refused_path("run.dir") : refused_path("run.name"),
             "primecfg-train writes into output_dir itself, not into the launcher's output_dir / run.dir; "
             "set output_dir to the run folder instead");
  if (cfg.log.json_logging)
    c.refuse("log.json_logging", "JSON logs " + not_impl + " (progress is plain text)");
  if (cfg.log.log_data) c.refuse("log.log_data", "logging the first data sample " + not_impl);
  if (!cfg.monitors.file)
    c.refuse("monitors.file", "primecfg-train always writes its metrics to <output_dir>/metrics.jsonl");
  else if (cfg.monitors.file->path != FileMonitorConfig{}.path)
    c.refuse("monitors.file.path",
             "primecfg-train writes its metrics to <output_dir>/metrics.jsonl; another path " + not_impl);

  if (cfg.monitors.wandb)
    c.refuse("monitors.wandb", "W&B logging " + not_impl + "; metrics go to metrics.jsonl");
  if (cfg.monitors.prime) c.refuse("monitors.prime", "platform logging " + not_impl);
  if (cfg.renderer.name != RendererConfig{}.name)
    c.refuse("renderer.name", "chat templates " + not_impl + " (records are plain prompt/completion text)");
  if (cfg.resume && !cfg.ckpt)
    c.error("resume", "resuming needs [ckpt] (the folder to resume from is ckpt.output_dir)");
  if (cfg.resume && cfg.resume->dir)
    c.refuse("resume.dir",
             "resuming from another folder " + not_impl + "; resume from ckpt.output_dir by step");
  if (cfg.ckpt) {
    if (cfg.ckpt->keep_interval) c.refuse("ckpt.keep_interval", "keeping every n-th checkpoint " + not_impl);
    if (cfg.ckpt->skip_progress)
      c.refuse("ckpt.skip_progress", "resuming without the step counters " + not_impl);
    if (cfg.ckpt->skip_dataloader)
      c.refuse("ckpt.skip_dataloader", "resuming without the data position " + not_impl);
  }
  if (cfg.tokenizer.name && *cfg.tokenizer.name != m.name)
    c.refuse("tokenizer.name",
             "records are tokenized before training, with the model's tokenizer "
             "(tools/tokenize_jsonl.py); a different tokenizer " +
                 not_impl);
  if (cfg.tokenizer.trust_remote_code.value_or(false))
    c.refuse("tokenizer.trust_remote_code", "remote tokenizer code cannot run in a C++ trainer");
  if (cfg.tokenizer.chat_template)
    c.refuse("tokenizer.chat_template",
             "chat templates are applied by tools/tokenize_jsonl.py, not the trainer");
  if (cfg.heartbeat) c.refuse("heartbeat", "the BetterStack heartbeat " + not_impl);
  if (cfg.trace_path) c.refuse("trace_path", "profiler traces " + not_impl);
  if (cfg.memory_profiler_path) c.refuse("memory_profiler_path", "memory profiles " + not_impl);
  if (cfg.matmul_precision != MatmulPrecision::high)
    c.refuse("matmul_precision", "only \"high\" (LibTorch's default FP32 matmuls) is implemented");
  if (cfg.dry_run) c.refuse("dry_run", "a launcher setting; primecfg-train --plan predicts without training");
  if (!cfg.env_vars.empty())
    c.refuse("env_vars", "setting environment variables " + not_impl + " (set them in the shell)");

  // The model: a preset or a local HF directory, judged here so that its errors come
  // with the others, at model.name's place (nothing is downloaded).
  try {
    (void)resolve_model(m.name);
  } catch (const model_config_error& e) {
    c.error("model.name", e.what());
  }
  if (std::holds_alternative<FakeDataConfig>(cfg.data) && !cfg.max_steps)
    c.error("max_steps", "fake data is endless; set max_steps");
  // Each rank runs whole micro-batches of the global batch.
  std::visit(
      [&](const auto& d) {
        const std::int64_t micro = d.micro_batch_size > 0 ? d.batch_size / d.micro_batch_size : 0;
        if (world > 1 && micro > 0 && micro % world != 0)
          c.error(
              "data.batch_size",
              fmt::format("data.batch_size = {} with data.micro_batch_size = {} makes {} micro-batches per "
                          "step, which {} ranks cannot share evenly; make batch_size a multiple of "
                          "micro_batch_size x {}",
                          d.batch_size, d.micro_batch_size, micro, world, world));
      },
      cfg.data);

  // Accepted so that prime-rl's configs load, but without effect in this trainer: said
  // once, where the user wrote them, so that no value is dropped without a word.
  for (const FieldDecision& f : decisions) {
    if (!f.alternative.empty() && f.alternative != alternative_of(cfg, f.path)) continue;
    const std::string_view why = world == 1 && !f.one_process.empty() ? f.one_process
                                 : f.decision == no_effect            ? f.why
                                                                      : std::string_view();
    const std::string path = c.spelled(f.path);
    if (!why.empty() && c.explicitly_set(path))
      c.note(path, fmt::format("has no effect in primecfg-train: {}", why));
  }
  // The launcher's sections are kept as written; present, they are noted whatever they hold.
  // A launcher_only entry without its member here throws on every call, so no test passes.
  auto present = [&](std::string_view section) {
    for (const auto& [name, value] :
         {std::pair{"eval", &cfg.eval}, std::pair{"inference", &cfg.inference},
          std::pair{"deployment", &cfg.deployment}, std::pair{"slurm", &cfg.slurm}})
      if (section == name) return value->has_value();
    throw std::logic_error(fmt::format("check_support: no launcher section \"{}\"", section));
  };
  for (const FieldDecision& f : decisions)
    if (f.decision == launcher_only && present(f.path))
      c.note(f.path, "read by the launcher, not by primecfg-train");
  return out;
}

std::vector<diagnostic> check_rl_only(const provenance_map& where) {
  std::vector<diagnostic> out;
  checker c(where, out);
  for (const FieldDecision& f : rl_only) {
    if (!c.explicitly_set(f.path)) continue;
    if (f.decision == refused)
      c.error(f.path,
              "an RL-trainer setting; primecfg-train trains a TrainerConfig on its [data.fake] and does "
              "not apply it");
    else
      c.note(f.path, fmt::format("has no effect in primecfg-train: {}", f.why));
  }
  return out;
}

SFTConfig from_trainer_config(const TrainerConfig& t) {
  SFTConfig s;
  s.model = t.model;
  s.tokenizer = t.tokenizer;
  s.data = *t.data.fake;
  s.optim = t.optim;
  s.scheduler = t.scheduler;
  s.ckpt = t.ckpt;
  s.resume = t.resume;
  s.log = t.log;
  s.monitors = t.monitors;
  s.max_steps = t.max_steps;
  s.output_dir = t.output_dir;
  s.matmul_precision = t.matmul_precision;
  s.memory_profiler_path = t.memory_profiler_path;
  s.trace_path = t.trace_path;
  s.gc = t.gc;
  s.dist_timeout_seconds = t.dist_timeout_seconds;
  s.heartbeat = t.heartbeat;
  s.env_vars = t.env_vars;
  return s;
}

}  // namespace primecfg::train
