// RMSNorm forward and backward (rms_norm.hpp). One warp per row (a row of 128 to a few
// thousand values: a block per row would leave most threads idle at head_dim 128). Rows
// of up to 1024 values (2048 forward), aligned, stay in registers, and the backward pass
// sums the weight gradient on the way, per block, reduced after; wider or unaligned rows
// are read twice, and their weight gradient comes from a column-parallel pass of its own.
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

// Rows of at most 32 * 8 * K values held in registers: lane i holds vectors i, i + 32, ...
// of 8 values each. One load per value (the loops above read a row twice) and all of a
// lane's loads in flight at once (K is known at compile time). Needs cols % 8 == 0 and
// 16-byte aligned rows.
template <int K>
__global__ void rms_norm_forward_rows_kernel(const __nv_bfloat16* __restrict__ x,
                                             const __nv_bfloat16* __restrict__ w,
                                             __nv_bfloat16* __restrict__ y, float* __restrict__ rstd,
                                             std::int64_t rows, int cols, float eps) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const std::int64_t off = row * cols;
  float v[K][8];
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int c = (k * 32 + lane) * 8;
    if (c < cols) {
      load8(x + off + c, v[k]);
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += v[k][i] * v[k][i];
    }
  }
  ss = warp_sum(ss);
  const float r = rsqrtf(ss / static_cast<float>(cols) + eps);
  if (lane == 0) rstd[row] = r;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int c = (k * 32 + lane) * 8;
    if (c < cols) {
      float g[8];
      load8(w + c, g);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[k][i] = v[k][i] * r * g[i];
      store8(y + off + c, v[k]);
    }
  }
}

// dx and the weight gradient's partial sums in one pass: each warp walks rows
// (grid-stride), keeping its lanes' share of sum(dy * x * rstd) in registers; the block
// adds its warps' shares in a fixed order (the same result every run) and writes one
// partial row, partial[blockIdx.x, :], for detail::column_sums_kernel.
template <int K>
__global__ void rms_norm_backward_rows_kernel(const __nv_bfloat16* __restrict__ dy,
                                              const __nv_bfloat16* __restrict__ x,
                                              const __nv_bfloat16* __restrict__ w,
                                              const float* __restrict__ rstd, __nv_bfloat16* __restrict__ dx,
                                              float* __restrict__ partial, std::int64_t rows, int cols) {
  __shared__ float block_dw[32 * 8 * K];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float acc[K][8];
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[k][i] = 0.f;
  for (std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + warp; row < rows;
       row += static_cast<std::int64_t>(gridDim.x) * kWarpsPerBlock) {
    const std::int64_t off = row * cols;
    float a[K][8], b[K][8];
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = (k * 32 + lane) * 8;
      if (c < cols) {
        float g[8];
        load8(dy + off + c, a[k]);
        load8(x + off + c, b[k]);
        load8(w + c, g);
#pragma unroll
        for (int i = 0; i < 8; ++i) s += a[k][i] * g[i] * b[k][i];
      }
    }
    s = warp_sum(s);
    const float r = rstd[row];
    const float kk = s * r * r * r / static_cast<float>(cols);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = (k * 32 + lane) * 8;
      if (c < cols) {
        float g[8], d[8];
        load8(w + c, g);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          d[i] = r * g[i] * a[k][i] - kk * b[k][i];
          acc[k][i] += a[k][i] * b[k][i] * r;
        }
        store8(dx + off + c, d);
      }
    }
  }
  if (!partial) return;  // the same for every thread of the block
  for (int c = threadIdx.x; c < cols; c += blockDim.x) block_dw[c] = 0.f;
  __syncthreads();
  for (int turn = 0; turn < kWarpsPerBlock; ++turn) {
    if (warp == turn) {
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int c = (k * 32 + lane) * 8;
        if (c < cols)
#pragma unroll
          for (int i = 0; i < 8; ++i) block_dw[c + i] += acc[k][i];
      }
    }
    __syncthreads();
  }
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    partial[static_cast<std::int64_t>(blockIdx.x) * cols + c] = block_dw[c];
}

// Vectors per lane for the register-resident kernels, 0 where the row is too wide for
// them (registers would spill): 1, 2 or 4 (up to 1024 values) backward, up to 8 forward.
int row_vectors(std::int64_t cols, int most) {
  for (int k = 1; k <= most; k *= 2)
    if (cols <= 32 * 8 * k) return k;
  return 0;
}

// Blocks of the fused backward: several per SM of an H200 (132), for loads in flight.
constexpr int kRowsBlocks = 1056;

