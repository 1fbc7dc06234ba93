// ModelArgs: names, the parameter list, RoPE frequencies (model/config.hpp).
#include "model/config.hpp"

#include "model/architecture.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>

namespace primecfg::train {

namespace fs = std::filesystem;
using i64 = std::int64_t;

bool MoeArgs::routed(i64 layer) const {
  return experts > 0 && std::find(dense_layers.begin(), dense_layers.end(), layer) == dense_layers.end() &&
         (layer + 1) % sparse_step == 0;
}

const Architecture& ModelArgs::architecture() const {
  if (const Architecture* a = find_architecture(model_type)) return *a;
  throw model_config_error(fmt::format("model_type \"{}\": no architecture reads it", model_type));
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
  const Architecture& arch = architecture();
  std::vector<ParamShape> out;
  out.push_back({std::string(kEmbeddingParam), vocab_size, hidden, -1, K::matrix});
  for (int l = 0; l < layers; ++l) arch.block_params(*this, l, out);
  out.push_back({std::string(kFinalNormParam), hidden, 1, -1, K::norm});
  if (!tie_embeddings) out.push_back({std::string(kLmHeadParam), vocab_size, hidden, -1, K::matrix});
  return out;
}

double ModelArgs::flops_per_token(i64 seq_len) const {
  return 6.0 * static_cast<double>(active_matmul_params()) +
         12.0 * static_cast<double>(layers * heads * head_dim) * static_cast<double>(seq_len);
}

i64 ModelArgs::matmul_params() const {
  i64 n = 0;
  for (const auto& p : params())
    if (p.is_matrix() && p.name != kEmbeddingParam) n += p.numel();
  return n + (tie_embeddings ? vocab_size * hidden : 0);
}

i64 ModelArgs::active_matmul_params() const {
  const Architecture& arch = architecture();
  i64 n = vocab_size * hidden;  // the LM head, tied or not
  for (int l = 0; l < layers; ++l) n += arch.block_active_matmul_params(*this, l);
  return n;
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
