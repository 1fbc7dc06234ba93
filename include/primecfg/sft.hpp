// SFTConfig: the root of `primecfg-train` (supervised fine-tuning).
#pragma once

#include <primecfg/detail/cxx_version.hpp>  // first: C++20 or later

#include <primecfg/checkpoint.hpp>
#include <primecfg/data.hpp>
#include <primecfg/describe.hpp>
#include <primecfg/model.hpp>
#include <primecfg/monitor.hpp>
#include <primecfg/opaque.hpp>
#include <primecfg/optim.hpp>
#include <primecfg/rules.hpp>
#include <primecfg/scheduler.hpp>
#include <primecfg/trainer.hpp>
#include <primecfg/validate.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <variant>

namespace primecfg {

struct RendererConfig {
  std::string name = "auto";

  static constexpr auto fields() {
    return describe(field(&RendererConfig::name, "Chat template renderer; auto picks one from the model."));
  }
};

// [val]: prime-rl's SFTValConfig, validation on held-out data during training.
struct SFTValConfig {
  std::int64_t interval = 50;
  bool eval_on_start = false;
  SFTDataConfig data = {};

  static constexpr auto fields() {
    using S = SFTValConfig;
    return describe(field(&S::interval, "Validate every interval training steps.", ge(1)),
                    field(&S::eval_on_start, "Validate once before the first training step."),
                    field(&S::data, "Validation data (an sft data table).", required));
  }
};

struct SFTConfig {
  ModelConfig model = {};
  TokenizerConfig tokenizer = {};
  SFTDataSource data = SFTDataConfig{};
  std::optional<SFTValConfig> val = std::nullopt;
  OptimizerConfig optim = AdamWConfig{};
  SchedulerConfig scheduler = ConstantSchedulerConfig{};
  std::optional<CheckpointConfig> ckpt = std::nullopt;
  std::optional<ResumeConfig> resume = std::nullopt;
  std::optional<WeightBroadcastConfig> weight_broadcast = std::nullopt;
  LogConfig log = {};
  MonitorsConfig monitors = {};
  RunConfig run = {};
  RendererConfig renderer = {};
  std::optional<std::int64_t> max_steps = std::nullopt;
  std::filesystem::path output_dir = "outputs";
  bool clean = false;
  MatmulPrecision matmul_precision = MatmulPrecision::high;
  std::optional<std::filesystem::path> memory_profiler_path = std::nullopt;
  std::optional<std::filesystem::path> trace_path = std::nullopt;
  std::optional<GCConfig> gc = GCConfig{};
  bool dry_run = false;
  std::int64_t dist_timeout_seconds = 3600;
  std::optional<HeartbeatConfig> heartbeat = std::nullopt;
  std::map<std::string, std::string> env_vars = {};
  std::optional<opaque_table> eval = std::nullopt;
  std::optional<opaque_table> inference = std::nullopt;
  std::optional<opaque_table> deployment = std::nullopt;
  std::optional<opaque_table> slurm = std::nullopt;

  // The packed length of a sample, whichever data source [data] holds.
  std::int64_t seq_len() const {
    return std::visit([](const auto& d) -> std::int64_t { return d.seq_len; }, data);
  }

  static constexpr auto fields() {
    using S = SFTConfig;
    return describe(
        field(&S::model, "The model and its memory layout."),
        field(&S::tokenizer, "The tokenizer (the model's by default)."),
        field(&S::data, "Training data (tagged union on type: sft or fake)."),
        field(&S::val, "Validation during training; \"None\": none."),
        field(&S::optim, "Optimizer (tagged union on type)."),
        field(&S::scheduler, "Learning-rate schedule (tagged union on type)."),
        field(&S::ckpt, "Checkpointing; an empty table enables it with defaults."),
        field(&S::resume, "Resume from a checkpoint; an empty table takes the newest."),
        field(&S::weight_broadcast,
              "Weights to the inference server of online evals; \"None\": chosen by the launcher."),
        field(&S::log, "Logging."), field(&S::monitors, "Metric sinks."),
        field(&S::run, "Run metadata; the launcher's run folder is output_dir / run.dir."),
        field(&S::renderer, "Chat template rendering."),
        field(&S::max_steps, "Optimizer steps to run; \"None\" runs one epoch.", ge(0)),
        field(&S::output_dir, "Folder for metrics, the resolved config and checkpoints."),
        field(&S::clean, "Delete the run folder before starting."),
        field(&S::matmul_precision, "Precision of float32 matmuls (high allows TF32)."),
        field(&S::memory_profiler_path, "Write a memory profile here."),
        field(&S::trace_path, "Write a profiler trace here (needs max_steps < 10)."),
        field(&S::gc, "Deterministic garbage collection; \"None\" keeps Python's default."),
        field(&S::dry_run, "Validate and write the resolved config, then stop (launcher)."),
        field(&S::dist_timeout_seconds, "Timeout of collective operations, seconds.", ge(1)),
        field(&S::heartbeat, "BetterStack heartbeat of training progress."),
        field(&S::env_vars, "Environment variables set in every process."),
        field(&S::eval, "Online evaluation (read by the launcher, not the trainer)."),
        field(&S::inference, "Inference servers (read by the launcher)."),
        field(&S::deployment, "GPU placement (read by the launcher)."),
        field(&S::slurm, "SLURM submission (read by the launcher)."));
  }

  static void extend_schema(toml::table& schema) { rules::full_offload_schema(schema); }

  void validate(validation& v) {
    rules::full_offload_optimizer(v, model, optim);
    rules::trainer_rules(v, model, optim);
    rules::scheduler_fits(v, scheduler, max_steps);
    rules::scheduler_below_lr(v, scheduler, optim);
    rules::resume_fits(v, resume, max_steps);
    rules::data_path_replaces_name(v, data);
    rules::no_protected_env_vars(v, env_vars);
    rules::trace_fits(v, trace_path, max_steps);
    auto data_rules = [&](const auto& d) {
      rules::micro_batches_divide(v, d);
      // prime-rl's validate_cp_seq_len, validate_cp_micro_batch_size, validate_vlm_constraints.
      if (model.cp > 1 && d.seq_len % model.cp != 0)
        v.error(d.seq_len,
                fmt::format("must be a multiple of the context-parallel degree model.cp = {}", model.cp));
      if (model.cp > 1 && d.micro_batch_size != 1)
        v.error(d.micro_batch_size,
                fmt::format("must be 1 with context parallelism (model.cp = {})", model.cp));
      if (model.vlm && d.micro_batch_size != 1)
        v.error(d.micro_batch_size, "must be 1 for vision-language SFT (model.vlm)");
    };
    std::visit(data_rules, data);
    if (val) data_rules(val->data);
    // prime-rl's auto_setup_online_eval: the weight transport of online evals.
    if (eval && weight_broadcast && weight_broadcast->type == WeightBroadcastType::nixl)
      v.error(weight_broadcast->type,
              "NIXL is not supported for SFT online evals; use \"nccl\" or \"filesystem\"");
    if (eval && weight_broadcast && model.lora && weight_broadcast->type != WeightBroadcastType::filesystem)
      v.error(weight_broadcast->type,
              "LoRA needs weight_broadcast.type = \"filesystem\" (in-memory broadcast has no LoRA yet)");
    // prime-rl's auto_setup_run_identity: an unnamed W&B run is named run.name.
    if (run.name && monitors.wandb && !monitors.wandb->name && !v.is_set(monitors.wandb->name))
      v.inherit(monitors.wandb->name, run.name);
  }
};

}  // namespace primecfg
