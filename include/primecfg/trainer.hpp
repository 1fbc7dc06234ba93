// TrainerConfig: the root of `primecfg-train` as an RL trainer, and the
// [trainer] section of an RLConfig.
#pragma once

#include <primecfg/checkpoint.hpp>
#include <primecfg/data.hpp>
#include <primecfg/describe.hpp>
#include <primecfg/model.hpp>
#include <primecfg/monitor.hpp>
#include <primecfg/optim.hpp>
#include <primecfg/rules.hpp>
#include <primecfg/scheduler.hpp>
#include <primecfg/validate.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

namespace primecfg {

enum class WeightBroadcastType { filesystem, nccl };
enum class MatmulPrecision { highest, high, medium };

struct WeightBroadcastConfig {
  WeightBroadcastType type = WeightBroadcastType::filesystem;
  std::string host = "localhost";
  std::int64_t port = 29501;
  std::int64_t timeout = 1200;
  std::int64_t inference_world_size = 1;
  bool quantize_in_weight_transfer = false;

  static constexpr auto fields() {
    using S = WeightBroadcastConfig;
    return describe(field(&S::type, "How new weights reach the inference servers."),
                    field(&S::host, "Host of the NCCL broadcast rendezvous."),
                    field(&S::port, "TCP port of the NCCL broadcast.", ge(1), le(65535)),
                    field(&S::timeout, "Seconds to wait for a broadcast.", ge(1)),
                    field(&S::inference_world_size, "Inference workers that receive the broadcast.", ge(1)),
                    field(&S::quantize_in_weight_transfer, "Send quantized weights."));
  }
};

// Deterministic garbage collection: every rank collects at the same steps.
struct GCConfig {
  std::int64_t interval = 50;

  static constexpr auto fields() {
    return describe(field(&GCConfig::interval, "Collect garbage every interval steps.", ge(1)));
  }
};

struct TrainerConfig {
  ModelConfig model = {};
  TrainerDataConfig data = {};
  OptimizerConfig optim = AdamWConfig{};
  SchedulerConfig scheduler = ConstantSchedulerConfig{};
  std::optional<CheckpointConfig> ckpt = std::nullopt;
  std::optional<ResumeConfig> resume = std::nullopt;
  WeightBroadcastConfig weight_broadcast = {};
  LogConfig log = {};
  MonitorsConfig monitors = {};
  std::optional<std::int64_t> max_steps = std::nullopt;
  std::filesystem::path output_dir = "outputs";
  MatmulPrecision matmul_precision = MatmulPrecision::high;
  std::optional<std::filesystem::path> memory_profiler_path = std::nullopt;
  std::optional<std::filesystem::path> trace_path = std::nullopt;
  std::optional<GCConfig> gc = GCConfig{};
  std::int64_t dist_timeout_seconds = 3600;
  bool enable_router_replay = false;
  bool enable_token_export = false;
  std::map<std::string, std::string> env_vars = {};

  static constexpr auto fields() {
    using S = TrainerConfig;
    return describe(field(&S::model, "The model and its memory layout."), field(&S::data, "Training data."),
                    field(&S::optim, "Optimizer (tagged union on type)."),
                    field(&S::scheduler, "Learning-rate schedule (tagged union on type)."),
                    field(&S::ckpt, "Checkpointing; an empty table enables it with defaults."),
                    field(&S::resume, "Resume from a checkpoint; an empty table takes the newest."),
                    field(&S::weight_broadcast, "Sending new weights to inference."),
                    field(&S::log, "Logging."), field(&S::monitors, "Metric sinks."),
                    field(&S::max_steps, "Optimizer steps to run; \"None\" runs until stopped.", ge(0)),
                    field(&S::output_dir, "Folder for metrics, the resolved config and checkpoints."),
                    field(&S::matmul_precision, "Precision of float32 matmuls (high allows TF32)."),
                    field(&S::memory_profiler_path, "Write a memory profile here."),
                    field(&S::trace_path, "Write a profiler trace here (needs max_steps < 10)."),
                    field(&S::gc, "Deterministic garbage collection; \"None\" keeps Python's default."),
                    field(&S::dist_timeout_seconds, "Timeout of collective operations, seconds.", ge(1)),
                    field(&S::enable_router_replay, "Replay MoE routing decisions from inference."),
                    field(&S::enable_token_export, "Export trained tokens for inspection."),
                    field(&S::env_vars, "Environment variables set in the trainer processes."));
  }

  static void extend_schema(toml::table& schema) { rules::full_offload_schema(schema); }

  void validate(validation& v) {
    rules::full_offload_optimizer(v, model, optim);
    rules::trainer_rules(v, model, optim);
    rules::scheduler_fits(v, scheduler, max_steps);
    rules::scheduler_below_lr(v, scheduler, optim);
    rules::resume_fits(v, resume, max_steps);
    rules::trace_fits(v, trace_path, max_steps);
    if (data.fake) rules::micro_batches_divide(v, *data.fake);
    if (model.lora && weight_broadcast.type != WeightBroadcastType::filesystem)
      v.error(weight_broadcast.type,
              "LoRA needs weight_broadcast.type = \"filesystem\" (in-memory broadcast has no LoRA yet)");
    if (enable_router_replay && !rules::custom_or_auto(model.impl))
      v.error(enable_router_replay, "router replay needs model.impl = \"custom\" or \"auto\"");
  }
};

}  // namespace primecfg
