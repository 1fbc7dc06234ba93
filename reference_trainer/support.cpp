#include "support.hpp"

#include "model/config.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <system_error>

namespace primecfg::train {

namespace {

class checker {
 public:
  checker(const provenance_map& where, std::vector<diagnostic>& out) : where_(where), out_(out) {}

  // Where a field (or, for a table, its first key) was set; default when nowhere.
  provenance source(const std::string& path) const {
    if (auto it = where_.find(path); it != where_.end()) return it->second;
    auto it = where_.lower_bound(path + ".");
    if (it != where_.end() && it->first.rfind(path + ".", 0) == 0) return it->second;
    return {};
  }
  bool explicitly_set(const std::string& path) const { return !source(path).is_default(); }

  void error(const std::string& path, std::string message) { add(severity::error, path, std::move(message)); }
  void note(const std::string& path, std::string message) { add(severity::note, path, std::move(message)); }

 private:
  void add(severity s, const std::string& path, std::string message) {
    diagnostic d;
    d.level = s;
    d.kind = error_kind::value_error;
    d.path = path;
    d.where = source(path);
    d.message = std::move(message);
    out_.push_back(std::move(d));
  }
  const provenance_map& where_;
  std::vector<diagnostic>& out_;
};

}  // namespace

std::vector<diagnostic> check_support(const SFTConfig& cfg, const provenance_map& where, int world) {
  std::vector<diagnostic> out;
  checker c(where, out);
  const auto& m = cfg.model;
  const std::string not_impl = "is not implemented by primecfg-train";

  if (m.cp > 1)
    c.error("model.cp", fmt::format("context parallelism (cp = {}) {}; set cp = 1", m.cp, not_impl));
  // ep = "auto" picks the degree from the experts there are: none here, so 1.
  if (m.ep.is_number() && m.ep.number() > 1)
    c.error("model.ep", fmt::format("expert parallelism (ep = {}) {}; set ep = 1", m.ep.number(), not_impl));
  if (m.dp_replicate > 1)
    c.error("model.dp_replicate",
            fmt::format("HSDP replication (dp_replicate = {}) {}", m.dp_replicate, not_impl));
  if (m.lora) c.error("model.lora", "LoRA " + not_impl + "; remove [model.lora]");
  if (m.quantization) c.error("model.quantization", "quantized training " + not_impl);
  if (m.vlm)
    c.error("model.vlm", "vision-language models are " + std::string("not supported by primecfg-train"));
  if (m.ac_offloading) c.error("model.ac_offloading", "activation offloading " + not_impl);
  if (m.ac && m.ac->mode == AcMode::selective)
    c.error("model.ac.mode", "selective activation checkpointing " + not_impl + "; use mode = \"full\"");
  if (m.trust_remote_code)
    c.error("model.trust_remote_code", "remote model code cannot run in a C++ trainer");
  if (m.optimization_dtype != Dtype::float32)
    c.error("model.optimization_dtype", "masters are always FP32 in primecfg-train; set \"float32\"");
  if (m.impl == ModelImpl::hf || m.impl == ModelImpl::liger_kernel)
    c.error("model.impl", "only the built-in (custom) model implementation exists in primecfg-train");
  // auto picks the best kernel there is: for primecfg-train that is SDPA.
  if (m.attn == Attention::eager || m.attn == Attention::flash_attention_3 ||
      m.attn == Attention::flash_attention_4)
    c.error("model.attn",
            "primecfg-train uses scaled_dot_product_attention; set attn = \"sdpa\" or \"auto\"");
  if (m.ep_comm_backend != EpCommBackend::torch)
    c.error("model.ep_comm_backend", "there are no experts in primecfg-train (DeepEP)");
  if (m.moe_fused_kernel || m.freeze_moe_router || m.moe_router_dtype != Dtype::float32)
    c.error(m.moe_fused_kernel    ? "model.moe_fused_kernel"
            : m.freeze_moe_router ? "model.freeze_moe_router"
                                  : "model.moe_router_dtype",
            "there is no MoE routing in primecfg-train");
  if (m.index_cache) c.error("model.index_cache", "sparse attention " + not_impl);
  if (m.conversion_dir) c.error("model.conversion_dir", "checkpoint conversion " + not_impl);
  if (m.debug && m.debug->force_balanced_routing)
    c.error("model.debug.force_balanced_routing", "there is no MoE routing in primecfg-train");
  if (m.compile && c.explicitly_set("model.compile"))
    c.error("model.compile", "torch.compile does not exist in LibTorch; set compile = \"None\"");
  if (m.seq_len) {
    auto data_len = std::visit([](const auto& d) { return d.seq_len; }, cfg.data);
    if (*m.seq_len != data_len)
      c.error("model.seq_len",
              fmt::format("differs from data.seq_len = {}; the SFT trainer packs to data.seq_len", data_len));
  }

  if (const auto* d = std::get_if<SFTDataConfig>(&cfg.data)) {
    if (!d->path && d->name != SFTDataConfig{}.name)
      c.error("data.name",
              fmt::format("\"{}\" cannot be downloaded; primecfg-train generates \"{}\" itself, or "
                          "set data.path to a local JSONL file",
                          d->name, SFTDataConfig{}.name));
    const LossMaskConfig def{};
    const auto& lm = d->loss_mask;
    if (lm.system != def.system || lm.user != def.user || lm.assistant != def.assistant ||
        lm.tool != def.tool)
      c.error("data.loss_mask",
              "records are prompt/completion pairs (loss on the completion); role masks " + not_impl);
    for (const auto& [path, set] :
         {std::pair{"data.subsets", d->subsets.has_value()}, std::pair{"data.splits", d->splits.has_value()},
          std::pair{"data.probabilities", d->probabilities.has_value()}})
      if (set)
        c.error(path, "dataset subsets, splits and their interleaving " + not_impl +
                          " (the data is one JSONL file, data.path)");
  }
  if (const auto* f = std::get_if<FakeDataConfig>(&cfg.data)) {
    // SFT's [data] type = "fake", or a TrainerConfig's [data.fake].
    const std::string prefix = c.explicitly_set("data.fake") ? "data.fake." : "data.";
    if (f->seed != FakeDataConfig{}.seed)
      c.error(prefix + "seed", "fake tokens come from a fixed generator here; a seed for them " + not_impl);
    if (f->generate_samples) c.error(prefix + "generate_samples", "generated fake samples " + not_impl);
  }
  if (cfg.val) c.error("val", "validation during training " + not_impl + "; remove [val]");
  if (cfg.run.name || cfg.run.dir)
    c.error(cfg.run.dir ? "run.dir" : "run.name",
            "primecfg-train writes into output_dir itself, not into the launcher's output_dir / run.dir; "
            "set output_dir to the run folder instead");
  if (cfg.log.json_logging)
    c.error("log.json_logging", "JSON logs " + not_impl + " (progress is plain text)");
  if (cfg.log.log_data) c.error("log.log_data", "logging the first data sample " + not_impl);
  if (!cfg.monitors.file)
    c.error("monitors.file", "primecfg-train always writes its metrics to <output_dir>/metrics.jsonl");
  else if (cfg.monitors.file->path != FileMonitorConfig{}.path)
    c.error("monitors.file.path",
            "primecfg-train writes its metrics to <output_dir>/metrics.jsonl; another path " + not_impl);

  if (cfg.monitors.wandb)
    c.error("monitors.wandb", "W&B logging " + not_impl + "; metrics go to metrics.jsonl");
  if (cfg.monitors.prime) c.error("monitors.prime", "platform logging " + not_impl);
  if (cfg.renderer.name != RendererConfig{}.name)
    c.error("renderer.name", "chat templates " + not_impl + " (records are plain prompt/completion text)");
  if (cfg.resume && !cfg.ckpt)
    c.error("resume", "resuming needs [ckpt] (the folder to resume from is ckpt.output_dir)");
  if (cfg.resume && cfg.resume->dir)
    c.error("resume.dir",
            "resuming from another folder " + not_impl + "; resume from ckpt.output_dir by step");
  if (cfg.ckpt) {
    if (cfg.ckpt->keep_interval) c.error("ckpt.keep_interval", "keeping every n-th checkpoint " + not_impl);
    if (cfg.ckpt->skip_progress)
      c.error("ckpt.skip_progress", "resuming without the step counters " + not_impl);
    if (cfg.ckpt->skip_dataloader)
      c.error("ckpt.skip_dataloader", "resuming without the data position " + not_impl);
  }
  if (cfg.tokenizer.name && *cfg.tokenizer.name != m.name)
    c.error("tokenizer.name",
            "records are tokenized before training, with the model's tokenizer "
            "(tools/tokenize_jsonl.py); a different tokenizer " +
                not_impl);
  if (cfg.tokenizer.trust_remote_code.value_or(false))
    c.error("tokenizer.trust_remote_code", "remote tokenizer code cannot run in a C++ trainer");
  if (cfg.tokenizer.chat_template)
    c.error("tokenizer.chat_template",
            "chat templates are applied by tools/tokenize_jsonl.py, not the trainer");
  if (cfg.heartbeat) c.error("heartbeat", "the BetterStack heartbeat " + not_impl);
  if (cfg.trace_path) c.error("trace_path", "profiler traces " + not_impl);
  if (cfg.memory_profiler_path) c.error("memory_profiler_path", "memory profiles " + not_impl);
  if (cfg.matmul_precision != MatmulPrecision::high)
    c.error("matmul_precision", "only \"high\" (LibTorch's default FP32 matmuls) is implemented");
  if (cfg.dry_run) c.error("dry_run", "a launcher setting; primecfg-train --plan predicts without training");
  if (!cfg.env_vars.empty())
    c.error("env_vars", "setting environment variables " + not_impl + " (set them in the shell)");

  // The model: a preset or a local HF directory, judged here so that its errors come
  // with the others, at model.name's place (nothing is downloaded).
  if (!preset(m.name)) {
    const std::filesystem::path dir(m.name);
    std::error_code ec;
    if (!std::filesystem::exists(dir / "config.json", ec)) {
      c.error("model.name",
              fmt::format("\"{}\" is neither a preset ({}) nor a local directory with config.json "
                          "(nothing is downloaded; download it, e.g. `hf download {} --local-dir "
                          "DIR`, and set model.name = DIR)",
                          m.name, fmt::join(preset_names(), ", "), m.name));
    } else {
      try {
        (void)read_hf_config(dir / "config.json");
      } catch (const std::exception& e) {
        c.error("model.name", e.what());
      }
    }
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
  const bool one = world == 1;
  const std::pair<const char*, const char*> no_effect[] = {
      {"model.reduce_dtype", one ? "one process: no gradient is reduced across ranks" : nullptr},
      {"model.reshard_after_forward", "there is no FSDP; weights stay whole on the device"},
      {"model.cp_style", "context parallelism is not implemented"},
      {"model.deepep_num_sms", "there are no experts"},
      {"model.deepep_token_chunk_size", "there are no experts"},
      {"model.moe_use_grouped_mm", "there are no experts"},
      {"model.compile.fullgraph", "there is no torch.compile in LibTorch"},
      {"dist_timeout_seconds", one ? "one process: there are no collectives to time out" : nullptr},
      {"gc", "Python's garbage collector does not run here"},
      {"log.level", "primecfg-train prints progress and errors only"},
      {"log.vf_level", "the verifiers package does not run here"},
      {"log.interval", "primecfg-train prints one line per step"},
      {"log.ranks_filter", one ? "one process: its output is always shown" : "rank 0 reports for every rank"},
      {"data.num_workers", "data is prepared in the training process"},
      {"data.stopping_strategy", "it applies only to interleaved subsets or splits"},
      {"weight_broadcast", "weights go to the inference server of online evals, which the launcher runs"},
      {"renderer", "records are tokenized before training (tools/tokenize_jsonl.py)"},
  };
  for (const auto& [path, why] : no_effect)
    if (why && c.explicitly_set(path)) c.note(path, fmt::format("has no effect in primecfg-train: {}", why));

  for (const char* section : {"eval", "inference", "deployment", "slurm"}) {
    bool present = (std::string_view(section) == "eval" && cfg.eval) ||
                   (std::string_view(section) == "inference" && cfg.inference) ||
                   (std::string_view(section) == "deployment" && cfg.deployment) ||
                   (std::string_view(section) == "slurm" && cfg.slurm);
    if (present) c.note(section, "read by the launcher, not by primecfg-train");
  }
  return out;
}

std::vector<diagnostic> check_rl_only(const provenance_map& where) {
  std::vector<diagnostic> out;
  checker c(where, out);
  for (const char* path :
       {"loss", "weight_broadcast", "metrics_server", "enable_router_replay", "enable_token_export"})
    if (c.explicitly_set(path))
      c.error(path,
              "an RL-trainer setting; primecfg-train trains a TrainerConfig on its [data.fake] and does "
              "not apply it");
  // Rollouts never arrive when training on [data.fake], in prime-rl as here.
  if (c.explicitly_set("rollout_transport"))
    c.note("rollout_transport",
           "has no effect in primecfg-train: it trains on [data.fake], no rollouts arrive");
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
