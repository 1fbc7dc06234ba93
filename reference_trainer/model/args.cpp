// ModelArgs: names, the parameter list, RoPE frequencies (model/config.hpp).
#include "model/config.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>

namespace primecfg::train {

namespace fs = std::filesystem;
using i64 = std::int64_t;

std::string_view arch_name(Arch a) {
  switch (a) {
    case Arch::llama:
      return "llama";
    case Arch::qwen2:
      return "qwen2";
    case Arch::qwen3:
      break;
  }
  return "qwen3";
}

std::string_view rope_type_name(RopeScaling::Type t) {
  switch (t) {
    case RopeScaling::Type::none:
      return "default";
    case RopeScaling::Type::linear:
      return "linear";
    case RopeScaling::Type::llama3:
      return "llama3";
    case RopeScaling::Type::yarn:
      break;
  }
  return "yarn";
}

// ---------------------------------------------------------------------------
// Parameters
// ---------------------------------------------------------------------------

std::vector<ParamShape> ModelArgs::params() const {
  using K = ParamShape::Kind;
  const i64 D = hidden, q = heads * head_dim, kv = kv_heads * head_dim;
  std::vector<ParamShape> out;
  auto add = [&](std::string name, i64 rows, i64 cols, int block, K kind) {
    out.push_back({std::move(name), rows, cols, block, kind});
  };
  // A projection: its weight, then its bias when the architecture has one.
  auto linear = [&](const std::string& name, i64 out_features, i64 in_features, int block, bool bias) {
    add(name + ".weight", out_features, in_features, block, K::matrix);
    if (bias) add(name + ".bias", out_features, 1, block, K::bias);
  };
  add("model.embed_tokens.weight", vocab_size, D, -1, K::matrix);
  namespace n = llama_names;
  for (int l = 0; l < layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    auto name = [&](std::string_view suffix) { return p + std::string(suffix); };
    add(name(n::input_norm), D, 1, l, K::norm);
    linear(name(n::q), q, D, l, q_bias());
    linear(name(n::k), kv, D, l, q_bias());
    linear(name(n::v), kv, D, l, q_bias());
    linear(name(n::o), D, q, l, o_bias());
    if (qk_norm()) {
      add(name(n::q_norm), head_dim, 1, l, K::norm);
      add(name(n::k_norm), head_dim, 1, l, K::norm);
    }
    add(name(n::post_norm), D, 1, l, K::norm);
    linear(name(n::gate), intermediate, D, l, mlp_bias);
    linear(name(n::up), intermediate, D, l, mlp_bias);
    linear(name(n::down), D, intermediate, l, mlp_bias);
  }
  add("model.norm.weight", D, 1, -1, K::norm);
  if (!tie_embeddings) add("lm_head.weight", vocab_size, D, -1, K::matrix);
  return out;
}

double ModelArgs::flops_per_token(i64 seq_len) const {
  return 6.0 * static_cast<double>(matmul_params()) +
         12.0 * static_cast<double>(layers * heads * head_dim) * static_cast<double>(seq_len);
}

i64 ModelArgs::matmul_params() const {
  i64 n = 0;
  for (const auto& p : params())
    if (p.is_matrix() && p.name != "model.embed_tokens.weight") n += p.numel();
  return n + (tie_embeddings ? vocab_size * hidden : 0);
}

i64 ModelArgs::total_params() const {
  i64 n = 0;
  for (const auto& p : params()) n += p.numel();
  return n;
}

// ---------------------------------------------------------------------------
// RoPE (the formulas of transformers' modeling_rope_utils, in double precision)
// ---------------------------------------------------------------------------

std::vector<double> ModelArgs::rope_inv_freq() const {
  const auto& s = rope_scaling;
  const i64 dim = head_dim, half = dim / 2;
  std::vector<double> inv(static_cast<std::size_t>(half));
  for (i64 i = 0; i < half; ++i)
    inv[i] = 1.0 / std::pow(rope_theta, static_cast<double>(2 * i) / static_cast<double>(dim));
  switch (s.type) {
    case RopeScaling::Type::none:
      break;
    case RopeScaling::Type::linear:
      for (auto& f : inv) f /= s.factor;
      break;
    case RopeScaling::Type::llama3: {
      const double old_len = static_cast<double>(s.original_max_positions);
      const double low_wavelen = old_len / s.low_freq_factor, high_wavelen = old_len / s.high_freq_factor;
      for (auto& f : inv) {
        const double wavelen = 2 * std::numbers::pi / f;
        if (wavelen > low_wavelen) {
          f /= s.factor;
        } else if (!(wavelen < high_wavelen)) {  // between the two: interpolate
          const double smooth =
              (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
          f = (1 - smooth) * f / s.factor + smooth * f;
        }
      }
      break;
    }
    case RopeScaling::Type::yarn: {
      const double base = rope_theta, d = static_cast<double>(dim);
      const double orig = static_cast<double>(s.original_max_positions);
      auto correction_dim = [&](double rotations) {
        return d * std::log(orig / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
      };
      double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
      if (s.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, d - 1);
      if (low == high) high += 0.001;  // as transformers does, against a zero-width ramp
      for (i64 i = 0; i < half; ++i) {
        const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
        const double extrapolation = 1 - ramp;
        inv[i] = inv[i] / s.factor * (1 - extrapolation) + inv[i] * extrapolation;
      }
      break;
    }
  }
  return inv;
}

double ModelArgs::rope_attention_scaling() const {
  const auto& s = rope_scaling;
  if (s.type != RopeScaling::Type::yarn) return 1.0;
  if (s.attention_factor) return *s.attention_factor;
  auto get_mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
  if (s.mscale && s.mscale_all_dim && *s.mscale != 0 && *s.mscale_all_dim != 0)
    return get_mscale(s.factor, *s.mscale) / get_mscale(s.factor, *s.mscale_all_dim);
  return get_mscale(s.factor, 1.0);
}

}  // namespace primecfg::train
