// Device-side helpers of the fused kernels (.cu files only): bf16 vectors of 16 bytes,
// warp sums and the launch check.
#pragma once

#include "launch.hpp"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace primecfg::train::kernels::detail {

// Eight bf16 values, one 16-byte load or store.
struct alignas(16) bf16x8 {
  __nv_bfloat162 v[4];
};

__device__ inline void load8(const __nv_bfloat16* p, float (&out)[8]) {
  const bf16x8 b = *reinterpret_cast<const bf16x8*>(p);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(b.v[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

__device__ inline void store8(__nv_bfloat16* p, const float (&in)[8]) {
  bf16x8 b;
#pragma unroll
  for (int i = 0; i < 4; ++i) b.v[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
  *reinterpret_cast<bf16x8*>(p) = b;
}

__device__ inline float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

inline const __nv_bfloat16* dev(const bf16* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }
inline __nv_bfloat16* dev(bf16* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

// Launch errors (a bad configuration) surface here, not at some later synchronisation.
inline void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// dw[c] = sum over chunks of partial[chunk, c], rounded once to bf16: the second pass of
// a weight gradient summed per block first (a fixed order: the same result every run,
// unlike atomics). Launch with grid (cols + 31) / 32 and block dim3(32, 32): 32 columns
// per block, 32 chunk lanes. Static: each .cu file has its own copy.
static __global__ void column_sums_kernel(const float* __restrict__ partial, __nv_bfloat16* __restrict__ dw,
                                          int chunks, int cols) {
  __shared__ float sums[32][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  float t = 0.f;
  if (col < cols)
    for (int k = threadIdx.y; k < chunks; k += 32) t += partial[static_cast<std::int64_t>(k) * cols + col];
  sums[threadIdx.y][threadIdx.x] = t;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    for (int l = 1; l < 32; ++l) t += sums[l][threadIdx.x];
    dw[col] = __float2bfloat16_rn(t);
  }
}

}  // namespace primecfg::train::kernels::detail
