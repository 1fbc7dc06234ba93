// AVX-512 (F + BW + VL) kernels. Only the functions marked with the target attribute use these
// instructions; the dispatcher calls them only when the CPU has them.
// g++ 12 warns about the deliberately undefined registers inside its own AVX-512 intrinsics
// (GCC bug 105593); the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

#include "optim/cpu/kernels.hpp"

#define PRIMECFG_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))
#define PRIMECFG_AVX512_INLINE \
  inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx2,fma")))

namespace primecfg::train::cpu::detail {
namespace {

constexpr std::int64_t kLanes = 16;

PRIMECFG_AVX512_INLINE __mmask16 tail_mask(std::int64_t count) {
  return static_cast<__mmask16>((1u << count) - 1u);  // count in [0, 16]
}

PRIMECFG_AVX512_INLINE __m512 load_bf16(const std::uint16_t* src) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
PRIMECFG_AVX512_INLINE __m512 load_bf16(const std::uint16_t* src, __mmask16 k) {
  const __m256i raw = _mm256_maskz_loadu_epi16(k, src);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// 16 floats -> 16 bf16, round to nearest even, NaN -> 0x7FC0.
PRIMECFG_AVX512_INLINE __m256i to_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);
}

template <bool kBf16Grad>
PRIMECFG_AVX512_INLINE __m512 load_grad(const AdamWArgs& a, std::int64_t i) {
  if constexpr (kBf16Grad)
    return load_bf16(a.g16 + i);
  else
    return _mm512_loadu_ps(a.g32 + i);
}
template <bool kBf16Grad>
PRIMECFG_AVX512_INLINE __m512 load_grad(const AdamWArgs& a, std::int64_t i, __mmask16 k) {
  if constexpr (kBf16Grad)
    return load_bf16(a.g16 + i, k);
  else
    return _mm512_maskz_loadu_ps(k, a.g32 + i);
}
template <bool kBf16Grad>
PRIMECFG_AVX512_INLINE __m512 load_grad(const SignArgs& a, std::int64_t i) {
  if constexpr (kBf16Grad)
    return load_bf16(a.g16 + i);
  else
    return _mm512_loadu_ps(a.g32 + i);
}
template <bool kBf16Grad>
PRIMECFG_AVX512_INLINE __m512 load_grad(const SignArgs& a, std::int64_t i, __mmask16 k) {
  if constexpr (kBf16Grad)
    return load_bf16(a.g16 + i, k);
  else
    return _mm512_maskz_loadu_ps(k, a.g32 + i);
}

// Software prefetch of `lines` cache lines from `element` on (the address is computed as an
// integer: a prefetch past the end of a buffer is harmless, a pointer formed there would not be).
// One main-loop step covers 32 elements: two cache lines of an fp32 stream, one of a bf16 stream.
PRIMECFG_AVX512_INLINE void prefetch_lines(const void* base, std::int64_t element,
                                           std::int64_t bytes_per_element, int lines) {
  const auto at =
      reinterpret_cast<std::uintptr_t>(base) + static_cast<std::uintptr_t>(element * bytes_per_element);
  for (int l = 0; l < lines; ++l) _mm_prefetch(reinterpret_cast<const char*>(at + 64u * l), _MM_HINT_T0);
}
template <bool kBf16Grad, class Args>
PRIMECFG_AVX512_INLINE void prefetch_grad(const Args& a, std::int64_t element) {
  if constexpr (kBf16Grad)
    prefetch_lines(a.g16, element, 2, 1);
  else
    prefetch_lines(a.g32, element, 4, 2);
}

struct AdamWVec {
  __m512 scale, decay, omb1, b2, omb2, neg_step, inv_bc2, eps;
};

PRIMECFG_AVX512_INLINE AdamWVec broadcast(const AdamWConsts& c) {
  return {_mm512_set1_ps(c.scale),        _mm512_set1_ps(c.decay),        _mm512_set1_ps(c.one_minus_b1),
          _mm512_set1_ps(c.b2),           _mm512_set1_ps(c.one_minus_b2), _mm512_set1_ps(c.neg_step_size),
          _mm512_set1_ps(c.inv_bc2_sqrt), _mm512_set1_ps(c.eps)};
}

// The vector form of adamw_element: same operations, same order.
PRIMECFG_AVX512_INLINE __m512 adamw_math(__m512& p, __m512& m, __m512& v, __m512 g, const AdamWVec& k) {
  g = _mm512_mul_ps(g, k.scale);
  __m512 pp = _mm512_mul_ps(p, k.decay);
  m = _mm512_fmadd_ps(k.omb1, _mm512_sub_ps(g, m), m);
  v = _mm512_fmadd_ps(k.b2, v, _mm512_mul_ps(k.omb2, _mm512_mul_ps(g, g)));
  const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(v), k.inv_bc2, k.eps);
  pp = _mm512_fmadd_ps(k.neg_step, _mm512_div_ps(m, denom), pp);
  p = pp;
  return pp;
}

