// [scheduler]: the learning-rate schedule, a tagged union on `type`.
#pragma once

#include <primecfg/detail/cxx_version.hpp>  // first: C++20 or later

#include <primecfg/describe.hpp>

#include <cstdint>
#include <optional>
#include <string_view>
#include <variant>

namespace primecfg {

struct ConstantSchedulerConfig {
  static constexpr std::string_view type = "constant";
  std::int64_t warmup_steps = 0;

  static constexpr auto fields() {
    return describe(field(&ConstantSchedulerConfig::warmup_steps, "Steps of linear warm-up from 0.", ge(0)));
  }
};

struct LinearSchedulerConfig {
  static constexpr std::string_view type = "linear";
  std::int64_t warmup_steps = 10;
  std::optional<std::int64_t> decay_steps = 10;
  double min_lr = 0.0;

  static constexpr auto fields() {
    using S = LinearSchedulerConfig;
    return describe(
        field(&S::warmup_steps, "Steps of linear warm-up from 0.", ge(0)),
        field(&S::decay_steps,
              "Steps of linear decay at the end of the run; \"None\" decays over all steps after warm-up.",
              ge(0)),
        field(&S::min_lr, "Learning rate at the end of decay.", ge(0)));
  }
};

struct CosineSchedulerConfig {
  static constexpr std::string_view type = "cosine";
  std::int64_t warmup_steps = 10;
  std::optional<std::int64_t> decay_steps = std::nullopt;
  double min_lr = 0.0;

  static constexpr auto fields() {
    using S = CosineSchedulerConfig;
    return describe(field(&S::warmup_steps, "Steps of linear warm-up from 0.", ge(0)),
                    field(&S::decay_steps, "Steps of cosine decay; \"None\" decays until max_steps.", ge(0)),
                    field(&S::min_lr, "Learning rate at the end of decay.", ge(0)));
  }
};

using SchedulerConfig = std::variant<ConstantSchedulerConfig, LinearSchedulerConfig, CosineSchedulerConfig>;

}  // namespace primecfg
