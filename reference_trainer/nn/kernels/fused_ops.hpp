// The model's RMSNorm, SwiGLU and query/key preparation, on the fused CUDA kernels
// (rms_norm.hpp, swiglu.hpp, norm_rope.hpp) where they apply: bf16 tensors on a CUDA device, in a build that
// has the kernels (PRIMECFG_FUSED_KERNELS). Everywhere else, and always on the CPU, they are the ATen
// operators the model used before, called the same way, so those results do not change
// by a bit (the CPU tests compare against transformers and across offload modes).
#pragma once

#include <torch/torch.h>

#include <initializer_list>
#include <optional>
#include <utility>
#include <vector>

namespace primecfg::train::fused {

// at::rms_norm(x, {x.size(-1)}, w, eps).
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps);

// silu(gate) * up (same shapes).
torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up);

// HF's rotate-half RoPE of x [B, T, heads, head_dim], after the per-head RMSNorm with
// weight w where w is defined (QK-norm): rope(rms_norm(x, w, eps)), cos and sin being
// [B, T, 1, head_dim]. The result has x's shape.
torch::Tensor norm_rope(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& cos,
                        const torch::Tensor& sin, double eps);

// The cross-entropy of a chunk of the LM head's logits [n, vocab] against targets [n]
// (int64, each in [0, vocab) or -100: ignored, a zero loss and gradient row), and its
// gradient in place: returns each row's loss (FP32 [n]: logsumexp - the target's logit)
// and overwrites the logits with the gradient of scale * (the sum of the losses), in
// their dtype. Only on the fused kernel (cross_entropy.hpp), for contiguous bf16 CUDA
// logits while its switch is on; anywhere else it returns an undefined tensor and leaves
// the logits alone (the caller then takes ATen's path).
torch::Tensor cross_entropy_grad_(torch::Tensor& logits, const torch::Tensor& targets, double scale);
// Whether logits computed from these hidden states (the LM head's input) take the
// kernel above: the loss then needs no list of the tokens to keep.
bool cross_entropy_fused(const torch::Tensor& hidden);

// FP8 blockwise casts of a bf16 matrix on a CUDA device (fp8_cast.hpp), while their switch
// is on: one {values, scales} per kind asked for, in that order, exactly as nn/fp8.hpp's
// quantize_rows, quantize_cols, quantize_blocks and quantize_blocks(x.t()) define them, all
// from one read of x; anywhere else nullopt (the caller takes ATen's path). `floor` is the
// scales' floor.
enum class Fp8Cast { rows, cols, blocks, blocks_transposed };
std::optional<std::vector<std::pair<torch::Tensor, torch::Tensor>>> fp8_cast(
    const torch::Tensor& x, std::initializer_list<Fp8Cast> kinds, double floor);
void set_fp8_cast_enabled(bool on);
bool fp8_cast_enabled();

// Whether this build has the kernels (compiled by nvcc and linked in).
bool kernels_built();

// Process-wide switch, on by default: off, both functions take the ATen path (tests
// compare the two in one process).
void set_enabled(bool on);
bool enabled();

// norm_rope's kernel has its own switch as well (on by default; under set_enabled): off,
// norm_rope is rms_norm (above) followed by ATen's rotation. The GPU tests compare the two.
void set_norm_rope_enabled(bool on);
bool norm_rope_enabled();

// cross_entropy_grad_'s kernel has its own switch as well (on by default; under
// set_enabled): off, the loss takes ATen's FP32 log_softmax path.
void set_cross_entropy_enabled(bool on);
bool cross_entropy_enabled();

}  // namespace primecfg::train::fused
