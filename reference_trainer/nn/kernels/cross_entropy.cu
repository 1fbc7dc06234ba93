// Cross-entropy and its gradient in place (cross_entropy.hpp): one block per row; the
// first pass keeps a running maximum and a sum rescaled to it (one read of the row),
// the second writes the gradient over the logits. Rows of a multiple of 8 values at a
// 16-byte boundary take vector loads, any other the scalar path.
#include "cross_entropy.hpp"
#include "device.cuh"

#include <cmath>

namespace primecfg::train::kernels {
namespace {

using detail::load8;
using detail::store8;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

// (max, sum of exp(x - max)) of two parts of a row, as one.
__device__ inline void combine(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;  // both parts empty so far
  s = s * expf(m - mx) + s2 * expf(m2 - mx);
  m = mx;
}

template <int V>
__global__ void cross_entropy_grad_kernel(__nv_bfloat16* __restrict__ logits,
                                          const std::int64_t* __restrict__ targets, float* __restrict__ loss,
                                          std::int64_t vocab, float scale) {
  __nv_bfloat16* row = logits + static_cast<std::int64_t>(blockIdx.x) * vocab;
  const std::int64_t target = targets[blockIdx.x];

  // Pass 1: this thread's maximum and rescaled sum.
  float m = -INFINITY, s = 0.f;
  for (std::int64_t j = static_cast<std::int64_t>(threadIdx.x) * V; j < vocab; j += kThreads * V) {
    if constexpr (V == 8) {
      float x[8];
      load8(row + j, x);
      float mx = x[0];
#pragma unroll
      for (int k = 1; k < 8; ++k) mx = fmaxf(mx, x[k]);
      float part = 0.f;
#pragma unroll
      for (int k = 0; k < 8; ++k) part += expf(x[k] - mx);
      combine(m, s, mx, part);
    } else {
      combine(m, s, __bfloat162float(row[j]), 1.f);
    }
  }
  // The row's: across the warp, then across the warps.
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    combine(m, s, m2, s2);
  }
  __shared__ float warp_m[kWarps], warp_s[kWarps], row_lse;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    warp_m[warp] = m;
    warp_s[warp] = s;
  }
  __syncthreads();
  if (warp == 0) {
    m = lane < kWarps ? warp_m[lane] : -INFINITY;
    s = lane < kWarps ? warp_s[lane] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
      combine(m, s, m2, s2);
    }
    if (lane == 0) {
      row_lse = m + logf(s);
      const bool valid = target >= 0 && target < vocab;
      loss[blockIdx.x] = valid                    ? row_lse - __bfloat162float(row[valid ? target : 0])
                         : target == kIgnoreIndex ? 0.f
                                                  : NAN;
    }
  }
  __syncthreads();
  const float lse = row_lse;
  // An ignored token adds nothing: its gradient row is zero.
  const float row_scale = target == kIgnoreIndex ? 0.f : scale;

  // Pass 2: the gradient over the logits (the target's logit was read above, before this
  // pass overwrites it).
  for (std::int64_t j = static_cast<std::int64_t>(threadIdx.x) * V; j < vocab; j += kThreads * V) {
    if constexpr (V == 8) {
      float x[8];
      load8(row + j, x);
#pragma unroll
      for (int k = 0; k < 8; ++k) x[k] = row_scale * (expf(x[k] - lse) - (j + k == target ? 1.f : 0.f));
      store8(row + j, x);
    } else {
      const float p = expf(__bfloat162float(row[j]) - lse) - (j == target ? 1.f : 0.f);
      row[j] = __float2bfloat16_rn(row_scale * p);
    }
  }
}

}  // namespace

void cross_entropy_grad(bf16* logits, const std::int64_t* targets, float* loss, std::int64_t rows,
                        std::int64_t vocab, float scale, cudaStream_t stream) {
  if (rows == 0) return;
  if (vocab % 8 == 0 && detail::aligned16(logits))
    cross_entropy_grad_kernel<8><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        detail::dev(logits), targets, loss, vocab, scale);
  else
    cross_entropy_grad_kernel<1><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        detail::dev(logits), targets, loss, vocab, scale);
  detail::check_launch("cross_entropy_grad");
}

}  // namespace primecfg::train::kernels