unsigned rows_blocks_bwd(std::int64_t rows) {
  return static_cast<unsigned>(
      std::min<std::int64_t>(kRowsBlocks, (rows + kWarpsPerBlock - 1) / kWarpsPerBlock));
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
  const unsigned grid = row_blocks(rows), block = 32 * kWarpsPerBlock;
  const auto *xd = detail::dev(x), *wd = detail::dev(w);
  auto* yd = detail::dev(y);
  const bool vec = vectorizable(cols, {x, w, y});
  switch (vec ? row_vectors(cols, 8) : -1) {
    case 1:
      rms_norm_forward_rows_kernel<1><<<grid, block, 0, stream>>>(xd, wd, yd, rstd, rows, c, eps);
      break;
    case 2:
      rms_norm_forward_rows_kernel<2><<<grid, block, 0, stream>>>(xd, wd, yd, rstd, rows, c, eps);
      break;
    case 4:
      rms_norm_forward_rows_kernel<4><<<grid, block, 0, stream>>>(xd, wd, yd, rstd, rows, c, eps);
      break;
    case 8:
      rms_norm_forward_rows_kernel<8><<<grid, block, 0, stream>>>(xd, wd, yd, rstd, rows, c, eps);
      break;
    case 0:
      rms_norm_forward_kernel<8><<<grid, block, 0, stream>>>(xd, wd, yd, rstd, rows, c, eps);
      break;
    default:
      rms_norm_forward_kernel<1><<<grid, block, 0, stream>>>(xd, wd, yd, rstd, rows, c, eps);
  }
  detail::check_launch("rms_norm_forward");
}

std::int64_t rms_norm_backward_workspace(std::int64_t rows, std::int64_t cols) {
  // The most any path needs: which one runs is chosen at launch, by alignment.
  const DwShape a = dw_shape(rows, cols, 8), b = dw_shape(rows, cols, 1);
  const std::int64_t chunks = std::max<std::int64_t>({a.chunks, b.chunks, rows_blocks_bwd(rows)});
  return chunks * cols;
}

void rms_norm_backward(const bf16* dy, const bf16* x, const bf16* w, const float* rstd, bf16* dx, bf16* dw,
                       float* workspace, std::int64_t rows, std::int64_t cols, cudaStream_t stream) {
  const int c = static_cast<int>(cols);
  const bool vec = vectorizable(cols, {dy, x, w, dx});
  const auto *dyd = detail::dev(dy), *xd = detail::dev(x), *wd = detail::dev(w);
  auto* dxd = detail::dev(dx);
  float* partial = dw ? workspace : nullptr;
  const int k = vec && rows > 0 ? row_vectors(cols, 4) : 0;
  if (k > 0) {
    const unsigned grid = rows_blocks_bwd(rows), block = 32 * kWarpsPerBlock;
    if (k == 1)
      rms_norm_backward_rows_kernel<1><<<grid, block, 0, stream>>>(dyd, xd, wd, rstd, dxd, partial, rows, c);
    else if (k == 2)
      rms_norm_backward_rows_kernel<2><<<grid, block, 0, stream>>>(dyd, xd, wd, rstd, dxd, partial, rows, c);
    else
      rms_norm_backward_rows_kernel<4><<<grid, block, 0, stream>>>(dyd, xd, wd, rstd, dxd, partial, rows, c);
    detail::check_launch("rms_norm_backward (dx and dw partial sums)");
    if (!dw) return;
    detail::column_sums_kernel<<<(c + 31) / 32, dim3(32, 32), 0, stream>>>(workspace, detail::dev(dw),
                                                                           static_cast<int>(grid), c);
    detail::check_launch("rms_norm_backward (dw reduction)");
    return;
  }
  // Wide or unaligned rows: dx row by row, then the weight gradient column-parallel.
  if (rows > 0) {
    if (vec)
      rms_norm_dx_kernel<8>
          <<<row_blocks(rows), 32 * kWarpsPerBlock, 0, stream>>>(dyd, xd, wd, rstd, dxd, rows, c);
    else
      rms_norm_dx_kernel<1>
          <<<row_blocks(rows), 32 * kWarpsPerBlock, 0, stream>>>(dyd, xd, wd, rstd, dxd, rows, c);
    detail::check_launch("rms_norm_backward (dx)");
  }
  if (!dw) return;
  const DwShape s = dw_shape(rows, cols, vec ? 8 : 1);
  const dim3 grid(s.tiles, s.chunks);
  if (vec)
    rms_norm_dw_partial_kernel<8>
        <<<grid, kDwThreads, 0, stream>>>(dyd, xd, rstd, workspace, rows, c, s.groups, s.lanes);
  else
    rms_norm_dw_partial_kernel<1>
        <<<grid, kDwThreads, 0, stream>>>(dyd, xd, rstd, workspace, rows, c, s.groups, s.lanes);
  detail::check_launch("rms_norm_backward (dw partial sums)");
  detail::column_sums_kernel<<<(c + 31) / 32, dim3(32, 32), 0, stream>>>(workspace, detail::dev(dw), s.chunks,
                                                                         c);
  detail::check_launch("rms_norm_backward (dw reduction)");
}

}  // namespace primecfg::train::kernels