template <bool kBf16Grad, bool kOut>
PRIMECFG_AVX512_INLINE void adamw_masked(const AdamWArgs& a, const AdamWVec& k, std::int64_t i,
                                         __mmask16 mk) {
  __m512 p = _mm512_maskz_loadu_ps(mk, a.p + i);
  __m512 m = _mm512_maskz_loadu_ps(mk, a.m + i);
  __m512 v = _mm512_maskz_loadu_ps(mk, a.v + i);
  const __m512 g = load_grad<kBf16Grad>(a, i, mk);
  adamw_math(p, m, v, g, k);
  _mm512_mask_storeu_ps(a.p + i, mk, p);
  _mm512_mask_storeu_ps(a.m + i, mk, m);
  _mm512_mask_storeu_ps(a.v + i, mk, v);
  if constexpr (kOut) _mm256_mask_storeu_epi16(a.out + i, mk, to_bf16(p));
}

template <bool kBf16Grad, bool kOut>
PRIMECFG_AVX512_INLINE __m256i adamw_full(const AdamWArgs& a, const AdamWVec& k, std::int64_t i) {
  __m512 p = _mm512_loadu_ps(a.p + i);
  __m512 m = _mm512_loadu_ps(a.m + i);
  __m512 v = _mm512_loadu_ps(a.v + i);
  const __m512 g = load_grad<kBf16Grad>(a, i);
  adamw_math(p, m, v, g, k);
  _mm512_storeu_ps(a.p + i, p);
  _mm512_storeu_ps(a.m + i, m);
  _mm512_storeu_ps(a.v + i, v);
  if constexpr (kOut)
    return to_bf16(p);
  else
    return _mm256_setzero_si256();
}

template <bool kBf16Grad>
PRIMECFG_AVX512_INLINE void adamw_prefetch(const AdamWArgs& a, std::int64_t at) {
  prefetch_lines(a.p, at, 4, 2);
  prefetch_lines(a.m, at, 4, 2);
  prefetch_lines(a.v, at, 4, 2);
  prefetch_grad<kBf16Grad>(a, at);
}

// Elements [i, end) with masked 16-lane steps (heads before the aligned loop and tails).
template <bool kBf16Grad, bool kOut>
PRIMECFG_AVX512_INLINE void adamw_span_masked(const AdamWArgs& a, const AdamWVec& k, std::int64_t i,
                                              std::int64_t end) {
  for (; i < end; i += kLanes) {
    const std::int64_t count = end - i < kLanes ? end - i : kLanes;
    adamw_masked<kBf16Grad, kOut>(a, k, i, tail_mask(count));
  }
}

template <bool kBf16Grad, bool kOut>
PRIMECFG_AVX512 void adamw_impl(const AdamWArgs& a) {
  const AdamWVec k = broadcast(a.c);
  const std::int64_t n = a.n;
  std::int64_t i = 0;
  bool stream = false;
  if constexpr (kOut) {
    // Peel until the bf16 output is 64-byte aligned, then write whole cache lines.
    const auto addr = reinterpret_cast<std::uintptr_t>(a.out);
    std::int64_t head = static_cast<std::int64_t>(((64 - (addr & 63)) & 63) / 2);
    if ((addr & 1) != 0 || head > n) head = n;
    adamw_span_masked<kBf16Grad, kOut>(a, k, 0, head);
    i = head;
    stream = (addr & 1) == 0 && use_streaming_stores(n - head);
  }
  const std::int64_t main_end = i + (n - i) / (2 * kLanes) * (2 * kLanes);
  const std::int64_t ahead = prefetch_elements();
  if (stream) {
    for (; i < main_end; i += 2 * kLanes) {
      if (ahead != 0 && i + ahead < n) adamw_prefetch<kBf16Grad>(a, i + ahead);
      const __m256i lo = adamw_full<kBf16Grad, kOut>(a, k, i);
      const __m256i hi = adamw_full<kBf16Grad, kOut>(a, k, i + kLanes);
      _mm512_stream_si512(reinterpret_cast<__m512i*>(a.out + i),
                          _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
    }
    _mm_sfence();
  } else {
    for (; i < main_end; i += 2 * kLanes) {
      if (ahead != 0 && i + ahead < n) adamw_prefetch<kBf16Grad>(a, i + ahead);
      const __m256i lo = adamw_full<kBf16Grad, kOut>(a, k, i);
      const __m256i hi = adamw_full<kBf16Grad, kOut>(a, k, i + kLanes);
      if constexpr (kOut) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.out + i), lo);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.out + i + kLanes), hi);
      }
    }
  }
  adamw_span_masked<kBf16Grad, kOut>(a, k, i, n);
}

struct SignVec {
  __m512 scale, decay, lr, one;
  __m512i sign_bit;
  __m512 zero;
};

