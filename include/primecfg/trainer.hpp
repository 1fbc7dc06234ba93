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
#include <optional>

namespace primecfg {

enum class WeightBroadcastType { filesystem, nccl };

struct WeightBroadcastConfig {
  WeightBroadcastType type = WeightBroadcastType::filesystem;
  std::int64_t port = 29501;
  std::int64_t timeout = 1200;
  bool quantize_in_weight_transfer = false;

  static constexpr auto fields() {
    using S = WeightBroadcastConfig;
    return describe(field(&S::type, "How new weights reach the inference servers."),
                    field(&S::port, "TCP port of the NCCL broadcast.", ge(1), le(65535)),
                    field(&S::timeout, "Seconds to wait for a broadcast.", ge(1)),
                    field(&S::quantize_in_weight_transfer, "Send quantized weights."));
  }
};

struct TrainerConfig {
  ModelConfig model = {};
  TrainerDataConfig data = {};
  OptimizerConfig optim = AdamWConfig{};
  SchedulerConfig scheduler = ConstantSchedulerConfig{};
  std::optional<CheckpointConfig> ckpt = std::nullopt;
  WeightBroadcastConfig weight_broadcast = {};
  LogConfig log = {};
  MonitorsConfig monitors = {};
  std::optional<std::int64_t> max_steps = std::nullopt;
  std::filesystem::path output_dir = "outputs";
  std::int64_t dist_timeout_seconds = 600;
  bool enable_router_replay = false;
  bool enable_token_export = false;

  static constexpr auto fields() {
    using S = TrainerConfig;
    return describe(field(&S::model, "The model and its memory layout."), field(&S::data, "Training data."),
                    field(&S::optim, "Optimizer (tagged union on type)."),
                    field(&S::scheduler, "Learning-rate schedule (tagged union on type)."),
                    field(&S::ckpt, "Checkpointing; an empty table enables it with defaults."),
                    field(&S::weight_broadcast, "Sending new weights to inference."),
                    field(&S::log, "Logging."), field(&S::monitors, "Metric sinks."),
                    field(&S::max_steps, "Optimizer steps to run; \"None\" runs until stopped.", ge(0)),
                    field(&S::output_dir, "Folder for metrics, the resolved config and checkpoints."),
                    field(&S::dist_timeout_seconds, "Timeout of collective operations.", ge(1)),
                    field(&S::enable_router_replay, "Replay MoE routing decisions from inference."),
                    field(&S::enable_token_export, "Export trained tokens for inspection."));
  }

  static void extend_schema(toml::table& schema) { rules::full_offload_schema(schema); }

  void validate(validation& v) {
    rules::full_offload_optimizer(v, model, optim);
    rules::scheduler_fits(v, scheduler, max_steps);
    if (data.fake) rules::micro_batches_divide(v, *data.fake);
  }
};

}  // namespace primecfg
