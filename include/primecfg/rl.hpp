// RLConfig: the whole RL run. Only [trainer] (a TrainerConfig) is read here;
// the orchestrator, inference, deployment and slurm sections belong to other
// programs and are kept as opaque tables.
#pragma once

#include <primecfg/detail/cxx_version.hpp>  // first: C++20 or later

#include <primecfg/checkpoint.hpp>
#include <primecfg/describe.hpp>
#include <primecfg/monitor.hpp>
#include <primecfg/opaque.hpp>
#include <primecfg/rules.hpp>
#include <primecfg/trainer.hpp>
#include <primecfg/validate.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

namespace primecfg {

// The top-level [model] of an RL run names the model every component loads.
struct SharedModelConfig {
  std::string name = "Qwen/Qwen3-0.6B";
  std::optional<VlmConfig> vlm = std::nullopt;

  static constexpr auto fields() {
    return describe(
        field(&SharedModelConfig::name, "Model shared by trainer, orchestrator and inference."),
        field(&SharedModelConfig::vlm, "Vision-language settings shared with [trainer.model.vlm]."),
        retired("optim_cpu_offload", "trainer.model.offload"),
        retired("fsdp_cpu_offload", "trainer.model.offload"),
        retired("full_offload", "trainer.model.offload"));
  }
};

struct RLConfig {
  std::optional<std::int64_t> max_steps = std::nullopt;
  std::optional<std::int64_t> seq_len = std::nullopt;
  std::filesystem::path output_dir = "outputs";
  bool clean = false;
  SharedModelConfig model = {};
  std::optional<CheckpointConfig> ckpt = std::nullopt;
  std::optional<ResumeConfig> resume = std::nullopt;
  SharedLogConfig log = {};
  SharedMonitorsConfig monitors = {};
  std::map<std::string, std::string> env_vars = {};
  std::optional<WeightBroadcastConfig> weight_broadcast = std::nullopt;
  std::optional<TransportConfig> rollout_transport = std::nullopt;
  std::optional<TokenizerConfig> tokenizer = std::nullopt;
  RunConfig run = {};
  TrainerConfig trainer = {};
  std::optional<opaque_table> orchestrator = std::nullopt;
  std::optional<opaque_table> inference = std::nullopt;
  std::optional<opaque_table> deployment = std::nullopt;
  std::optional<opaque_table> slurm = std::nullopt;
  bool dry_run = false;

  static constexpr auto fields() {
    using S = RLConfig;
    return describe(
        field(&S::max_steps, "Steps of the whole run (shared with [trainer]).", ge(0)),
        field(&S::seq_len, "Sequence length (shared with [trainer.model]).", ge(1)),
        field(&S::output_dir,
              "Folder that groups runs; this run writes to output_dir / run.dir (shared with "
              "[trainer])."),
        field(&S::clean, "Delete the run folder (output_dir / run.dir) before starting."),
        field(&S::model, "The model every component loads."),
        field(&S::ckpt, "Checkpointing of the whole run (shared with [trainer])."),
        field(&S::resume, "Resume the whole run from a checkpoint."),
        field(&S::log, "Logging (shared with [trainer.log])."),
        field(&S::monitors, "Metric sinks (wandb and file shared with [trainer.monitors])."),
        field(&S::env_vars, "Environment variables set in every process."),
        field(&S::weight_broadcast, "Weight broadcast (shared with [trainer])."),
        field(&S::rollout_transport,
              "Rollout transport (shared with [trainer.rollout_transport]); \"None\": the trainer's."),
        field(&S::tokenizer, "Tokenizer of every component (shared with [trainer.tokenizer])."),
        field(&S::run, "Run metadata."), field(&S::trainer, "The trainer."),
        field(&S::orchestrator, "The orchestrator (not read here)."),
        field(&S::inference, "Inference servers (not read here)."),
        field(&S::deployment, "GPU placement (not read here)."),
        field(&S::slurm, "SLURM submission (not read here)."),
        field(&S::dry_run, "Validate and write the resolved configs, then stop (launcher)."));
  }

