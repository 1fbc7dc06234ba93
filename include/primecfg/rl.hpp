// RLConfig: the whole RL run. Only [trainer] (a TrainerConfig) is read here;
// the orchestrator, inference, deployment and slurm sections belong to other
// programs and are kept as opaque tables.
#pragma once

#include <primecfg/checkpoint.hpp>
#include <primecfg/describe.hpp>
#include <primecfg/monitor.hpp>
#include <primecfg/opaque.hpp>
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

  static constexpr auto fields() {
    return describe(field(&SharedModelConfig::name, "Model shared by trainer, orchestrator and inference."),
                    retired("optim_cpu_offload", "trainer.model.offload"),
                    retired("fsdp_cpu_offload", "trainer.model.offload"),
                    retired("full_offload", "trainer.model.offload"));
  }
};

struct RunConfig {
  std::optional<std::string> name = std::nullopt;

  static constexpr auto fields() { return describe(field(&RunConfig::name, "Name of the run.")); }
};

struct RLConfig {
  std::optional<std::int64_t> max_steps = std::nullopt;
  std::optional<std::int64_t> seq_len = std::nullopt;
  std::filesystem::path output_dir = "outputs";
  bool clean = false;
  SharedModelConfig model = {};
  std::optional<CheckpointConfig> ckpt = std::nullopt;
  std::optional<ResumeConfig> resume = std::nullopt;
  LogConfig log = {};
  MonitorsConfig monitors = {};
  std::map<std::string, std::string> env_vars = {};
  std::optional<WeightBroadcastConfig> weight_broadcast = std::nullopt;
  std::optional<RunConfig> run = std::nullopt;
  TrainerConfig trainer = {};
  std::optional<opaque_table> orchestrator = std::nullopt;
  std::optional<opaque_table> inference = std::nullopt;
  std::optional<opaque_table> deployment = std::nullopt;
  std::optional<opaque_table> slurm = std::nullopt;

  static constexpr auto fields() {
    using S = RLConfig;
    return describe(field(&S::max_steps, "Steps of the whole run (shared with [trainer]).", ge(0)),
                    field(&S::seq_len, "Sequence length (shared with [trainer.model]).", ge(1)),
                    field(&S::output_dir, "Folder of the whole run."),
                    field(&S::clean, "Delete output_dir before starting."),
                    field(&S::model, "The model every component loads."),
                    field(&S::ckpt, "Checkpointing of the whole run (shared with [trainer])."),
                    field(&S::resume, "Resume the whole run from a checkpoint."), field(&S::log, "Logging."),
                    field(&S::monitors, "Metric sinks (shared)."),
                    field(&S::env_vars, "Environment variables set in every process."),
                    field(&S::weight_broadcast, "Weight broadcast (shared with [trainer])."),
                    field(&S::run, "Run metadata."), field(&S::trainer, "The trainer."),
                    field(&S::orchestrator, "The orchestrator (not read here)."),
                    field(&S::inference, "Inference servers (not read here)."),
                    field(&S::deployment, "GPU placement (not read here)."),
                    field(&S::slurm, "SLURM submission (not read here)."));
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
    if (weight_broadcast) v.inherit_fields(trainer.weight_broadcast, *weight_broadcast);
  }
};

}  // namespace primecfg
