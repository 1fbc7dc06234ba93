// AdamW over a table of parameters (adamw.hpp): one block per chunk of one parameter,
// four values per thread and iteration where the parameter's pointers allow.
#include "nn/kernels/device.cuh"
#include "optim/kernels/adamw.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

namespace primecfg::train::kernels {
namespace {

constexpr int kThreads = 256;

struct Table {
  const AdamWParam* params;
  const std::int64_t* offsets;  // count + 1
};

__device__ inline Table table_at(const void* table, int count) {
  const auto* params = static_cast<const AdamWParam*>(table);
  return {params, reinterpret_cast<const std::int64_t*>(params + count)};
}

// The parameter whose chunks hold chunk c: the last p with offsets[p] <= c.
__device__ inline int param_of(const Table& t, int count, std::int64_t c) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (t.offsets[mid] <= c)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// The block's sum of `v` (one value per thread) in a fixed order, valid in thread 0.
__device__ inline float block_sum(float v) {
  __shared__ float warps[kThreads / 32];
  v = detail::warp_sum(v);
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = v;
  __syncthreads();
  float t = 0.f;
  if (threadIdx.x == 0)
    for (int w = 0; w < kThreads / 32; ++w) t += warps[w];
  return t;
}

// _fused_adamw_'s arithmetic for one value (ATen's adam_math, ADAMW mode, no amsgrad,
// no maximize), written the same way so that nvcc contracts it the same way.
struct Update {
  float lr, beta1, beta2, weight_decay, eps, bias_correction1, bias_correction2_sqrt;

  __device__ inline void operator()(float& param, float grad, float& exp_avg, float& exp_avg_sq) const {
    if (weight_decay != 0) param -= lr * weight_decay * param;
    exp_avg = fmaf(beta1, exp_avg, fmaf(-beta1, grad, grad));
    exp_avg_sq = fmaf(beta2, exp_avg_sq, fmaf(-beta2, grad * grad, grad * grad));
    const float step_size = lr / bias_correction1;
    const float denom = (sqrtf(exp_avg_sq) / bias_correction2_sqrt) + eps;
    param -= step_size * exp_avg / denom;
  }
};

template <bool kUpdate>
__global__ void __launch_bounds__(kThreads)
    adamw_kernel(const void* table, int count, AdamWHyper h, const float* step, const float* grad_scale,
                 float* chunk_sq) {
  const Table t = table_at(table, count);
  const std::int64_t c = blockIdx.x;
  const int p = param_of(t, count, c);
  const AdamWParam P = t.params[p];
  const std::int64_t begin = (c - t.offsets[p]) * kAdamWChunk;
  const std::int64_t end = begin + kAdamWChunk < P.n ? begin + kAdamWChunk : P.n;
  const float scale = grad_scale ? *grad_scale : 1.f;
  Update u{};
  if constexpr (kUpdate) {
    const float s = *step;
    u = Update{
        h.lr, h.beta1, h.beta2, h.weight_decay, h.eps, 1 - powf(h.beta1, s), sqrtf(1 - powf(h.beta2, s))};
  }
  float sq = 0.f;
  if (P.vector) {
    for (std::int64_t i = begin + 4 * static_cast<std::int64_t>(threadIdx.x); i < end; i += 4 * kThreads) {
      float g[4];
      if (P.grad16) {
        const uint2 raw = *reinterpret_cast<const uint2*>(P.grad16 + i);
        const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
        const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
        g[0] = lo.x, g[1] = lo.y, g[2] = hi.x, g[3] = hi.y;
      } else {
        const float4 g4 = *reinterpret_cast<const float4*>(P.grad + i);
        g[0] = g4.x, g[1] = g4.y, g[2] = g4.z, g[3] = g4.w;
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) sq += g[k] * g[k];
      if constexpr (kUpdate) {
        float4 p4 = *reinterpret_cast<const float4*>(P.master + i);
        float4 a4 = *reinterpret_cast<const float4*>(P.exp_avg + i);
        float4 b4 = *reinterpret_cast<const float4*>(P.exp_avg_sq + i);
        float pv[4] = {p4.x, p4.y, p4.z, p4.w}, av[4] = {a4.x, a4.y, a4.z, a4.w},
              bv[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) u(pv[k], grad_scale ? g[k] * scale : g[k], av[k], bv[k]);
        *reinterpret_cast<float4*>(P.master + i) = make_float4(pv[0], pv[1], pv[2], pv[3]);
        *reinterpret_cast<float4*>(P.exp_avg + i) = make_float4(av[0], av[1], av[2], av[3]);
        *reinterpret_cast<float4*>(P.exp_avg_sq + i) = make_float4(bv[0], bv[1], bv[2], bv[3]);
        __nv_bfloat162 w[2] = {__floats2bfloat162_rn(pv[0], pv[1]), __floats2bfloat162_rn(pv[2], pv[3])};
        *reinterpret_cast<uint2*>(P.weight + i) = *reinterpret_cast<const uint2*>(w);
      }
    }
  } else {
    for (std::int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
      const float g =
          P.grad16 ? __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(P.grad16 + i)) : P.grad[i];
      sq += g * g;
      if constexpr (kUpdate) {
        float pv = P.master[i], av = P.exp_avg[i], bv = P.exp_avg_sq[i];
        u(pv, grad_scale ? g * scale : g, av, bv);
        P.master[i] = pv;
        P.exp_avg[i] = av;
        P.exp_avg_sq[i] = bv;
        const __nv_bfloat16 w = __float2bfloat16_rn(pv);
        P.weight[i] = *reinterpret_cast<const bf16*>(&w);
      }
    }
  }
  if (chunk_sq) {
    const float total = block_sum(sq);
    if (threadIdx.x == 0) chunk_sq[c] = total;
  }
}

__global__ void __launch_bounds__(kThreads)
    sum_chunks_kernel(const float* chunk_sq, std::int64_t chunks, double* total) {
  __shared__ double part[kThreads];
  double s = 0;
  for (std::int64_t i = threadIdx.x; i < chunks; i += kThreads) s += chunk_sq[i];
  part[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0;
    for (int k = 0; k < kThreads; ++k) t += part[k];
    *total = t;
  }
}

bool aligned(const void* p, std::uintptr_t a) { return reinterpret_cast<std::uintptr_t>(p) % a == 0; }

}  // namespace

