// RMSNorm forward and backward (rms_norm.hpp). One warp per row for the row-wise parts
// (a row of 128 to a few thousand values: a block per row would leave most threads idle
// at head_dim 128); the weight gradient in a column-parallel pass of its own, then a
// reduction of the per-block partial sums.
#include "device.cuh"
#include "rms_norm.hpp"

#include <algorithm>

namespace primecfg::train::kernels {
namespace {

using detail::load8;
using detail::store8;
using detail::warp_sum;

constexpr int kWarpsPerBlock = 4;
// Blocks of the weight-gradient pass: a few per SM of an H200 (132), enough to keep
// memory busy, few enough that the reduction over them stays small.
constexpr int kDwBlocks = 528;
constexpr int kDwThreads = 256;

// V = 8: rows are 16-byte aligned (cols % 8 == 0), lane i reads values [8i, 8i + 8) of
// each 256; V = 1: any cols, lane i reads values i, i + 32, ...
template <int V>
__global__ void rms_norm_forward_kernel(const __nv_bfloat16* __restrict__ x,
                                        const __nv_bfloat16* __restrict__ w, __nv_bfloat16* __restrict__ y,
                                        float* __restrict__ rstd, std::int64_t rows, int cols, float eps) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const __nv_bfloat16* xr = x + row * cols;
  __nv_bfloat16* yr = y + row * cols;
  float ss = 0.f;
  for (int c = lane * V; c < cols; c += 32 * V) {
    if constexpr (V == 8) {
      float v[8];
      load8(xr + c, v);
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += v[i] * v[i];
    } else {
      const float v = __bfloat162float(xr[c]);
      ss += v * v;
    }
  }
  ss = warp_sum(ss);
  const float r = rsqrtf(ss / static_cast<float>(cols) + eps);
  if (lane == 0) rstd[row] = r;
  // The second read of the row comes from L1: it was just loaded by this warp.
  for (int c = lane * V; c < cols; c += 32 * V) {
    if constexpr (V == 8) {
      float v[8], g[8];
      load8(xr + c, v);
      load8(w + c, g);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = v[i] * r * g[i];  // (x * rstd) * w, as at::rms_norm
      store8(yr + c, v);
    } else {
      yr[c] = __float2bfloat16_rn(__bfloat162float(xr[c]) * r * __bfloat162float(w[c]));
    }
  }
}

template <int V>
__global__ void rms_norm_dx_kernel(const __nv_bfloat16* __restrict__ dy, const __nv_bfloat16* __restrict__ x,
                                   const __nv_bfloat16* __restrict__ w, const float* __restrict__ rstd,
                                   __nv_bfloat16* __restrict__ dx, std::int64_t rows, int cols) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const std::int64_t off = row * cols;
  float s = 0.f;  // sum of w * dy * x over the row
  for (int c = lane * V; c < cols; c += 32 * V) {
    if constexpr (V == 8) {
      float a[8], b[8], g[8];
      load8(dy + off + c, a);
      load8(x + off + c, b);
      load8(w + c, g);
#pragma unroll
      for (int i = 0; i < 8; ++i) s += a[i] * g[i] * b[i];
    } else {
      s += __bfloat162float(dy[off + c]) * __bfloat162float(w[c]) * __bfloat162float(x[off + c]);
    }
  }
  s = warp_sum(s);
  const float r = rstd[row];
  const float k = s * r * r * r / static_cast<float>(cols);
  for (int c = lane * V; c < cols; c += 32 * V) {
    if constexpr (V == 8) {
      float a[8], b[8], g[8];
      load8(dy + off + c, a);
      load8(x + off + c, b);
      load8(w + c, g);
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] = r * g[i] * a[i] - k * b[i];
      store8(dx + off + c, a);
    } else {
      const float v =
          r * __bfloat162float(w[c]) * __bfloat162float(dy[off + c]) - k * __bfloat162float(x[off + c]);
      dx[off + c] = __float2bfloat16_rn(v);
    }
  }
}

// The layout of the weight-gradient pass: each block's threads split into `groups`
// column groups of V values (consecutive threads on consecutive columns: coalesced) times
// `lanes` row lanes; block (bx, by) covers column tile bx and every gridDim.y-th stripe of
// `lanes` rows starting at stripe by.
struct DwShape {
  int groups, lanes, tiles, chunks;
};

DwShape dw_shape(std::int64_t rows, std::int64_t cols, int v) {
  DwShape s;
  const std::int64_t col_groups = (cols + v - 1) / v;
  s.groups = static_cast<int>(std::min<std::int64_t>(kDwThreads, col_groups));
  s.lanes = kDwThreads / s.groups;
  s.tiles = static_cast<int>((col_groups + s.groups - 1) / s.groups);
  const std::int64_t stripes = (rows + s.lanes - 1) / s.lanes;
  s.chunks =
      static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(stripes, kDwBlocks / s.tiles)));
  return s;
}

