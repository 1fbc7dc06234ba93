// FP8 e4m3 with blockwise scales, as prime-rl's model.quantization = {type = "fp8"}
// quantises (DeepSeek-V3's format; docs/design/fp8.md says where each rule comes from):
//
//   activations, output gradients  groups of 1 x 128 along the contraction dimension
//   weights                         blocks of 128 x 128
//   scale  = max(amax(group) / 448, 1e-4)     FP32, one per group or block
//   value  = e4m3(x / scale)                  round to nearest even, saturating at 448
//
// A last partial group or block reads zeros past the edge (it scales what is there).
// On a CUDA device, bf16 input takes the fused casts (nn/kernels/fp8_cast.hpp), which give
// the same bits; elsewhere these are ATen compositions, the tests' reference path.
//
// Internal to nn/ (the FP8 linear) and its tests.
#pragma once

#include "model/fp8_layers.hpp"

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace primecfg::train::fp8 {

inline constexpr double e4m3_max = 448.0;    // the largest finite e4m3 value
inline constexpr double scale_floor = 1e-4;  // prime-rl's smallest scale (not an epsilon)

struct Quantized {
  torch::Tensor values;  // e4m3 (at::kFloat8_e4m3fn), the input's shape
  torch::Tensor scales;  // FP32: [rows, ceil(cols / 128)] or [ceil(rows / 128), ceil(cols / 128)]
};

// x [rows, cols]: one scale per row and 128 columns. `floor`: the smallest scale (below:
// an output gradient's, in this trainer's units).
Quantized quantize_rows(const torch::Tensor& x, double floor = scale_floor);
// x [rows, cols]: the casts of x^T with its columns zero-padded to a multiple of 128 (one
// scale per column of x and 128 rows: the tokens of a weight gradient's operands).
Quantized quantize_cols(const torch::Tensor& x, double floor = scale_floor);
// Both of the above, {rows, cols}, from one read of x where the fused casts run.
std::pair<Quantized, Quantized> quantize_rows_cols(const torch::Tensor& x, double floor = scale_floor);
// w [rows, cols]: one scale per 128 x 128 block.
Quantized quantize_blocks(const torch::Tensor& w);
// The casts of w^T from those of w by blocks (the same blocks, transposed): exactly
// quantize_blocks(w.t()).
Quantized transposed(const Quantized& blocks);
// quantize_blocks(w.t()), cast from w without a copy of w^T where the fused casts run
// (elsewhere transposed(quantize_blocks(w))).
Quantized quantize_blocks_transposed(const torch::Tensor& w);
// values * scales, in FP32 (each scale over its group or block).
torch::Tensor dequantize_rows(const Quantized& q);
torch::Tensor dequantize_blocks(const Quantized& q);

// D = A B^T in FP32 accumulation, returned in `out`: A [m, k] quantised by rows (1 x 128
// along k), B [n, k] by rows or, with b_blocks, in 128 x 128 blocks. On a CUDA device of
// compute capability 9.0, cuBLASLt's blockwise-scaled FP8 GEMM (at::_scaled_mm_v2; k a
// multiple of 128); elsewhere the operands dequantised and multiplied in FP32, the
// reference the GPU path is tested against.
torch::Tensor matmul_nt(const Quantized& a, const Quantized& b, bool b_blocks, torch::ScalarType out);

// y = x W^T with all three matmuls in FP8, as prime-rl's FP8 linear: the forward on x by
// rows and W by blocks; dX = dY W on dY by rows and W^T by blocks; dW = dY^T X on both by
// rows along the tokens (padded with zeros to a multiple of 128). Saves x and W as they
// are (bf16) for the backward; y and dX in x's dtype, dW in W's. x [tokens, in].
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight);
// linear(x, w) for each of `weights` [out_i, in], x cast once for all of them (by rows in
// the forward, by columns for the dWs): the projections of one input (q, k and v; gate
// and up). The same values as the separate linears; dX their sum.
std::vector<torch::Tensor> linears(const torch::Tensor& x, const std::vector<torch::Tensor>& weights);

// The units of the output gradients. prime-rl backpropagates each micro-batch's loss summed
// over its tokens, divided by the number of micro-batches, and divides the gradients by the
// step's token count only after the backward; this trainer backpropagates that division
// with the loss. The scale floor is an absolute size, so it floors other groups of a
// gradient 8,192 times smaller: at 8,192 tokens every output-gradient group of a mean loss
// sits under 1e-4 x 448, and its small values flush to zero. The trainer says, per step,
// how many times larger prime-rl's gradient is than its own (`ratio`: the loss tokens over
// the micro-batches), and the backward casts dY with the floor scale_floor / ratio: the
// groups prime-rl floors, the values prime-rl casts (the scales `ratio` times smaller, the
// products as this trainer's units have them). A linear reads the ratio in its forward,
// for its backward. 1 (prime-rl's units) until set.
void set_output_grad_ratio(double ratio);
double output_grad_ratio();

// Why FP8 training cannot run on `device`; nothing where it can: a CUDA device of compute
// capability 9.x (H100, H200), where cuBLASLt has the blockwise-scaled FP8 GEMM. The CPU
// path of matmul_nt is the tests' reference, far too slow to train with.
std::optional<std::string> unavailable_on(torch::Device device);

}  // namespace primecfg::train::fp8
