// FP8 blockwise casts (fp8_cast.hpp). Memory-bound: each reads its bf16 input once from
// global memory (the 128 x 128 blocks twice, the second time from L2) and writes one byte
// per value and one scale per group.
#include "device.cuh"
#include "fp8_cast.hpp"

#include <cuda_fp8.h>

#include <algorithm>

namespace primecfg::train::kernels {
namespace {

using detail::dev;
using i64 = std::int64_t;

constexpr int kGroup = 128;
constexpr float kE4m3Max = 448.f;

// max(|a|, |b|) that keeps a NaN (fmaxf would drop it; ATen's amax keeps it).
__device__ inline float amax2(float a, float b) { return (a != a || a > b) ? a : b; }

__device__ inline float warp_amax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = amax2(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ inline float scale_of(float amax, float floor) { return amax2(__fdiv_rn(amax, kE4m3Max), floor); }

// Round to nearest even; SATFINITE clamps to +-448 (what the ATen path's clamp does) and
// keeps NaN.
__device__ inline std::uint8_t to_e4m3(float x, float scale) {
  return static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(__fdiv_rn(x, scale), __NV_SATFINITE, __NV_E4M3));
}

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// One warp per group of 128 values of a row; lane l reads elements l, l + 32, l + 64,
// l + 96 of the group (coalesced), zeros past the row's end.
__global__ void rows_kernel(const __nv_bfloat16* __restrict__ x, i64 rows, i64 cols,
                            std::uint8_t* __restrict__ values, float* __restrict__ scales, float floor) {
  const i64 groups = (cols + kGroup - 1) / kGroup;
  const int lane = threadIdx.x % 32;
  for (i64 g = static_cast<i64>(blockIdx.x) * kWarps + threadIdx.x / 32; g < rows * groups;
       g += static_cast<i64>(gridDim.x) * kWarps) {
    const i64 r = g / groups, c0 = (g % groups) * kGroup;
    const __nv_bfloat16* row = x + r * cols;
    float v[4];
    float m = 0.f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const i64 c = c0 + lane + 32 * k;
      v[k] = c < cols ? __bfloat162float(row[c]) : 0.f;
      m = amax2(m, fabsf(v[k]));
    }
    const float s = scale_of(warp_amax(m), floor);
    if (lane == 0) scales[g] = s;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const i64 c = c0 + lane + 32 * k;
      if (c < cols) values[r * cols + c] = to_e4m3(v[k], s);
    }
  }
}

// A tile of 128 rows x 64 columns of x per block: read along x's rows, amax per column
// (four threads of 32 rows each, then combined), written along the output's rows (x's
// columns) from shared memory.
constexpr int kTileCols = 64;

__global__ void cols_kernel(const __nv_bfloat16* __restrict__ x, i64 rows, i64 cols, i64 padded,
                            std::uint8_t* __restrict__ values, float* __restrict__ scales, float floor) {
  __shared__ float tile[kGroup][kTileCols + 1];
  __shared__ float part[4][kTileCols];
  __shared__ float scale[kTileCols];
  const i64 r0 = static_cast<i64>(blockIdx.y) * kGroup, c0 = static_cast<i64>(blockIdx.x) * kTileCols;
  for (int i = threadIdx.x; i < kGroup * kTileCols; i += kThreads) {
    const int r = i / kTileCols, c = i % kTileCols;
    tile[r][c] = (r0 + r < rows && c0 + c < cols) ? __bfloat162float(x[(r0 + r) * cols + c0 + c]) : 0.f;
  }
  __syncthreads();
  {
    const int c = threadIdx.x % kTileCols, q = threadIdx.x / kTileCols;  // 4 quarters of 32 rows
    float m = 0.f;
    for (int r = q * 32; r < q * 32 + 32; ++r) m = amax2(m, fabsf(tile[r][c]));
    part[q][c] = m;
  }
  __syncthreads();
  if (threadIdx.x < kTileCols) {
    const int c = threadIdx.x;
    const float s = scale_of(amax2(amax2(part[0][c], part[1][c]), amax2(part[2][c], part[3][c])), floor);
    scale[c] = s;
    if (c0 + c < cols) scales[(c0 + c) * (padded / kGroup) + blockIdx.y] = s;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kGroup * kTileCols; i += kThreads) {
    const int c = i / kGroup, r = i % kGroup;
    if (c0 + c < cols) values[(c0 + c) * padded + r0 + r] = to_e4m3(tile[r][c], scale[c]);
  }
}