template <int V>
__global__ void rms_norm_dw_partial_kernel(const __nv_bfloat16* __restrict__ dy,
                                           const __nv_bfloat16* __restrict__ x,
                                           const float* __restrict__ rstd, float* __restrict__ partial,
                                           std::int64_t rows, int cols, int groups, int lanes) {
  __shared__ float sums[kDwThreads * V];
  const int group = threadIdx.x % groups, lane = threadIdx.x / groups;
  const int col = (blockIdx.x * groups + group) * V;
  float acc[V];
#pragma unroll
  for (int i = 0; i < V; ++i) acc[i] = 0.f;
  if (lane < lanes && col < cols) {
    for (std::int64_t row = static_cast<std::int64_t>(blockIdx.y) * lanes + lane; row < rows;
         row += static_cast<std::int64_t>(gridDim.y) * lanes) {
      const float r = rstd[row];
      const std::int64_t off = row * cols + col;
      if constexpr (V == 8) {
        float a[8], b[8];
        load8(dy + off, a);
        load8(x + off, b);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] += a[i] * b[i] * r;
      } else {
        acc[0] += __bfloat162float(dy[off]) * __bfloat162float(x[off]) * r;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < V; ++i) sums[threadIdx.x * V + i] = acc[i];
  __syncthreads();
  if (lane == 0 && col < cols) {
    for (int i = 0; i < V; ++i) {
      float t = 0.f;
      for (int l = 0; l < lanes; ++l) t += sums[(l * groups + group) * V + i];
      partial[static_cast<std::int64_t>(blockIdx.y) * cols + col + i] = t;
    }
  }
}

// dw[c] = sum over chunks of partial[chunk, c]: 32 columns per block, 8 chunk lanes.
__global__ void rms_norm_dw_reduce_kernel(const float* __restrict__ partial, __nv_bfloat16* __restrict__ dw,
                                          int chunks, int cols) {
  __shared__ float sums[8][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  float t = 0.f;
  if (col < cols)
    for (int k = threadIdx.y; k < chunks; k += 8) t += partial[static_cast<std::int64_t>(k) * cols + col];
  sums[threadIdx.y][threadIdx.x] = t;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    for (int l = 1; l < 8; ++l) t += sums[l][threadIdx.x];
    dw[col] = __float2bfloat16_rn(t);
  }
}

bool vectorizable(std::int64_t cols, std::initializer_list<const void*> ptrs) {
  if (cols % 8 != 0) return false;
  for (const void* p : ptrs)
    if (p && !detail::aligned16(p)) return false;
  return true;
}

unsigned row_blocks(std::int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

void rms_norm_forward(const bf16* x, const bf16* w, bf16* y, float* rstd, std::int64_t rows,
                      std::int64_t cols, float eps, cudaStream_t stream) {
  if (rows == 0) return;
  const int c = static_cast<int>(cols);
  if (vectorizable(cols, {x, w, y}))
    rms_norm_forward_kernel<8><<<row_blocks(rows), 32 * kWarpsPerBlock, 0, stream>>>(
        detail::dev(x), detail::dev(w), detail::dev(y), rstd, rows, c, eps);
  else
    rms_norm_forward_kernel<1><<<row_blocks(rows), 32 * kWarpsPerBlock, 0, stream>>>(
        detail::dev(x), detail::dev(w), detail::dev(y), rstd, rows, c, eps);
  detail::check_launch("rms_norm_forward");
}

std::int64_t rms_norm_backward_workspace(std::int64_t rows, std::int64_t cols) {
  // The larger of the two layouts' needs: the vector one is chosen at launch, by alignment.
  const DwShape a = dw_shape(rows, cols, 8), b = dw_shape(rows, cols, 1);
  return std::max(a.chunks, b.chunks) * cols;
}

void rms_norm_backward(const bf16* dy, const bf16* x, const bf16* w, const float* rstd, bf16* dx, bf16* dw,
                       float* workspace, std::int64_t rows, std::int64_t cols, cudaStream_t stream) {
  const int c = static_cast<int>(cols);
  const bool vec = vectorizable(cols, {dy, x, w, dx});
  if (rows > 0) {
    if (vec)
      rms_norm_dx_kernel<8><<<row_blocks(rows), 32 * kWarpsPerBlock, 0, stream>>>(
          detail::dev(dy), detail::dev(x), detail::dev(w), rstd, detail::dev(dx), rows, c);
    else
      rms_norm_dx_kernel<1><<<row_blocks(rows), 32 * kWarpsPerBlock, 0, stream>>>(
          detail::dev(dy), detail::dev(x), detail::dev(w), rstd, detail::dev(dx), rows, c);
    detail::check_launch("rms_norm_backward (dx)");
  }
  if (!dw) return;
  const DwShape s = dw_shape(rows, cols, vec ? 8 : 1);
  const dim3 grid(s.tiles, s.chunks);
  if (vec)
    rms_norm_dw_partial_kernel<8><<<grid, kDwThreads, 0, stream>>>(detail::dev(dy), detail::dev(x), rstd,
                                                                   workspace, rows, c, s.groups, s.lanes);
  else
    rms_norm_dw_partial_kernel<1><<<grid, kDwThreads, 0, stream>>>(detail::dev(dy), detail::dev(x), rstd,
                                                                   workspace, rows, c, s.groups, s.lanes);
  detail::check_launch("rms_norm_backward (dw partial sums)");
  rms_norm_dw_reduce_kernel<<<(c + 31) / 32, dim3(32, 8), 0, stream>>>(workspace, detail::dev(dw), s.chunks,
                                                                       c);
  detail::check_launch("rms_norm_backward (dw reduction)");
}

}  // namespace primecfg::train::kernels