std::int64_t adamw_chunks(const AdamWParam* params, int count) {
  std::int64_t chunks = 0;
  for (int p = 0; p < count; ++p) chunks += (params[p].n + kAdamWChunk - 1) / kAdamWChunk;
  return chunks;
}

std::size_t adamw_table(const AdamWParam* params, int count, void* out) {
  const std::size_t bytes = sizeof(AdamWParam) * count + sizeof(std::int64_t) * (count + 1);
  if (!out) return bytes;
  auto* table = static_cast<AdamWParam*>(out);
  auto* offsets = reinterpret_cast<std::int64_t*>(table + count);
  std::int64_t chunks = 0;
  for (int p = 0; p < count; ++p) {
    AdamWParam q = params[p];
    q.vector = q.n % 4 == 0 && aligned(q.master, 16) && aligned(q.grad, 16) && aligned(q.grad16, 8) &&
               aligned(q.exp_avg, 16) && aligned(q.exp_avg_sq, 16) && aligned(q.weight, 8);
    std::memcpy(table + p, &q, sizeof q);
    offsets[p] = chunks;
    chunks += (q.n + kAdamWChunk - 1) / kAdamWChunk;
  }
  offsets[count] = chunks;
  return bytes;
}

void adamw_grad_squares(const void* table, int count, std::int64_t chunks, float* chunk_sq,
                        cudaStream_t stream) {
  if (chunks == 0) return;
  adamw_kernel<false><<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(table, count, AdamWHyper{},
                                                                              nullptr, nullptr, chunk_sq);
  detail::check_launch("adamw_grad_squares");
}

void adamw_step(const void* table, int count, std::int64_t chunks, const AdamWHyper& hyper, const float* step,
                const float* grad_scale, float* chunk_sq, cudaStream_t stream) {
  if (chunks == 0) return;
  adamw_kernel<true><<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(table, count, hyper, step,
                                                                             grad_scale, chunk_sq);
  detail::check_launch("adamw_step");
}

void sum_chunks(const float* chunk_sq, std::int64_t chunks, double* total, cudaStream_t stream) {
  sum_chunks_kernel<<<1, kThreads, 0, stream>>>(chunk_sq, chunks, total);
  detail::check_launch("sum_chunks");
}

}  // namespace primecfg::train::kernels