PRIMECFG_AVX512_INLINE __m512 sign_math(__m512 p, __m512 g, const SignVec& k) {
  g = _mm512_mul_ps(g, k.scale);
  // +-1 with the sign of g, 0 where g == 0, g itself where g is NaN.
  // (AVX512F has no float and/or; use the integer forms.)
  __m512 s = _mm512_castsi512_ps(
      _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(g), k.sign_bit), _mm512_castps_si512(k.one)));
  s = _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(g, k.zero, _CMP_EQ_OQ), k.zero);
  s = _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(g, g, _CMP_UNORD_Q), g);
  const __m512 shrunk = _mm512_mul_ps(p, k.decay);
  const __m512 delta = _mm512_mul_ps(k.lr, s);
  return _mm512_sub_ps(shrunk, delta);
}

template <bool kBf16Grad, bool kOut>
PRIMECFG_AVX512_INLINE void sign_masked(const SignArgs& a, const SignVec& k, std::int64_t i, __mmask16 mk) {
  const __m512 p = sign_math(_mm512_maskz_loadu_ps(mk, a.p + i), load_grad<kBf16Grad>(a, i, mk), k);
  _mm512_mask_storeu_ps(a.p + i, mk, p);
  if constexpr (kOut) _mm256_mask_storeu_epi16(a.out + i, mk, to_bf16(p));
}

template <bool kBf16Grad, bool kOut>
PRIMECFG_AVX512_INLINE __m256i sign_full(const SignArgs& a, const SignVec& k, std::int64_t i) {
  const __m512 p = sign_math(_mm512_loadu_ps(a.p + i), load_grad<kBf16Grad>(a, i), k);
  _mm512_storeu_ps(a.p + i, p);
  if constexpr (kOut)
    return to_bf16(p);
  else
    return _mm256_setzero_si256();
}

template <bool kBf16Grad>
PRIMECFG_AVX512_INLINE void sign_prefetch(const SignArgs& a, std::int64_t at) {
  prefetch_lines(a.p, at, 4, 2);
  prefetch_grad<kBf16Grad>(a, at);
}

template <bool kBf16Grad, bool kOut>
PRIMECFG_AVX512_INLINE void sign_span_masked(const SignArgs& a, const SignVec& k, std::int64_t i,
                                             std::int64_t end) {
  for (; i < end; i += kLanes) {
    const std::int64_t count = end - i < kLanes ? end - i : kLanes;
    sign_masked<kBf16Grad, kOut>(a, k, i, tail_mask(count));
  }
}

template <bool kBf16Grad, bool kOut>
PRIMECFG_AVX512 void sign_impl(const SignArgs& a) {
  const SignVec k{_mm512_set1_ps(a.c.scale),
                  _mm512_set1_ps(a.c.decay),
                  _mm512_set1_ps(a.c.lr),
                  _mm512_set1_ps(1.0f),
                  _mm512_set1_epi32(static_cast<int>(0x80000000u)),
                  _mm512_setzero_ps()};
  const std::int64_t n = a.n;
  std::int64_t i = 0;
  bool stream = false;
  if constexpr (kOut) {
    const auto addr = reinterpret_cast<std::uintptr_t>(a.out);
    std::int64_t head = static_cast<std::int64_t>(((64 - (addr & 63)) & 63) / 2);
    if ((addr & 1) != 0 || head > n) head = n;
    sign_span_masked<kBf16Grad, kOut>(a, k, 0, head);
    i = head;
    stream = (addr & 1) == 0 && use_streaming_stores(n - head);
  }
  const std::int64_t main_end = i + (n - i) / (2 * kLanes) * (2 * kLanes);
  const std::int64_t ahead = prefetch_elements();
  if (stream) {
    for (; i < main_end; i += 2 * kLanes) {
      if (ahead != 0 && i + ahead < n) sign_prefetch<kBf16Grad>(a, i + ahead);
      const __m256i lo = sign_full<kBf16Grad, kOut>(a, k, i);
      const __m256i hi = sign_full<kBf16Grad, kOut>(a, k, i + kLanes);
      _mm512_stream_si512(reinterpret_cast<__m512i*>(a.out + i),
                          _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
    }
    _mm_sfence();
  } else {
    for (; i < main_end; i += 2 * kLanes) {
      if (ahead != 0 && i + ahead < n) sign_prefetch<kBf16Grad>(a, i + ahead);
      const __m256i lo = sign_full<kBf16Grad, kOut>(a, k, i);
      const __m256i hi = sign_full<kBf16Grad, kOut>(a, k, i + kLanes);
      if constexpr (kOut) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.out + i), lo);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.out + i + kLanes), hi);
      }
    }
  }
  sign_span_masked<kBf16Grad, kOut>(a, k, i, n);
}

}  // namespace

PRIMECFG_AVX512 void adamw_avx512(const AdamWArgs& a) {
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

PRIMECFG_AVX512 void sign_sgd_avx512(const SignArgs& a) {
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

PRIMECFG_AVX512 void to_bf16_avx512(const float* in, std::uint16_t* out, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), to_bf16(_mm512_loadu_ps(in + i)));
  }
  if (i < n) {
    const __mmask16 k = tail_mask(n - i);
    _mm256_mask_storeu_epi16(out + i, k, to_bf16(_mm512_maskz_loadu_ps(k, in + i)));
  }
}

}  // namespace primecfg::train::cpu::detail
