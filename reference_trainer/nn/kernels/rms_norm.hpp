// RMSNorm over the last dimension of a row-major [rows, cols] bf16 tensor, forward and
// backward, in FP32 arithmetic with one rounding to bf16 per output element (at::rms_norm
// on bf16 rounds the same FP32 value; its backward rounds intermediates to bf16 as well).
// Every function launches on the given stream and throws std::runtime_error if the launch
// fails. Pointers are device pointers; 16-byte aligned rows (cols % 8 == 0) take vector
// loads, any other shape the scalar path.
#pragma once

#include "launch.hpp"

namespace primecfg::train::kernels {

// y[r, :] = x[r, :] * rstd[r] * w, with rstd[r] = 1 / sqrt(mean(x[r, :]^2) + eps) saved
// (FP32, rows values) for the backward pass.
void rms_norm_forward(const bf16* x, const bf16* w, bf16* y, float* rstd, std::int64_t rows,
                      std::int64_t cols, float eps, cudaStream_t stream);

// FP32 values of the workspace that rms_norm_backward needs: per-block partial sums of
// the weight gradient, reduced in a second kernel (a fixed order: the result is the same
// from run to run, unlike atomics).
std::int64_t rms_norm_backward_workspace(std::int64_t rows, std::int64_t cols);

// dx = rstd * (w * dy - x * rstd^2 * mean(w * dy * x)) per row, and
// dw = sum over rows of dy * x * rstd (skipped when dw is null).
void rms_norm_backward(const bf16* dy, const bf16* x, const bf16* w, const float* rstd, bf16* dx, bf16* dw,
                       float* workspace, std::int64_t rows, std::int64_t cols, cudaStream_t stream);

}  // namespace primecfg::train::kernels
