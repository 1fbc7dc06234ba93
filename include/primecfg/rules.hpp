// Cross-field rules shared by the SFT and RL trainer roots.
#pragma once

#include <primecfg/detail/cxx_version.hpp>  // first: C++20 or later

#include <primecfg/checkpoint.hpp>
#include <primecfg/data.hpp>
#include <primecfg/detail/value_text.hpp>
#include <primecfg/model.hpp>
#include <primecfg/optim.hpp>
#include <primecfg/scheduler.hpp>
#include <primecfg/validate.hpp>

#include <fmt/format.h>
#include <primecfg/detail/toml.hpp>

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
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

// prime-rl's validate_scheduler, per scheduler type. A linear schedule
// needs a warm-up or a decay; one that decays needs max_steps and must fit in
// it; a cosine schedule needs max_steps and a warm-up shorter than it. (The
// constant warm-up and the cosine decay_steps are primecfg's own fields: they
// must fit too.) Sums saturate: rules also run on values that failed bounds.
inline void scheduler_fits(validation& v, const SchedulerConfig& scheduler,
                           const std::optional<std::int64_t>& max_steps) {
  auto sum = [](std::int64_t a, std::int64_t b) {
    std::int64_t total;
    if (__builtin_add_overflow(a, b, &total))
      total = b > 0 ? std::numeric_limits<std::int64_t>::max() : std::numeric_limits<std::int64_t>::min();
    return total;
  };
  std::string steps = max_steps ? fmt::format("max_steps = {}", *max_steps) : std::string();
  std::visit(
      [&](const auto& s) {
        using S = std::decay_t<decltype(s)>;
        if constexpr (std::is_same_v<S, LinearSchedulerConfig>) {
          std::int64_t decay = s.decay_steps.value_or(0);
          if (s.warmup_steps == 0 && s.decay_steps && decay == 0) {
            v.error(s.warmup_steps,
                    "a linear schedule needs warmup_steps > 0 or decay_steps > 0 (use type = \"constant\")");
            return;
          }
          if (s.decay_steps && decay == 0) {
            if (max_steps && s.warmup_steps > *max_steps)
              v.error(s.warmup_steps,
                      fmt::format("warm-up takes {} steps, more than {}", s.warmup_steps, steps));
            return;
          }
          if (!max_steps) {
            v.error(s.decay_steps, "a linear schedule that decays needs max_steps");
            return;
          }
          std::int64_t total = sum(s.warmup_steps, decay);
          if (total > *max_steps)
            v.error(s.warmup_steps,
                    fmt::format("warm-up plus decay takes {} steps, more than {}", total, steps));
        } else if constexpr (std::is_same_v<S, CosineSchedulerConfig>) {
          if (!max_steps) {
            v.error(s.warmup_steps, "a cosine schedule needs max_steps");
            return;
          }
          if (s.warmup_steps >= *max_steps) {
            v.error(s.warmup_steps,
                    fmt::format("warm-up takes {} steps; it must be shorter than {}", s.warmup_steps, steps));
            return;
          }
          std::int64_t total = sum(s.warmup_steps, s.decay_steps.value_or(0));
          if (total > *max_steps)
            v.error(s.warmup_steps,
                    fmt::format("warm-up plus decay takes {} steps, more than {}", total, steps));
        } else {
          if (max_steps && s.warmup_steps > *max_steps)
            v.error(s.warmup_steps,
                    fmt::format("warm-up takes {} steps, more than {}", s.warmup_steps, steps));
        }
      },
      scheduler);
}

