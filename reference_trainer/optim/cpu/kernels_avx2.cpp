// AVX2 + FMA kernels (8 lanes). Heads and tails use the scalar element functions, which perform the
// same operations, so results match the other paths bit for bit.
#include <immintrin.h>

#include <cstdint>

#include "optim/cpu/kernels.hpp"

#define PRIMECFG_AVX2 __attribute__((target("avx2,fma")))
#define PRIMECFG_AVX2_INLINE inline __attribute__((always_inline, target("avx2,fma")))

namespace primecfg::train::cpu::detail {
namespace {

constexpr std::int64_t kLanes = 8;

PRIMECFG_AVX2_INLINE __m256 load_bf16(const std::uint16_t* src) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

// 8 floats -> 8 rounded bf16 values, one per 32-bit lane (NaN -> 0x7FC0).
PRIMECFG_AVX2_INLINE __m256i round_bf16(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i bias = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), nan);
}
// 16 floats (two vectors) -> 16 bf16 in order.
PRIMECFG_AVX2_INLINE __m256i pack_bf16(__m256 lo, __m256 hi) {
  const __m256i packed = _mm256_packus_epi32(round_bf16(lo), round_bf16(hi));  // per 128-bit lane
  return _mm256_permute4x64_epi64(packed, 0xD8);
}

template <bool kBf16Grad, class Args>
PRIMECFG_AVX2_INLINE __m256 load_grad(const Args& a, std::int64_t i) {
  if constexpr (kBf16Grad)
    return load_bf16(a.g16 + i);
  else
    return _mm256_loadu_ps(a.g32 + i);
}
template <bool kBf16Grad, class Args>
PRIMECFG_AVX2_INLINE float grad_at(const Args& a, std::int64_t i) {
  if constexpr (kBf16Grad)
    return bf16_bits_to_float(a.g16[i]);
  else
    return a.g32[i];
}

struct AdamWVec {
  __m256 scale, decay, omb1, b2, omb2, neg_step, inv_bc2, eps;
};

PRIMECFG_AVX2_INLINE __m256 adamw_vec(float* pp, float* mp, float* vp, __m256 g, const AdamWVec& k) {
  g = _mm256_mul_ps(g, k.scale);
  __m256 p = _mm256_mul_ps(_mm256_loadu_ps(pp), k.decay);
  __m256 m = _mm256_loadu_ps(mp);
  __m256 v = _mm256_loadu_ps(vp);
  m = _mm256_fmadd_ps(k.omb1, _mm256_sub_ps(g, m), m);
  v = _mm256_fmadd_ps(k.b2, v, _mm256_mul_ps(k.omb2, _mm256_mul_ps(g, g)));
  const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(v), k.inv_bc2, k.eps);
  p = _mm256_fmadd_ps(k.neg_step, _mm256_div_ps(m, denom), p);
  _mm256_storeu_ps(pp, p);
  _mm256_storeu_ps(mp, m);
  _mm256_storeu_ps(vp, v);
  return p;
}

template <bool kBf16Grad, bool kOut>
PRIMECFG_AVX2_INLINE void adamw_scalar_span(const AdamWArgs& a, std::int64_t i, std::int64_t end) {
  for (; i < end; ++i) {
    adamw_element(a.p[i], a.m[i], a.v[i], grad_at<kBf16Grad>(a, i), a.c);
    if constexpr (kOut) a.out[i] = float_to_bf16_bits(a.p[i]);
  }
}

template <bool kBf16Grad, bool kOut, bool kStream>
PRIMECFG_AVX2_INLINE std::int64_t adamw_main(const AdamWArgs& a, const AdamWVec& k, std::int64_t i,
                                             std::int64_t end) {
  for (; i + 2 * kLanes <= end; i += 2 * kLanes) {
    const __m256 lo = adamw_vec(a.p + i, a.m + i, a.v + i, load_grad<kBf16Grad>(a, i), k);
    const __m256 hi = adamw_vec(a.p + i + kLanes, a.m + i + kLanes, a.v + i + kLanes,
                                load_grad<kBf16Grad>(a, i + kLanes), k);
    if constexpr (kOut) {
      const __m256i b = pack_bf16(lo, hi);
      if constexpr (kStream)
        _mm256_stream_si256(reinterpret_cast<__m256i*>(a.out + i), b);
      else
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.out + i), b);
    }
  }
  return i;
}

template <bool kBf16Grad, bool kOut>
PRIMECFG_AVX2 void adamw_impl(const AdamWArgs& a) {
  const AdamWConsts& c = a.c;
  const AdamWVec k{_mm256_set1_ps(c.scale),        _mm256_set1_ps(c.decay),
                   _mm256_set1_ps(c.one_minus_b1), _mm256_set1_ps(c.b2),
                   _mm256_set1_ps(c.one_minus_b2), _mm256_set1_ps(c.neg_step_size),
                   _mm256_set1_ps(c.inv_bc2_sqrt), _mm256_set1_ps(c.eps)};
  const std::int64_t n = a.n;
  std::int64_t i = 0;
  if constexpr (kOut) {
    const auto addr = reinterpret_cast<std::uintptr_t>(a.out);
    std::int64_t head = static_cast<std::int64_t>(((32 - (addr & 31)) & 31) / 2);
    if ((addr & 1) != 0 || head > n) head = n;
    adamw_scalar_span<kBf16Grad, kOut>(a, 0, head);
    i = head;
    if (use_streaming_stores(n - head)) {
      i = adamw_main<kBf16Grad, kOut, true>(a, k, i, n);
      _mm_sfence();
    } else {
      i = adamw_main<kBf16Grad, kOut, false>(a, k, i, n);
    }
  } else {
    i = adamw_main<kBf16Grad, kOut, false>(a, k, i, n);
  }
  adamw_scalar_span<kBf16Grad, kOut>(a, i, n);
}

