// QK-norm and rotary embedding in one pass (norm_rope.hpp). One warp per token, looping
// over its heads: the token's cos and sin (and the norm weight) are loaded once into
// registers and serve every head. Lane i holds the rotation's pairs (p, p + dim / 2) for
// p = i, i + 32, ..., so the rotation never leaves the lane and all 32 lanes work at
// head_dim 64 or 128 (the row kernels of rms_norm.cu give a row of 128 values 16 lanes).
// Scalar 2-byte loads, consecutive across the warp: any alignment, any even dim.
#include "device.cuh"
#include "norm_rope.hpp"

#include <algorithm>

namespace primecfg::train::kernels {
namespace {

using detail::warp_sum;

constexpr int kWarpsPerBlock = 4;
// Blocks of the backward pass, which walks tokens grid-stride and leaves one row of the
// weight gradient's partial sums per block: several per SM of an H200 (132).
constexpr int kBackwardBlocks = 1056;

__device__ inline float f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline __nv_bfloat16 b16(float v) { return __float2bfloat16_rn(v); }

// The token's tables and the weight, for pairs p = k * 32 + lane < half (zero beyond).
template <int KP>
struct Tables {
  float cos_lo[KP], cos_hi[KP], sin_lo[KP], sin_hi[KP], w_lo[KP], w_hi[KP];

