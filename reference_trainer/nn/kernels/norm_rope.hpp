// Attention's query and key preparation in one pass: the per-head RMSNorm of QK-norm
// models (Qwen3), optional, then rotary embedding (HF's rotate-half form), forward and
// backward, over a [tokens, heads, dim] bf16 tensor (the projection's output viewed per
// head) with cos and sin tables of [tokens, dim]. FP32 arithmetic, one rounding to bf16
// per output: ATen's composition (rms_norm, then x * cos + cat(-x2, x1) * sin) rounds
// after each of its five operators and launches each. Every function launches on the
// given stream and throws std::runtime_error if the launch fails; dim must be even and
// at most 512 (the caller checks; fused_ops.cpp falls back to ATen otherwise).
#pragma once

#include "launch.hpp"

namespace primecfg::train::kernels {

inline constexpr int kNormRopeMaxDim = 512;

// With n = x * rstd * w (w given; rstd[row] = 1 / sqrt(mean(x^2) + eps) saved per
// [token, head] row, FP32) or n = x (w null; rstd unused), and h = dim / 2:
//   y[i]     = n[i] * cos[i]     - n[i + h] * sin[i]       (i < h)
//   y[i + h] = n[i + h] * cos[i + h] + n[i] * sin[i + h]
void norm_rope_forward(const bf16* x, const bf16* w, const bf16* cos, const bf16* sin, bf16* y, float* rstd,
                       std::int64_t tokens, int heads, int dim, float eps, cudaStream_t stream);

// FP32 values of the workspace that norm_rope_backward needs for the weight gradient
// (per-block partial sums reduced in a fixed order: the same result every run).
std::int64_t norm_rope_backward_workspace(std::int64_t tokens, int dim);

// dx from dy through the rotation's transpose and, with w, RMSNorm's backward; dw (when
// not null, w given) = sum over rows of dn * x * rstd, dn being the gradient reaching n.
// x and rstd are read only with w (may be null without).
void norm_rope_backward(const bf16* dy, const bf16* x, const bf16* w, const float* rstd, const bf16* cos,
                        const bf16* sin, bf16* dx, bf16* dw, float* workspace, std::int64_t tokens, int heads,
                        int dim, cudaStream_t stream);

}  // namespace primecfg::train::kernels
