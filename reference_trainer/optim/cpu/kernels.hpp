// Internal: per-ISA kernel entry points and the scalar element operations they share.
//
// Bit-identical results across paths rest on two rules: every path performs the same IEEE operations
// in the same order (fused multiply-adds only where written as such), and the library is compiled
// with -ffp-contract=off so the compiler adds no fusions of its own.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace primecfg::train::cpu::detail {

struct AdamWConsts {
  float scale;          // gradient multiplier
  float decay;          // 1 - lr * weight_decay
  float one_minus_b1;   // 1 - beta1
  float b2;             // beta2
  float one_minus_b2;   // 1 - beta2
  float neg_step_size;  // -lr / (1 - beta1^step)
  float inv_bc2_sqrt;   // 1 / sqrt(1 - beta2^step)
  float eps;
};

struct SignConsts {
  float scale;  // gradient multiplier
  float decay;  // 1 - lr * weight_decay
  float lr;
};

struct AdamWArgs {
  float* p;
  float* m;
  float* v;
  const std::uint16_t* g16;  // exactly one of g16 / g32 is set
  const float* g32;
  std::uint16_t* out;  // may be null
  std::int64_t n;
  AdamWConsts c;
};

struct SignArgs {
  float* p;
  const std::uint16_t* g16;
  const float* g32;
  std::uint16_t* out;
  std::int64_t n;
  SignConsts c;
};

// Ranges at least this long (elements) write the bf16 output with streaming stores: the upload
// buffer is read next by the GPU's DMA engine, not by this core. Set by set_streaming_store_threshold
// or the environment variable PRIMECFG_CPU_STREAM_MIN (elements; 0 = always, -1 = never).
std::int64_t stream_min_elements() noexcept;
inline bool use_streaming_stores(std::int64_t elements) noexcept {
  const std::int64_t t = stream_min_elements();
  return t >= 0 && elements >= t;
}

// Software prefetch distance in elements (0 = none); see set_prefetch_distance.
std::int64_t prefetch_elements() noexcept;

#define PRIMECFG_INLINE inline __attribute__((always_inline))

PRIMECFG_INLINE float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
PRIMECFG_INLINE std::uint32_t float_to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
PRIMECFG_INLINE float bf16_bits_to_float(std::uint16_t b) { return bits_to_float(std::uint32_t{b} << 16); }
// Round to nearest even; every NaN becomes 0x7FC0 (c10::BFloat16's rule).
PRIMECFG_INLINE std::uint16_t float_to_bf16_bits(float f) {
  if (f != f) return 0x7FC0;
  const std::uint32_t u = float_to_bits(f);
  const std::uint32_t bias = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + bias) >> 16);
}

PRIMECFG_INLINE void adamw_element(float& p, float& m, float& v, float g, const AdamWConsts& c) {
  g = g * c.scale;
  float pp = p * c.decay;
  const float mm = __builtin_fmaf(c.one_minus_b1, g - m, m);
  const float vv = __builtin_fmaf(c.b2, v, c.one_minus_b2 * (g * g));
  const float denom = __builtin_fmaf(__builtin_sqrtf(vv), c.inv_bc2_sqrt, c.eps);
  pp = __builtin_fmaf(c.neg_step_size, mm / denom, pp);
  p = pp;
  m = mm;
  v = vv;
}

PRIMECFG_INLINE float sign_of(float g) {
  if (g > 0.0f) return 1.0f;
  if (g < 0.0f) return -1.0f;
  if (g == 0.0f) return 0.0f;
  return g;  // NaN propagates
}

PRIMECFG_INLINE float sign_sgd_element(float p, float g, const SignConsts& c) {
  const float s = sign_of(g * c.scale);
  const float shrunk = p * c.decay;
  const float delta = c.lr * s;
  return shrunk - delta;
}

void adamw_scalar(const AdamWArgs& a);
void adamw_avx2(const AdamWArgs& a);
void adamw_avx512(const AdamWArgs& a);
void sign_sgd_scalar(const SignArgs& a);
void sign_sgd_avx2(const SignArgs& a);
void sign_sgd_avx512(const SignArgs& a);
void to_bf16_avx2(const float* in, std::uint16_t* out, std::int64_t n);
void to_bf16_avx512(const float* in, std::uint16_t* out, std::int64_t n);

}  // namespace primecfg::train::cpu::detail
