// FP8 blockwise casts (fp8_cast.hpp). Memory-bound: one kernel reads its bf16 input once,
// a tile of 128 x 128 at a time into shared memory, and writes from there whichever casts
// were asked for, each along its output's rows (coalesced): a tile row is a 1 x 128 group,
// a tile column a 128 x 1 group (the transposed cast), the tile a 128 x 128 block.
#include "device.cuh"
#include "fp8_cast.hpp"

#include <cuda_fp8.h>

namespace primecfg::train::kernels {
namespace {

using detail::dev;
using i64 = std::int64_t;

constexpr int kGroup = 128;
constexpr float kE4m3Max = 448.f;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// bf16 per shared tile row: 65 words, so that the 32 lanes reading one column (rows
// lane, lane + 32, ...) hit 32 different banks.
constexpr int kPitch = kGroup + 2;

// max(|a|, |b|) that keeps a NaN (fmaxf would drop it; ATen's amax keeps it).
__device__ inline float amax2(float a, float b) { return (a != a || a > b) ? a : b; }

__device__ inline float warp_amax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = amax2(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ inline float scale_of(float amax, float floor) { return amax2(__fdiv_rn(amax, kE4m3Max), floor); }

// x / s, IEEE-rounded as the CPU's division, from r = 1 / s (IEEE-rounded): one product and
// Markstein's correction (the residual x - q s is exact in an FMA, and q + residual r is
// then the rounded quotient), not a division per value. Where the quotient or residual is
// subnormal it may differ from the division in its last bit; such a quotient is below
// 2^-126, far under e4m3's smallest value (2^-9), and casts to the same signed zero.
__device__ inline float quotient(float x, float s, float r) {
  const float q = __fmul_rn(x, r);
  return __fmaf_rn(__fmaf_rn(-q, s, x), r, q);
}

// Two values cast to e4m3 (round to nearest even; SATFINITE clamps to +-448, what the ATen
// path's clamp does, and keeps NaN): a in the low byte.
__device__ inline std::uint16_t to_e4m3x2(float a, float b, float s, float r) {
  return __nv_cvt_float2_to_fp8x2(make_float2(quotient(a, s, r), quotient(b, s, r)), __NV_SATFINITE,
                                  __NV_E4M3);
}

using Tile = __nv_bfloat16[kGroup][kPitch];

// A warp's 128 values, four a lane (v), cast with scale s, or with the warp's amax when
// s < 0 (the scale, returned, in `s`): value k of the lane in byte k of the result.
__device__ inline std::uint32_t cast4(const float (&v)[4], float& s, float floor) {
  if (s < 0.f) {
    float m = 0.f;
#pragma unroll
    for (int k = 0; k < 4; ++k) m = amax2(m, fabsf(v[k]));
    s = scale_of(warp_amax(m), floor);
  }
  const float rcp = __frcp_rn(s);
  return to_e4m3x2(v[0], v[1], s, rcp) | (std::uint32_t{to_e4m3x2(v[2], v[3], s, rcp)} << 16);
}

// Tile row r (128 values along x's row) cast with scale s, or with its own amax when
// s < 0, to out[0..128) (up to `n` of them); returns the scale. Lane l takes columns
// 4l..4l+3: two word reads, one 4-byte store when the row is whole and aligned.
__device__ inline float cast_tile_row(const Tile& t, int r, float s, float floor, std::uint8_t* out, i64 n,
                                      bool packed) {
  const int lane = threadIdx.x % 32;
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&t[r][4 * lane]));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&t[r][4 * lane + 2]));
  const float v[4] = {a.x, a.y, b.x, b.y};
  const std::uint32_t q = cast4(v, s, floor);
  if (packed) {
    *reinterpret_cast<std::uint32_t*>(out + 4 * lane) = q;
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (4 * lane + k < n) out[4 * lane + k] = static_cast<std::uint8_t>(q >> (8 * k));
  }
  return s;
}

// Tile column c (128 values down x's column) likewise, to out[0..128) (up to `n`). Lane l
// takes rows l, l + 32, l + 64, l + 96: conflict-free reads (kPitch), 32-byte stores.
__device__ inline float cast_tile_col(const Tile& t, int c, float s, float floor, std::uint8_t* out, i64 n) {
  const int lane = threadIdx.x % 32;
  float v[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) v[k] = __bfloat162float(t[lane + 32 * k][c]);
  const std::uint32_t q = cast4(v, s, floor);
#pragma unroll
  for (int k = 0; k < 4; ++k)
    if (lane + 32 * k < n) out[lane + 32 * k] = static_cast<std::uint8_t>(q >> (8 * k));
  return s;
}

