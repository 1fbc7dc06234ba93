// AdamW over many parameters in one launch, with the bf16 weight written from the new
// master in the same pass, and the squares of the gradients summed on the way (the norm
// for clipping and the metrics). ATen's path for the same step is four passes over the
// state: the norm (_foreach_norm), the clip (_foreach_mul_), _fused_adamw_ and the
// weight copy (_foreach_copy_); this one reads the gradient, master and moments once
// and writes master, moments and weight once.
//
// The arithmetic is _fused_adamw_'s, in the same order and precision (FP32, the step
// count read as a float from the device), so the two give the same masters and moments.
// Plain CUDA against raw pointers (nn/kernels/launch.hpp says why).
#pragma once

#include "nn/kernels/launch.hpp"

#include <cstddef>
#include <cstdint>

namespace primecfg::train::kernels {

// One parameter: n FP32 values each of master and the two moments, its gradient (FP32,
// or the bf16 one autograd made: each value converts exactly, so both give the same
// update), and its bf16 weight, all on one device.
struct AdamWParam {
  float* master = nullptr;
  const float* grad = nullptr;   // either this
  const bf16* grad16 = nullptr;  // or this
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  bf16* weight = nullptr;
  std::int64_t n = 0;
  std::int32_t vector = 0;  // FP32 pointers 16-byte aligned, bf16 ones 8, and n % 4 == 0
};

struct AdamWHyper {
  float lr = 0, beta1 = 0, beta2 = 0, weight_decay = 0, eps = 0;
};

// Work is cut into chunks of this many values of one parameter; one partial sum of
// squares per chunk.
inline constexpr std::int64_t kAdamWChunk = 32768;

// The table the kernels read, written on the host and copied to the device as it is:
// `count` AdamWParam, then count + 1 chunk offsets (int64: parameter p's chunks are
// [offset[p], offset[p + 1])). Returns its size in bytes; with `out`, writes it there
// (with `vector` set from the pointers).
std::size_t adamw_table(const AdamWParam* params, int count, void* out);
std::int64_t adamw_chunks(const AdamWParam* params, int count);

// Sums of squares of the gradients (times *grad_scale where given), one per chunk, into
// chunk_sq [chunks]; nothing else is written.
void adamw_grad_squares(const void* table, int count, std::int64_t chunks, float* chunk_sq,
                        cudaStream_t stream);

// The update of every parameter in the table: with grad_scale (a device float, the
// clipping factor) the gradient is first multiplied by it, as ATen's path multiplies the
// stored gradient in place (the stored gradient is left as it was here); with chunk_sq,
// the unscaled gradients' sums of squares as adamw_grad_squares writes them. step is the
// step count, a device float (as _fused_adamw_ reads it).
void adamw_step(const void* table, int count, std::int64_t chunks, const AdamWHyper& hyper, const float* step,
                const float* grad_scale, float* chunk_sq, cudaStream_t stream);

// *total = the sum of chunk_sq [chunks] in FP64, in one fixed order (the same every run).
void sum_chunks(const float* chunk_sq, std::int64_t chunks, double* total, cudaStream_t stream);

}  // namespace primecfg::train::kernels
