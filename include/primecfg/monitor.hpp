// [log] and [monitors]: where progress is reported.
#pragma once

#include <primecfg/detail/cxx_version.hpp>  // first: C++20 or later

#include <primecfg/describe.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace primecfg {

enum class LogLevel { debug, info, warning, error };

// g++ 12 cannot count the fields of a struct whose vector member has a braced
// default (library.md), so the default list comes from a function.
inline std::vector<std::int64_t> default_ranks_filter() { return std::vector<std::int64_t>(1, 0); }

// prime-rl's TrainerLogConfig (SFT and trainer processes).
struct LogConfig {
  LogLevel level = LogLevel::info;
  LogLevel vf_level = LogLevel::info;
  bool json_logging = false;
  bool log_data = false;
  double interval = 10.0;
  std::vector<std::int64_t> ranks_filter = default_ranks_filter();

  static constexpr auto fields() {
    using S = LogConfig;
    return describe(
        field(&S::level, "Lowest level printed."),
        field(&S::vf_level, "Lowest level printed by the verifiers package."),
        field(&S::json_logging, "Write logs as newline-delimited JSON."),
        field(&S::log_data, "Log the first data sample at startup."),
        field(&S::interval, "Seconds between periodic log lines.", gt(0)),
        field(&S::ranks_filter, "Trainer ranks whose output is shown (torchrun's local ranks filter)."));
  }
};

// The [log] of an RL run: only what is shared with every component.
struct SharedLogConfig {
  std::optional<LogLevel> level = std::nullopt;
  bool json_logging = false;

  static constexpr auto fields() {
    using S = SharedLogConfig;
    return describe(field(&S::level, "Lowest level printed by every component; \"None\": each its own."),
                    field(&S::json_logging, "Every component writes newline-delimited JSON logs."));
  }
};

struct WandbConfig {
  std::string project = "prime-rl";
  std::optional<std::string> entity = std::nullopt;
  std::optional<std::string> name = std::nullopt;
  std::optional<std::string> group = std::nullopt;
  std::optional<std::vector<std::string>> tags = std::nullopt;
  bool offline = false;

  static constexpr auto fields() {
    using S = WandbConfig;
    return describe(field(&S::project, "W&B project."), field(&S::entity, "W&B entity (team or user)."),
                    field(&S::name, "W&B run name."), field(&S::group, "W&B group of runs."),
                    field(&S::tags, "W&B tags of the run."), field(&S::offline, "Log to disk only."));
  }
};

// Metrics as JSON lines in the run folder.
struct FileMonitorConfig {
  std::filesystem::path path = "metrics.jsonl";

  static constexpr auto fields() {
    return describe(
        field(&FileMonitorConfig::path, "JSONL file of metrics; a relative path is under output_dir."));
  }
};

struct PrimeMonitorConfig {
  std::optional<std::string> base_url = std::nullopt;
  std::optional<std::string> name = std::nullopt;

  static constexpr auto fields() {
    using S = PrimeMonitorConfig;
    return describe(field(&S::base_url, "Prime Intellect API endpoint; \"None\" uses the default."),
                    field(&S::name, "Run name on the platform; \"None\": run.name."));
  }
};

struct MonitorsConfig {
  std::optional<WandbConfig> wandb = std::nullopt;
  std::optional<FileMonitorConfig> file = FileMonitorConfig{};
  std::optional<PrimeMonitorConfig> prime = std::nullopt;

  static constexpr auto fields() {
    using S = MonitorsConfig;
    return describe(field(&S::wandb, "Weights & Biases logging; an empty table enables it."),
                    field(&S::file, "Metrics to a JSONL file (on by default); \"None\" turns it off."),
                    field(&S::prime, "Prime Intellect platform logging; an empty table enables it."));
  }
};

// The [monitors] of an RL run, handed to [trainer.monitors] (and the orchestrator).
struct SharedMonitorsConfig {
  std::optional<WandbConfig> wandb = std::nullopt;
  std::optional<FileMonitorConfig> file = std::nullopt;
  std::optional<PrimeMonitorConfig> prime = std::nullopt;

  static constexpr auto fields() {
    using S = SharedMonitorsConfig;
    return describe(
        field(&S::wandb, "W&B logging of every component (shared with [trainer.monitors.wandb])."),
        field(&S::file, "JSONL metrics of every component (shared with [trainer.monitors.file])."),
        field(&S::prime, "Prime Intellect platform logging (the orchestrator's only)."));
  }
};

}  // namespace primecfg