// One block of 256 threads per 128 x 128 tile of x (grid: column tiles, row tiles). The
// tile is read once, with 16-byte loads where `vec` (x 16-byte aligned, cols a multiple
// of 8), zeros past x's edges; then each asked-for cast: warp w takes tile rows or
// columns w, w + 8, ...
__global__ void __launch_bounds__(kThreads)
    tile_kernel(const __nv_bfloat16* __restrict__ x, i64 rows, i64 cols, float floor, Fp8Casts o, bool vec) {
  __shared__ Tile t;
  __shared__ float warp_max[kWarps];
  const i64 r0 = static_cast<i64>(blockIdx.y) * kGroup, c0 = static_cast<i64>(blockIdx.x) * kGroup;
  const i64 n_rows = min(i64{kGroup}, rows - r0), n_cols = min(i64{kGroup}, cols - c0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (vec && n_rows == kGroup && n_cols == kGroup) {
    constexpr int kLoads = kGroup * kGroup / 8 / kThreads;  // 16-byte loads per thread, all in flight
    uint4 q[kLoads];
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      const int i = threadIdx.x + k * kThreads, r = i / (kGroup / 8), c = i % (kGroup / 8) * 8;
      q[k] = *reinterpret_cast<const uint4*>(x + (r0 + r) * cols + c0 + c);
    }
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      const int i = threadIdx.x + k * kThreads, r = i / (kGroup / 8), c = i % (kGroup / 8) * 8;
      auto* dst = reinterpret_cast<std::uint32_t*>(&t[r][c]);  // 4-byte aligned: kPitch is even
      dst[0] = q[k].x, dst[1] = q[k].y, dst[2] = q[k].z, dst[3] = q[k].w;
    }
  } else {
    for (int i = threadIdx.x; i < kGroup * kGroup; i += kThreads) {
      const int r = i / kGroup, c = i % kGroup;
      t[r][c] = (r < n_rows && c < n_cols) ? x[(r0 + r) * cols + c0 + c] : __float2bfloat16(0.f);
    }
  }
  __syncthreads();

  const i64 col_groups = (cols + kGroup - 1) / kGroup;
  // A 4-byte store per lane when the output row is whole and 4-byte aligned.
  const bool packed_rows = n_cols == kGroup && cols % 4 == 0;
  if (o.rows_values)
    for (int r = warp; r < n_rows; r += kWarps) {
      const float s =
          cast_tile_row(t, r, -1.f, floor, o.rows_values + (r0 + r) * cols + c0, n_cols, packed_rows);
      if (lane == 0) o.rows_scales[(r0 + r) * col_groups + blockIdx.x] = s;
    }
  if (o.cols_values) {
    const i64 padded = (rows + kGroup - 1) / kGroup * kGroup;
    for (int c = warp; c < n_cols; c += kWarps) {
      const float s = cast_tile_col(t, c, -1.f, floor, o.cols_values + (c0 + c) * padded + r0, kGroup);
      if (lane == 0) o.cols_scales[(c0 + c) * (padded / kGroup) + blockIdx.y] = s;
    }
  }
  if (o.block_values || o.block_t_values) {
    float m = 0.f;  // zeros past the edges leave the amax as it is
    for (int i = threadIdx.x; i < kGroup * kGroup; i += kThreads)
      m = amax2(m, fabsf(__bfloat162float(t[i / kGroup][i % kGroup])));
    m = warp_amax(m);
    if (lane == 0) warp_max[warp] = m;
    __syncthreads();
    m = warp_max[0];
#pragma unroll
    for (int k = 1; k < kWarps; ++k) m = amax2(m, warp_max[k]);
    const float s = scale_of(m, floor);
    if (o.block_values) {
      if (threadIdx.x == 0) o.block_scales[static_cast<i64>(blockIdx.y) * gridDim.x + blockIdx.x] = s;
      for (int r = warp; r < n_rows; r += kWarps)
        cast_tile_row(t, r, s, floor, o.block_values + (r0 + r) * cols + c0, n_cols, packed_rows);
    }
    if (o.block_t_values) {  // x^T [cols, rows]: its row c0 + c is the tile's column c
      if (threadIdx.x == 0) o.block_t_scales[static_cast<i64>(blockIdx.x) * gridDim.y + blockIdx.y] = s;
      for (int c = warp; c < n_cols; c += kWarps)
        cast_tile_col(t, c, s, floor, o.block_t_values + (c0 + c) * rows + r0, n_rows);
    }
  }
}

}  // namespace

void fp8_quantize(const bf16* x, i64 rows, i64 cols, float floor, const Fp8Casts& out, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const dim3 grid(static_cast<unsigned>((cols + kGroup - 1) / kGroup),
                  static_cast<unsigned>((rows + kGroup - 1) / kGroup));
  const bool vec = detail::aligned16(x) && cols % 8 == 0;
  tile_kernel<<<grid, kThreads, 0, stream>>>(dev(x), rows, cols, floor, out, vec);
  detail::check_launch("fp8_quantize");
}

}  // namespace primecfg::train::kernels
