// Cross-field rules shared by the SFT and RL trainer roots.
#pragma once

#include <primecfg/data.hpp>
#include <primecfg/detail/value_text.hpp>
#include <primecfg/model.hpp>
#include <primecfg/optim.hpp>
#include <primecfg/scheduler.hpp>
#include <primecfg/validate.hpp>

#include <fmt/format.h>
#include <primecfg/detail/toml.hpp>

#include <limits>
#include <optional>
#include <variant>

namespace primecfg::rules {

// Full offload runs the update on the CPU per chunk while backward is still
// running: only element-wise optimizers work there (AdamW, SignSGD), and the
// global gradient norm that clipping needs is never known in time.
inline void full_offload_optimizer(validation& v, const ModelConfig& model, OptimizerConfig& optim) {
  if (model.offload != Offload::full) return;
  std::visit(
      [&](auto& o) {
        using O = std::decay_t<decltype(o)>;
        if constexpr (!std::is_same_v<O, AdamWConfig> && !std::is_same_v<O, SignSGDConfig>) {
          std::string type_path = v.path_of(optim) + ".type";
          v.error(model.offload,
                  fmt::format("offload = \"full\" supports only optimizer type adamw or sign_sgd, "
                              "but {} = \"{}\" (set at {})",
                              type_path, O::type, v.source_of_path(type_path).to_string()));
        } else {
          v.require_value(o.max_norm, std::optional<double>{},
                          "offload = \"full\" cannot clip gradients (the update runs before the global norm "
                          "is known); set max_norm = \"None\" or use another offload mode");
        }
      },
      optim);
}

// A warm-up (plus decay) longer than the run would never reach its peak.
inline void scheduler_fits(validation& v, const SchedulerConfig& scheduler,
                           const std::optional<std::int64_t>& max_steps) {
  if (!max_steps) return;
  std::visit(
      [&](const auto& s) {
        // Rules run on values that failed their bounds too: the sum saturates
        // instead of overflowing.
        std::int64_t total = s.warmup_steps;
        if constexpr (requires { s.decay_steps; }) {
          std::int64_t decay = s.decay_steps.value_or(0);
          if (__builtin_add_overflow(total, decay, &total))
            total = decay > 0 ? std::numeric_limits<std::int64_t>::max()
                              : std::numeric_limits<std::int64_t>::min();
        }
        if (total > *max_steps)
          v.error(s.warmup_steps,
                  fmt::format("warm-up{} takes {} steps, more than max_steps = {}",
                              total == s.warmup_steps ? "" : " plus decay", total, *max_steps));
      },
      scheduler);
}

// Gradient accumulation needs whole micro-batches.
template <class Data>
void micro_batches_divide(validation& v, const Data& data) {
  if (data.micro_batch_size > 0 && data.batch_size % data.micro_batch_size != 0)
    v.error(data.batch_size,
            fmt::format("must be a multiple of micro_batch_size = {}", data.micro_batch_size));
}

// The part of full_offload_optimizer that JSON Schema can say: with
// model.offload = "full", optim.type (when written) is adamw or sign_sgd and
// optim.max_norm (when written) is "None".
inline void full_offload_schema(toml::table& schema) {
  toml::table when{
      {"properties",
       toml::table{
           {"model", toml::table{{"properties", toml::table{{"offload", toml::table{{"const", "full"}}}}},
                                 {"required", toml::array{"offload"}}}}}},
      {"required", toml::array{"model"}}};
  toml::table then{
      {"properties",
       toml::table{
           {"optim",
            toml::table{
                {"properties", toml::table{{"type", toml::table{{"enum", toml::array{"adamw", "sign_sgd"}}}},
                                           {"max_norm", toml::table{{"const", "None"}}}}}}}}}};
  if (!schema.contains("allOf")) schema.insert("allOf", toml::array{});
  schema["allOf"].as_array()->push_back(toml::table{{"if", std::move(when)}, {"then", std::move(then)}});
}

}  // namespace primecfg::rules
