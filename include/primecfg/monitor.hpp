// [log] and [monitors]: where progress is reported.
#pragma once

#include <primecfg/describe.hpp>

#include <optional>
#include <string>

namespace primecfg {

enum class LogLevel { debug, info, warning, error };

struct LogConfig {
  LogLevel level = LogLevel::info;

  static constexpr auto fields() { return describe(field(&LogConfig::level, "Lowest level printed.")); }
};

struct WandbConfig {
  std::string project = "prime-rl";
  std::optional<std::string> name = std::nullopt;
  bool offline = false;

  static constexpr auto fields() {
    using S = WandbConfig;
    return describe(field(&S::project, "W&B project."), field(&S::name, "W&B run name."),
                    field(&S::offline, "Log to disk only."));
  }
};

struct PrimeMonitorConfig {
  std::optional<std::string> base_url = std::nullopt;

  static constexpr auto fields() {
    return describe(
        field(&PrimeMonitorConfig::base_url, "Prime Intellect API endpoint; \"None\" uses the default."));
  }
};

struct MonitorsConfig {
  std::optional<WandbConfig> wandb = std::nullopt;
  std::optional<PrimeMonitorConfig> prime = std::nullopt;

  static constexpr auto fields() {
    using S = MonitorsConfig;
    return describe(field(&S::wandb, "Weights & Biases logging; an empty table enables it."),
                    field(&S::prime, "Prime Intellect platform logging; an empty table enables it."));
  }
};

}  // namespace primecfg