// A decaying schedule ends at min_lr: above the optimizer's peak lr it would
// raise the learning rate while it "decays" (prime-rl does not check this;
// nothing there needs it). Both fields are named, with where they were set.
inline void scheduler_below_lr(validation& v, const SchedulerConfig& scheduler,
                               const OptimizerConfig& optim) {
  std::visit(
      [&](const auto& s) {
        using S = std::decay_t<decltype(s)>;
        if constexpr (!std::is_same_v<S, ConstantSchedulerConfig>) {
          std::visit(
              [&](const auto& o) {
                if (s.min_lr <= o.lr) return;
                v.error(s.min_lr,
                        fmt::format("min_lr = {} is above the peak learning rate {} = {} (set at {}): the "
                                    "\"{}\" schedule would raise the learning rate while it decays; use a "
                                    "min_lr <= lr",
                                    detail::value_text(s.min_lr), v.path_of(o.lr), detail::value_text(o.lr),
                                    v.source_of(o.lr).to_string(), S::type));
              },
              optim);
        }
      },
      scheduler);
}

// data.path replaces data.name: when both were written, the name is not used,
// and the run reads a different dataset than the config seems to say.
inline void data_path_replaces_name(validation& v, const SFTDataSource& data) {
  if (const auto* d = std::get_if<SFTDataConfig>(&data); d && d->path && v.is_set(d->name))
    v.warning(d->name, fmt::format("not used: {} = {} (set at {}) replaces it", v.path_of(d->path),
                                   detail::value_text(d->path), v.source_of(d->path).to_string()));
}

// Resuming at or past max_steps leaves nothing to train: the run would load
// the checkpoint and stop at once, looking like a success.
inline void resume_fits(validation& v, const std::optional<ResumeConfig>& resume,
                        const std::optional<std::int64_t>& max_steps) {
  if (resume && resume->step && max_steps && *resume->step >= *max_steps)
    v.error(*resume->step, fmt::format("resuming at step {} leaves nothing to train: {} = {} (set at {}); "
                                       "raise max_steps or resume from an earlier step",
                                       *resume->step, v.path_of(max_steps), detail::value_text(max_steps),
                                       v.source_of(max_steps).to_string()));
}

// prime-rl's reject_protected_env_vars (configs/shared.py, PROTECTED_ENV_VARS):
// the launcher sets these in every process it starts, after env_vars, so a
// value written there would never arrive. Refused in every env_vars (SFT,
// trainer, RL), each where it is written.
inline constexpr std::string_view protected_env_vars[] = {
    "CUDA_VISIBLE_DEVICES", "PRL_RUN_ID",         "PRL_RUN_NAME",         "WANDB_RUN_ID",
    "WANDB_SHARED_MODE",    "WANDB_SHARED_LABEL", "WANDB_SHARED_PRIMARY", "WANDB_SHARED_FINISHER"};

inline void no_protected_env_vars(validation& v, const std::map<std::string, std::string>& env_vars) {
  for (const auto& [name, value] : env_vars)
    if (std::find(std::begin(protected_env_vars), std::end(protected_env_vars), name) !=
        std::end(protected_env_vars))
      v.error(value,
              fmt::format("{} is set by the launcher (GPU placement, the run's identity, the shared W&B "
                          "run) and cannot be overridden in env_vars; remove it",
                          name));
}

inline bool custom_or_auto(ModelImpl impl) { return impl == ModelImpl::custom || impl == ModelImpl::auto_; }