  __device__ void load(const __nv_bfloat16* cos, const __nv_bfloat16* sin, const __nv_bfloat16* w,
                       std::int64_t token, int dim, int lane) {
    const int half = dim / 2;
    const std::int64_t t = token * dim;
#pragma unroll
    for (int k = 0; k < KP; ++k) {
      const int p = k * 32 + lane;
      const bool in = p < half;
      cos_lo[k] = in ? f32(cos[t + p]) : 0.f;
      cos_hi[k] = in ? f32(cos[t + p + half]) : 0.f;
      sin_lo[k] = in ? f32(sin[t + p]) : 0.f;
      sin_hi[k] = in ? f32(sin[t + p + half]) : 0.f;
      w_lo[k] = in && w ? f32(w[p]) : 1.f;
      w_hi[k] = in && w ? f32(w[p + half]) : 1.f;
    }
  }
};

// Rows of one token taken together: their loads are all issued before the first row's
// sum over the warp, so that a warp has several rows' reads in flight, not one.
template <int KP>
constexpr int kRowsAtOnce = KP >= 4 ? 1 : 4 / KP;

template <int KP>
__global__ void norm_rope_forward_kernel(const __nv_bfloat16* __restrict__ x,
                                         const __nv_bfloat16* __restrict__ w,
                                         const __nv_bfloat16* __restrict__ cos,
                                         const __nv_bfloat16* __restrict__ sin, __nv_bfloat16* __restrict__ y,
                                         float* __restrict__ rstd, std::int64_t tokens, int heads, int dim,
                                         float eps) {
  constexpr int U = kRowsAtOnce<KP>;
  const std::int64_t token = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (token >= tokens) return;
  const int half = dim / 2;
  Tables<KP> tab;
  tab.load(cos, sin, w, token, dim, lane);
  for (int h0 = 0; h0 < heads; h0 += U) {
    float lo[U][KP], hi[U][KP];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const std::int64_t off = (token * heads + h0 + u) * dim;
#pragma unroll
      for (int k = 0; k < KP; ++k) {
        const int p = k * 32 + lane;
        const bool in = p < half && h0 + u < heads;
        lo[u][k] = in ? f32(x[off + p]) : 0.f;
        hi[u][k] = in ? f32(x[off + p + half]) : 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (h0 + u >= heads) break;  // the same for the whole warp
      const std::int64_t row = token * heads + h0 + u, off = row * dim;
      if (w) {  // the same for the whole warp
        float ss = 0.f;
#pragma unroll
        for (int k = 0; k < KP; ++k) ss += lo[u][k] * lo[u][k] + hi[u][k] * hi[u][k];
        ss = warp_sum(ss);
        const float r = rsqrtf(ss / static_cast<float>(dim) + eps);
        if (lane == 0) rstd[row] = r;
#pragma unroll
        for (int k = 0; k < KP; ++k) {
          lo[u][k] = lo[u][k] * r * tab.w_lo[k];  // (x * rstd) * w, as at::rms_norm
          hi[u][k] = hi[u][k] * r * tab.w_hi[k];
        }
      }
#pragma unroll
      for (int k = 0; k < KP; ++k) {
        const int p = k * 32 + lane;
        if (p < half) {
          y[off + p] = b16(lo[u][k] * tab.cos_lo[k] - hi[u][k] * tab.sin_lo[k]);
          y[off + p + half] = b16(hi[u][k] * tab.cos_hi[k] + lo[u][k] * tab.sin_hi[k]);
        }
      }
    }
  }
}

// dx, and the weight gradient's partial sums: each lane keeps its columns' share of
// sum(dn * x * rstd) over the rows its warp walked; the block adds its warps' shares in a
// fixed order and writes partial[blockIdx.x, :] for detail::column_sums_kernel.
template <int KP>
__global__ void norm_rope_backward_kernel(const __nv_bfloat16* __restrict__ dy,
                                          const __nv_bfloat16* __restrict__ x,
                                          const __nv_bfloat16* __restrict__ w, const float* __restrict__ rstd,
                                          const __nv_bfloat16* __restrict__ cos,
                                          const __nv_bfloat16* __restrict__ sin,
                                          __nv_bfloat16* __restrict__ dx, float* __restrict__ partial,
                                          std::int64_t tokens, int heads, int dim) {
  __shared__ float block_dw[kNormRopeMaxDim];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int half = dim / 2;
  float acc_lo[KP], acc_hi[KP];
#pragma unroll
  for (int k = 0; k < KP; ++k) acc_lo[k] = acc_hi[k] = 0.f;
  constexpr int U = kRowsAtOnce<KP>;
  for (std::int64_t token = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + warp; token < tokens;
       token += static_cast<std::int64_t>(gridDim.x) * kWarpsPerBlock) {
    Tables<KP> tab;
    tab.load(cos, sin, w, token, dim, lane);
    for (int h0 = 0; h0 < heads; h0 += U) {
      // The gradient reaching n (the rotation transposed) and x, for U rows.
      float g_lo[U][KP], g_hi[U][KP], a_lo[U][KP], a_hi[U][KP], r[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const bool row_in = h0 + u < heads;
        const std::int64_t row = token * heads + h0 + u, off = row * dim;
        r[u] = w && row_in ? rstd[row] : 0.f;
#pragma unroll
        for (int k = 0; k < KP; ++k) {
          const int p = k * 32 + lane;
          const bool in = p < half && row_in;
          const float d_lo = in ? f32(dy[off + p]) : 0.f;
          const float d_hi = in ? f32(dy[off + p + half]) : 0.f;
          g_lo[u][k] = d_lo * tab.cos_lo[k] + d_hi * tab.sin_hi[k];
          g_hi[u][k] = d_hi * tab.cos_hi[k] - d_lo * tab.sin_lo[k];
          a_lo[u][k] = in && w ? f32(x[off + p]) : 0.f;
          a_hi[u][k] = in && w ? f32(x[off + p + half]) : 0.f;
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (h0 + u >= heads) break;  // the same for the whole warp
        const std::int64_t off = (token * heads + h0 + u) * dim;
        if (w) {          // the same for the whole warp
          float s = 0.f;  // sum of w * dn * x over the row
#pragma unroll
          for (int k = 0; k < KP; ++k) {
            acc_lo[k] += g_lo[u][k] * a_lo[u][k] * r[u];
            acc_hi[k] += g_hi[u][k] * a_hi[u][k] * r[u];
            g_lo[u][k] *= tab.w_lo[k];
            g_hi[u][k] *= tab.w_hi[k];
            s += g_lo[u][k] * a_lo[u][k] + g_hi[u][k] * a_hi[u][k];
          }
          s = warp_sum(s);
          const float kk = s * r[u] * r[u] * r[u] / static_cast<float>(dim);
#pragma unroll
          for (int k = 0; k < KP; ++k) {
            g_lo[u][k] = r[u] * g_lo[u][k] - kk * a_lo[u][k];
            g_hi[u][k] = r[u] * g_hi[u][k] - kk * a_hi[u][k];
          }
        }
#pragma unroll
        for (int k = 0; k < KP; ++k) {
          const int p = k * 32 + lane;
          if (p < half) {
            dx[off + p] = b16(g_lo[u][k]);
            dx[off + p + half] = b16(g_hi[u][k]);
          }
        }
      }
    }
  }
  if (!partial) return;  // the same for every thread of the block
  for (int c = threadIdx.x; c < dim; c += blockDim.x) block_dw[c] = 0.f;
  __syncthreads();
  for (int turn = 0; turn < kWarpsPerBlock; ++turn) {
    if (warp == turn) {
#pragma unroll
      for (int k = 0; k < KP; ++k) {
        const int p = k * 32 + lane;
        if (p < half) {
          block_dw[p] += acc_lo[k];
          block_dw[p + half] += acc_hi[k];
        }
      }
    }
    __syncthreads();
  }
  for (int c = threadIdx.x; c < dim; c += blockDim.x)
    partial[static_cast<std::int64_t>(blockIdx.x) * dim + c] = block_dw[c];
}

// Pairs per lane: the smallest of 1, 2, 4, 8 with dim / 2 <= 32 * KP; 0 if none.
int pairs_per_lane(int dim) {
  for (int k = 1; k <= 8; k *= 2)
    if (dim / 2 <= 32 * k) return k;
  return 0;
}

void check_shape(int dim) {
  if (dim <= 0 || dim % 2 != 0 || dim > kNormRopeMaxDim)
    throw std::runtime_error("norm_rope: head_dim " + std::to_string(dim) + " is not even and at most " +
                             std::to_string(kNormRopeMaxDim));
}

unsigned backward_blocks(std::int64_t tokens) {
  return static_cast<unsigned>(std::max<std::int64_t>(
      1, std::min<std::int64_t>(kBackwardBlocks, (tokens + kWarpsPerBlock - 1) / kWarpsPerBlock)));
}

}  // namespace

void norm_rope_forward(const bf16* x, const bf16* w, const bf16* cos, const bf16* sin, bf16* y, float* rstd,
                       std::int64_t tokens, int heads, int dim, float eps, cudaStream_t stream) {
  check_shape(dim);
  if (tokens == 0 || heads == 0) return;
  const unsigned grid = static_cast<unsigned>((tokens + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const unsigned block = 32 * kWarpsPerBlock;
  const auto *xd = detail::dev(x), *wd = w ? detail::dev(w) : nullptr, *cd = detail::dev(cos),
             *sd = detail::dev(sin);
  auto* yd = detail::dev(y);
  switch (pairs_per_lane(dim)) {
    case 1:
      norm_rope_forward_kernel<1>
          <<<grid, block, 0, stream>>>(xd, wd, cd, sd, yd, rstd, tokens, heads, dim, eps);
      break;
    case 2:
      norm_rope_forward_kernel<2>
          <<<grid, block, 0, stream>>>(xd, wd, cd, sd, yd, rstd, tokens, heads, dim, eps);
      break;
    case 4:
      norm_rope_forward_kernel<4>
          <<<grid, block, 0, stream>>>(xd, wd, cd, sd, yd, rstd, tokens, heads, dim, eps);
      break;
    default:
      norm_rope_forward_kernel<8>
          <<<grid, block, 0, stream>>>(xd, wd, cd, sd, yd, rstd, tokens, heads, dim, eps);
  }
  detail::check_launch("norm_rope_forward");
}

std::int64_t norm_rope_backward_workspace(std::int64_t tokens, int dim) {
  return static_cast<std::int64_t>(backward_blocks(tokens)) * dim;
}

void norm_rope_backward(const bf16* dy, const bf16* x, const bf16* w, const float* rstd, const bf16* cos,
                        const bf16* sin, bf16* dx, bf16* dw, float* workspace, std::int64_t tokens, int heads,
                        int dim, cudaStream_t stream) {
  check_shape(dim);
  if (tokens == 0 || heads == 0) {
    if (dw) cudaMemsetAsync(dw, 0, sizeof(bf16) * static_cast<std::size_t>(dim), stream);
    detail::check_launch("norm_rope_backward (an empty batch's dw)");
    return;
  }
  const unsigned grid = backward_blocks(tokens), block = 32 * kWarpsPerBlock;
  const auto *dyd = detail::dev(dy), *xd = detail::dev(x), *wd = w ? detail::dev(w) : nullptr,
             *cd = detail::dev(cos), *sd = detail::dev(sin);
  auto* dxd = detail::dev(dx);
  float* partial = w && dw ? workspace : nullptr;
  switch (pairs_per_lane(dim)) {
    case 1:
      norm_rope_backward_kernel<1>
          <<<grid, block, 0, stream>>>(dyd, xd, wd, rstd, cd, sd, dxd, partial, tokens, heads, dim);
      break;
    case 2:
      norm_rope_backward_kernel<2>
          <<<grid, block, 0, stream>>>(dyd, xd, wd, rstd, cd, sd, dxd, partial, tokens, heads, dim);
      break;
    case 4:
      norm_rope_backward_kernel<4>
          <<<grid, block, 0, stream>>>(dyd, xd, wd, rstd, cd, sd, dxd, partial, tokens, heads, dim);
      break;
    default:
      norm_rope_backward_kernel<8>
          <<<grid, block, 0, stream>>>(dyd, xd, wd, rstd, cd, sd, dxd, partial, tokens, heads, dim);
  }
  detail::check_launch("norm_rope_backward (dx and dw partial sums)");
  if (!partial) return;
  detail::column_sums_kernel<<<(dim + 31) / 32, dim3(32, 32), 0, stream>>>(workspace, detail::dev(dw),
                                                                           static_cast<int>(grid), dim);
  detail::check_launch("norm_rope_backward (dw reduction)");
}

}  // namespace primecfg::train::kernels
