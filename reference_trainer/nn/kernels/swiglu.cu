// SwiGLU forward and backward (swiglu.hpp): elementwise, eight bf16 values per thread and
// iteration where the three pointers are 16-byte aligned and n % 8 == 0.
#include "device.cuh"
#include "swiglu.hpp"

#include <algorithm>

namespace primecfg::train::kernels {
namespace {

using detail::load8;
using detail::store8;

constexpr int kThreads = 256;

__device__ inline float sigmoid(float g) { return 1.f / (1.f + expf(-g)); }

__device__ inline float fwd(float g, float u) { return g * sigmoid(g) * u; }

__device__ inline void bwd(float d, float g, float u, float& dg, float& du) {
  const float s = sigmoid(g);
  du = d * g * s;
  dg = d * u * s * (1.f + g * (1.f - s));
}

template <int V>
__global__ void swiglu_forward_kernel(const __nv_bfloat16* __restrict__ gate,
                                      const __nv_bfloat16* __restrict__ up, __nv_bfloat16* __restrict__ out,
                                      std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x * V;
  for (std::int64_t i = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < n;
       i += stride) {
    if constexpr (V == 8) {
      float g[8], u[8];
      load8(gate + i, g);
      load8(up + i, u);
#pragma unroll
      for (int k = 0; k < 8; ++k) g[k] = fwd(g[k], u[k]);
      store8(out + i, g);
    } else {
      out[i] = __float2bfloat16_rn(fwd(__bfloat162float(gate[i]), __bfloat162float(up[i])));
    }
  }
}

template <int V>
__global__ void swiglu_backward_kernel(const __nv_bfloat16* __restrict__ dout,
                                       const __nv_bfloat16* __restrict__ gate,
                                       const __nv_bfloat16* __restrict__ up,
                                       __nv_bfloat16* __restrict__ dgate, __nv_bfloat16* __restrict__ dup,
                                       std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x * V;
  for (std::int64_t i = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < n;
       i += stride) {
    if constexpr (V == 8) {
      float d[8], g[8], u[8], dg[8], du[8];
      load8(dout + i, d);
      load8(gate + i, g);
      load8(up + i, u);
#pragma unroll
      for (int k = 0; k < 8; ++k) bwd(d[k], g[k], u[k], dg[k], du[k]);
      store8(dgate + i, dg);
      store8(dup + i, du);
    } else {
      float dg, du;
      bwd(__bfloat162float(dout[i]), __bfloat162float(gate[i]), __bfloat162float(up[i]), dg, du);
      dgate[i] = __float2bfloat16_rn(dg);
      dup[i] = __float2bfloat16_rn(du);
    }
  }
}

// Grid-stride loops over at most this many blocks (a few waves on an H200).
unsigned blocks(std::int64_t n, int v) {
  const std::int64_t needed = (n / v + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::clamp<std::int64_t>(needed, 1, 132 * 16));
}

bool vectorizable(std::int64_t n, std::initializer_list<const void*> ptrs) {
  if (n % 8 != 0) return false;
  for (const void* p : ptrs)
    if (!detail::aligned16(p)) return false;
  return true;
}

}  // namespace

void swiglu_forward(const bf16* gate, const bf16* up, bf16* out, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (vectorizable(n, {gate, up, out}))
    swiglu_forward_kernel<8>
        <<<blocks(n, 8), kThreads, 0, stream>>>(detail::dev(gate), detail::dev(up), detail::dev(out), n);
  else
    swiglu_forward_kernel<1>
        <<<blocks(n, 1), kThreads, 0, stream>>>(detail::dev(gate), detail::dev(up), detail::dev(out), n);
  detail::check_launch("swiglu_forward");
}

void swiglu_backward(const bf16* dout, const bf16* gate, const bf16* up, bf16* dgate, bf16* dup,
                     std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (vectorizable(n, {dout, gate, up, dgate, dup}))
    swiglu_backward_kernel<8><<<blocks(n, 8), kThreads, 0, stream>>>(
        detail::dev(dout), detail::dev(gate), detail::dev(up), detail::dev(dgate), detail::dev(dup), n);
  else
    swiglu_backward_kernel<1><<<blocks(n, 1), kThreads, 0, stream>>>(
        detail::dev(dout), detail::dev(gate), detail::dev(up), detail::dev(dgate), detail::dev(dup), n);
  detail::check_launch("swiglu_backward");
}

}  // namespace primecfg::train::kernels