  // Shared settings flow into [trainer] unless it sets them itself, the way
  // prime-rl's launcher shares them; a different explicit value is an error.
  // This runs before every validate(), so the trainer's own rules (the
  // scheduler against max_steps, ...) see the shared values.
  void share(validation& v) {
    if (max_steps) v.inherit(trainer.max_steps, max_steps);
    if (seq_len) v.inherit(trainer.model.seq_len, seq_len);
    v.inherit_fields(trainer.model.name, model.name);
    if (ckpt)
      if (CheckpointConfig* target = v.engage(trainer.ckpt, ckpt)) v.inherit_fields(*target, *ckpt);
    if (resume)
      if (ResumeConfig* target = v.engage(trainer.resume, resume)) v.inherit_fields(*target, *resume);
    if (model.vlm)
      if (VlmConfig* target = v.engage(trainer.model.vlm, model.vlm)) v.inherit_fields(*target, *model.vlm);
    if (weight_broadcast) {
      v.inherit_fields(trainer.weight_broadcast, *weight_broadcast);
    } else if (inference && !trainer.model.lora && !v.is_set(trainer.weight_broadcast.type)) {
      // prime-rl's auto_setup_weight_broadcast: NCCL when an inference server is launched.
      v.require_value(
          trainer.weight_broadcast.type, WeightBroadcastType::nccl,
          "an RL run with [inference] and no [weight_broadcast] broadcasts over NCCL (as prime-rl)");
    }
    // prime-rl's propagate_shared_fields: [tokenizer], [log], [rollout_transport],
    // [monitors.wandb] and [monitors.file].
    if (tokenizer) v.inherit_fields(trainer.tokenizer, *tokenizer);
    if (log.level) v.inherit(trainer.log.level, *log.level);
    if (v.is_set(log.json_logging)) v.inherit(trainer.log.json_logging, log.json_logging);
    if (rollout_transport) v.inherit(trainer.rollout_transport, *rollout_transport);
    if (monitors.file) {
      if (FileMonitorConfig* target = v.engage(trainer.monitors.file, monitors.file))
        v.inherit_fields(*target, *monitors.file);
    } else if (v.is_set(monitors.file)) {
      // monitors.file = "None" turns the trainer's file off, unless it sets its own.
      v.inherit(trainer.monitors.file, monitors.file);
    }
    if (monitors.wandb) {
      if (WandbConfig* target = v.engage(trainer.monitors.wandb, monitors.wandb))
        v.inherit_fields(*target, *monitors.wandb);
    } else if (v.is_set(monitors.wandb) && trainer.monitors.wandb) {
      // prime-rl: monitors.wandb = "None" turns the trainer's off, and a trainer
      // W&B section without the orchestrator's is refused (validate_shared_wandb_config).
      v.error(trainer.monitors.wandb,
              "is set, but the shared monitors.wandb is \"None\"; remove one of the two");
    }
    share_run_dir(v);
  }

  // prime-rl's auto_setup_run_dir and auto_setup_run_identity: the trainer
  // writes to output_dir / run.dir (run.dir defaults to run.name), and its W&B
  // run is named run.name unless named otherwise. Without run.name the launcher
  // generates one, so the folder is not known here.
  void share_run_dir(validation& v) {
    const std::optional<std::string>& folder = run.dir ? run.dir : run.name;
    if (folder) {
      v.inherit(trainer.output_dir, output_dir / *folder, "output_dir / run.dir",
                run.dir ? run.dir : run.name);
    } else if (v.is_set(trainer.output_dir)) {
      v.error(trainer.output_dir,
              "is output_dir / run.dir under the rl entrypoint, and run.name is generated by the launcher; "
              "set output_dir and run.name instead");
    }
    if (run.name && trainer.monitors.wandb && !trainer.monitors.wandb->name &&
        !v.is_set(trainer.monitors.wandb->name))
      v.inherit(trainer.monitors.wandb->name, run.name);
  }

  void validate(validation& v) {
    rules::no_protected_env_vars(v, env_vars);
    // prime-rl's shared weight broadcast has no inference_world_size: the
    // launcher computes it from [inference].
    if (weight_broadcast && v.is_set(weight_broadcast->inference_world_size))
      v.error(weight_broadcast->inference_world_size,
              "is computed by the rl entrypoint from [inference]; set it in [trainer.weight_broadcast] if "
              "it must differ");
    // prime-rl's SharedWandbConfig.validate_not_offline.
    if (monitors.wandb && monitors.wandb->offline)
      v.error(monitors.wandb->offline,
              "the rl entrypoint always logs to one shared W&B run, which needs a server; set offline in "
              "[trainer.monitors.wandb] instead");
    // prime-rl's validate_quantize_in_weight_transfer.
    if (weight_broadcast && weight_broadcast->type == WeightBroadcastType::nccl &&
        weight_broadcast->quantize_in_weight_transfer) {
      if (!inference) v.error(weight_broadcast->quantize_in_weight_transfer, "needs an [inference] section");
      if (trainer.model.impl != ModelImpl::custom)
        v.error(weight_broadcast->quantize_in_weight_transfer, "needs trainer.model.impl = \"custom\"");
    }
  }
};

}  // namespace primecfg
