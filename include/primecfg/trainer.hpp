// TrainerConfig: the root of `primecfg-train` as an RL trainer, and the
// [trainer] section of an RLConfig.
#pragma once

#include <primecfg/checkpoint.hpp>
#include <primecfg/data.hpp>
#include <primecfg/describe.hpp>
#include <primecfg/model.hpp>
#include <primecfg/monitor.hpp>
#include <primecfg/opaque.hpp>
#include <primecfg/optim.hpp>
#include <primecfg/rules.hpp>
#include <primecfg/scheduler.hpp>
#include <primecfg/validate.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

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

// [tokenizer]: prime-rl's TokenizerConfig. "None" takes the model's setting
// (prime-rl's auto_setup_tokenizer copies it in).
struct TokenizerConfig {
  std::optional<std::string> name = std::nullopt;
  std::optional<bool> trust_remote_code = std::nullopt;
  std::optional<std::string> chat_template = std::nullopt;

  static constexpr auto fields() {
    using S = TokenizerConfig;
    return describe(
        field(&S::name, "Tokenizer name or path; \"None\": model.name."),
        field(&S::trust_remote_code,
              "Allow tokenizer code from the checkpoint; \"None\": model.trust_remote_code."),
        field(&S::chat_template, "Jinja2 chat template or a path to one; \"None\": the tokenizer's own."));
  }
};

// [loss]: the RL loss, a tagged union on `type` (prime-rl's LossConfig).
struct DefaultLossConfig {
  static constexpr std::string_view type = "default";
  double dppo_mask_low = 0.2;
  double dppo_mask_high = 0.2;
  double adv_tau = 1.0;
  double kl_tau = 1e-3;

  static constexpr auto fields() {
    using S = DefaultLossConfig;
    return describe(field(&S::dppo_mask_low, "Lower DPPO masking threshold.", ge(0)),
                    field(&S::dppo_mask_high, "Upper DPPO masking threshold.", ge(0)),
                    field(&S::adv_tau, "Temperature of the advantage term.", ge(0)),
                    field(&S::kl_tau, "Temperature of the KL term.", ge(0)));
  }
};

struct IPOLossConfig {
  static constexpr std::string_view type = "ipo";
  double ipo_threshold = 0.1;
  double adv_tau = 1.0;
  double kl_tau = 1e-3;

  static constexpr auto fields() {
    using S = IPOLossConfig;
    return describe(field(&S::ipo_threshold, "IPO masking threshold.", ge(0)),
                    field(&S::adv_tau, "Temperature of the advantage term.", ge(0)),
                    field(&S::kl_tau, "Temperature of the KL term.", ge(0)));
  }
};

struct CustomLossConfig {
  static constexpr std::string_view type = "custom";
  std::string import_path;
  opaque_table kwargs = {};

  static constexpr auto fields() {
    using S = CustomLossConfig;
    return describe(
        field(&S::import_path, "Python import path of the loss function (module.function).", required),
        field(&S::kwargs, "Keyword arguments passed to the loss function."));
  }
};

using LossConfig = std::variant<DefaultLossConfig, IPOLossConfig, CustomLossConfig>;

// [heartbeat]: prime-rl's BetterStack heartbeat.
struct HeartbeatConfig {
  std::string url;

  static constexpr auto fields() {
    return describe(field(&HeartbeatConfig::url, "URL the heartbeat is sent to.", required));
  }
};

// [metrics_server]: prime-rl's Prometheus endpoint.
struct MetricsServerConfig {
  std::int64_t port = 8000;
  std::string host = "0.0.0.0";

  static constexpr auto fields() {
    using S = MetricsServerConfig;
    return describe(field(&S::port, "Port of the /metrics and health endpoints.", ge(1), le(65535)),
                    field(&S::host, "Address the server binds to."));
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
  TokenizerConfig tokenizer = {};
  TrainerDataConfig data = {};
  LossConfig loss = DefaultLossConfig{};
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
  std::optional<HeartbeatConfig> heartbeat = std::nullopt;
  std::optional<MetricsServerConfig> metrics_server = std::nullopt;
  bool enable_router_replay = false;
  bool enable_token_export = false;
  std::map<std::string, std::string> env_vars = {};

  static constexpr auto fields() {
    using S = TrainerConfig;
    return describe(field(&S::model, "The model and its memory layout."),
                    field(&S::tokenizer, "The tokenizer (the model's by default)."),
                    field(&S::data, "Training data."), field(&S::loss, "RL loss (tagged union on type)."),
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
                    field(&S::heartbeat, "BetterStack heartbeat of training progress."),
                    field(&S::metrics_server, "Prometheus /metrics endpoint; \"None\": none."),
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