struct SignVec {
  __m256 scale, decay, lr, one, sign_bit, zero;
};

PRIMECFG_AVX2_INLINE __m256 sign_vec(float* pp, __m256 g, const SignVec& k) {
  g = _mm256_mul_ps(g, k.scale);
  __m256 s = _mm256_or_ps(_mm256_and_ps(g, k.sign_bit), k.one);
  s = _mm256_blendv_ps(s, k.zero, _mm256_cmp_ps(g, k.zero, _CMP_EQ_OQ));
  s = _mm256_blendv_ps(s, g, _mm256_cmp_ps(g, g, _CMP_UNORD_Q));
  const __m256 shrunk = _mm256_mul_ps(_mm256_loadu_ps(pp), k.decay);
  const __m256 delta = _mm256_mul_ps(k.lr, s);
  const __m256 p = _mm256_sub_ps(shrunk, delta);
  _mm256_storeu_ps(pp, p);
  return p;
}

template <bool kBf16Grad, bool kOut>
PRIMECFG_AVX2_INLINE void sign_scalar_span(const SignArgs& a, std::int64_t i, std::int64_t end) {
  for (; i < end; ++i) {
    a.p[i] = sign_sgd_element(a.p[i], grad_at<kBf16Grad>(a, i), a.c);
    if constexpr (kOut) a.out[i] = float_to_bf16_bits(a.p[i]);
  }
}

template <bool kBf16Grad, bool kOut, bool kStream>
PRIMECFG_AVX2_INLINE std::int64_t sign_main(const SignArgs& a, const SignVec& k, std::int64_t i,
                                            std::int64_t end) {
  for (; i + 2 * kLanes <= end; i += 2 * kLanes) {
    const __m256 lo = sign_vec(a.p + i, load_grad<kBf16Grad>(a, i), k);
    const __m256 hi = sign_vec(a.p + i + kLanes, load_grad<kBf16Grad>(a, i + kLanes), k);
    if constexpr (kOut) {
      const __m256i b = pack_bf16(lo, hi);
      if constexpr (kStream)
        _mm256_stream_si256(reinterpret_cast<__m256i*>(a.out + i), b);
      else
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.out + i), b);
    }
  }
  return i;
}

template <bool kBf16Grad, bool kOut>
PRIMECFG_AVX2 void sign_impl(const SignArgs& a) {
  const SignVec k{_mm256_set1_ps(a.c.scale), _mm256_set1_ps(a.c.decay), _mm256_set1_ps(a.c.lr),
                  _mm256_set1_ps(1.0f),      _mm256_set1_ps(-0.0f),     _mm256_setzero_ps()};
  const std::int64_t n = a.n;
  std::int64_t i = 0;
  if constexpr (kOut) {
    const auto addr = reinterpret_cast<std::uintptr_t>(a.out);
    std::int64_t head = static_cast<std::int64_t>(((32 - (addr & 31)) & 31) / 2);
    if ((addr & 1) != 0 || head > n) head = n;
    sign_scalar_span<kBf16Grad, kOut>(a, 0, head);
    i = head;
    if (use_streaming_stores(n - head)) {
      i = sign_main<kBf16Grad, kOut, true>(a, k, i, n);
      _mm_sfence();
    } else {
      i = sign_main<kBf16Grad, kOut, false>(a, k, i, n);
    }
  } else {
    i = sign_main<kBf16Grad, kOut, false>(a, k, i, n);
  }
  sign_scalar_span<kBf16Grad, kOut>(a, i, n);
}

}  // namespace

PRIMECFG_AVX2 void adamw_avx2(const AdamWArgs& a) {
  if (a.n <= 0) return;
  if (a.g16 != nullptr) {
    if (a.out != nullptr)
      adamw_impl<true, true>(a);
    else
      adamw_impl<true, false>(a);
  } else {
    if (a.out != nullptr)
      adamw_impl<false, true>(a);
    else
      adamw_impl<false, false>(a);
  }
}

PRIMECFG_AVX2 void sign_sgd_avx2(const SignArgs& a) {
  if (a.n <= 0) return;
  if (a.g16 != nullptr) {
    if (a.out != nullptr)
      sign_impl<true, true>(a);
    else
      sign_impl<true, false>(a);
  } else {
    if (a.out != nullptr)
      sign_impl<false, true>(a);
    else
      sign_impl<false, false>(a);
  }
}

PRIMECFG_AVX2 void to_bf16_avx2(const float* in, std::uint16_t* out, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        pack_bf16(_mm256_loadu_ps(in + i), _mm256_loadu_ps(in + i + kLanes)));
  }
  for (; i < n; ++i) out[i] = float_to_bf16_bits(in[i]);
}

}  // namespace primecfg::train::cpu::detail