// One block of 256 threads per 128 x 128 block: the amax in a first read, the values in a
// second (from L2). Thread t reads columns t % 128 of rows t / 128, t / 128 + 2, ...
__global__ void blocks_kernel(const __nv_bfloat16* __restrict__ w, i64 rows, i64 cols,
                              std::uint8_t* __restrict__ values, float* __restrict__ scales, float floor) {
  __shared__ float warp_max[kWarps];
  const i64 r0 = static_cast<i64>(blockIdx.y) * kGroup,
            c = static_cast<i64>(blockIdx.x) * kGroup + threadIdx.x % kGroup;
  const i64 r_end = min(r0 + kGroup, rows);
  const bool in_cols = c < cols;
  float m = 0.f;
  if (in_cols)
    for (i64 r = r0 + threadIdx.x / kGroup; r < r_end; r += kThreads / kGroup)
      m = amax2(m, fabsf(__bfloat162float(w[r * cols + c])));
  m = warp_amax(m);
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  m = warp_max[0];
#pragma unroll
  for (int k = 1; k < kWarps; ++k) m = amax2(m, warp_max[k]);
  const float s = scale_of(m, floor);
  if (threadIdx.x == 0) scales[static_cast<i64>(blockIdx.y) * gridDim.x + blockIdx.x] = s;
  if (in_cols)
    for (i64 r = r0 + threadIdx.x / kGroup; r < r_end; r += kThreads / kGroup)
      values[r * cols + c] = to_e4m3(__bfloat162float(w[r * cols + c]), s);
}

unsigned grid_of(i64 units, int per_block) {
  return static_cast<unsigned>(std::clamp<i64>((units + per_block - 1) / per_block, 1, 132 * 32));
}

}  // namespace

void fp8_quantize_rows(const bf16* x, i64 rows, i64 cols, float floor, std::uint8_t* values, float* scales,
                       cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const i64 groups = rows * ((cols + kGroup - 1) / kGroup);
  rows_kernel<<<grid_of(groups, kWarps), kThreads, 0, stream>>>(dev(x), rows, cols, values, scales, floor);
  detail::check_launch("fp8_quantize_rows");
}

void fp8_quantize_cols(const bf16* x, i64 rows, i64 cols, float floor, std::uint8_t* values, float* scales,
                       cudaStream_t stream) {
  const i64 padded = (rows + kGroup - 1) / kGroup * kGroup;
  if (padded == 0 || cols == 0) return;
  const dim3 grid(static_cast<unsigned>((cols + kTileCols - 1) / kTileCols),
                  static_cast<unsigned>(padded / kGroup));
  cols_kernel<<<grid, kThreads, 0, stream>>>(dev(x), rows, cols, padded, values, scales, floor);
  detail::check_launch("fp8_quantize_cols");
}

void fp8_quantize_blocks(const bf16* w, i64 rows, i64 cols, float floor, std::uint8_t* values, float* scales,
                         cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const dim3 grid(static_cast<unsigned>((cols + kGroup - 1) / kGroup),
                  static_cast<unsigned>((rows + kGroup - 1) / kGroup));
  blocks_kernel<<<grid, kThreads, 0, stream>>>(dev(w), rows, cols, values, scales, floor);
  detail::check_launch("fp8_quantize_blocks");
}

}  // namespace primecfg::train::kernels