// prime-rl's ModelConfig validators (trainer.py) and the EP / router-replay
// rules its SFTConfig and TrainerConfig share.
inline void model_rules(validation& v, ModelConfig& m) {
  if (m.trust_remote_code && m.impl != ModelImpl::hf && m.impl != ModelImpl::auto_)
    v.error(m.trust_remote_code, "trust_remote_code needs model.impl = \"hf\" or \"auto\"");
  if (m.vlm && m.impl != ModelImpl::custom)
    v.error(m.impl, "vision-language training (model.vlm) needs impl = \"custom\"");
  if (m.vlm && m.cp > 1 && m.cp_style != CpStyle::ulysses)
    v.error(m.cp_style, "vision-language models need cp_style = \"ulysses\" with cp > 1");
  if (m.cp > 1) {
    if (m.attn != Attention::flash_attention_2 && m.attn != Attention::flash_attention_3 &&
        m.attn != Attention::flash_attention_4 && m.attn != Attention::auto_)
      v.error(m.attn,
              fmt::format("context parallelism (cp = {}) needs flash attention 2, 3, 4 or auto", m.cp));
    if (!custom_or_auto(m.impl))
      v.error(m.impl, fmt::format("context parallelism (cp = {}) needs impl = \"custom\" or \"auto\"", m.cp));
  }
  if (m.ac_offloading && !m.ac) {
    // prime-rl turns checkpointing back on without a word, even when ac = "None" was written.
    if (v.is_set(m.ac) && !v.is_set(m.ac_offloading))
      v.error(m.ac,
              "ac = \"None\" turns activation checkpointing off, but activation offloading "
              "(model.ac_offloading, on by default) needs it; prime-rl would turn checkpointing back on. "
              "Turn both off with ac_offloading = \"None\" as well");
    else if (v.is_set(m.ac))
      v.error(
          m.ac,
          "activation offloading (model.ac_offloading) needs activation checkpointing; remove ac = \"None\"");
    else {
      m.ac.emplace();
      v.note(m.ac, "activation checkpointing turned on with its defaults: model.ac_offloading needs it");
    }
  }
  if (m.ac && m.ac->mode == AcMode::selective && !custom_or_auto(m.impl))
    v.error(m.impl, "selective activation checkpointing needs impl = \"custom\" or \"auto\"");
  if ((m.attn == Attention::flash_attention_4 || m.attn == Attention::auto_) && !custom_or_auto(m.impl))
    v.error(
        m.attn,
        fmt::format("attn = \"{}\" (which may pick flash attention 4) needs impl = \"custom\" or \"auto\"",
                    m.attn == Attention::auto_ ? "auto" : "flash_attention_4"));
  if (m.quantization && !custom_or_auto(m.impl))
    v.error(m.quantization, "quantized training needs impl = \"custom\" or \"auto\"");
  if (m.ep_comm_backend != EpCommBackend::torch && m.ep.is_number() && m.ep.number() <= 1)
    v.error(m.ep_comm_backend, "ep_comm_backend = \"deepep\" needs ep > 1");
  if (m.ep.is_number() && m.ep.number() != 1 && !custom_or_auto(m.impl))
    v.error(m.ep, "expert parallelism needs impl = \"custom\" or \"auto\"");
}

// Rules of prime-rl's SFTConfig and TrainerConfig over the model and the optimizer.
inline void trainer_rules(validation& v, ModelConfig& m, OptimizerConfig& optim) {
  model_rules(v, m);
  if (m.ep_comm_backend == EpCommBackend::deepep)
    std::visit(
        [&](auto& o) {
          v.require_value(o.max_norm, std::optional<double>{},
                          "ep_comm_backend = \"deepep\" cannot clip gradients; set max_norm = \"None\"");
        },
        optim);
  if (m.vlm) {
    if (m.optimization_dtype != Dtype::bfloat16)
      v.error(m.optimization_dtype, "vision-language models train in bfloat16 (as vLLM serves them)");
    if (m.reduce_dtype != Dtype::bfloat16)
      v.error(m.reduce_dtype, "vision-language models reduce in bfloat16 (as vLLM serves them)");
    if (!m.vlm->freeze_vision_encoder && m.lora)
      v.error(
          m.vlm->freeze_vision_encoder,
          "freeze_vision_encoder = false does not work with LoRA (LoRA freezes every non-adapter weight)");
  }
}

// prime-rl's dont_do_massive_traces.
inline void trace_fits(validation& v, const std::optional<std::filesystem::path>& trace_path,
                       const std::optional<std::int64_t>& max_steps) {
  if (!trace_path) return;
  if (!max_steps)
    v.error(*trace_path, "tracing needs max_steps");
  else if (*max_steps >= 10)
    v.error(*trace_path, fmt::format("tracing {} steps writes a huge trace; use max_steps < 10", *max_steps));
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
