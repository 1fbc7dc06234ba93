// FP8 e4m3 casts with blockwise scales from bf16, each in one pass over its input: the
// group's amax, its scale and the rounded values computed together (ATen's composition,
// nn/fp8.cpp, makes five FP32 temporaries of the input's size). The format is nn/fp8.hpp's:
// scale = max(amax / 448, floor) (floor: prime-rl's 1e-4, or that in the trainer's gradient
// units, nn/fp8.hpp), value = e4m3(x / scale) rounded to nearest even and
// saturating at 448, both divisions IEEE-rounded (as the CPU's, so the bits are the CPU
// path's; ATen's CUDA division by a scalar multiplies by its reciprocal instead). NaN
// propagates to the group's scale and values. Values are e4m3 bytes, scales FP32, all
// arrays row-major and dense. Every function launches on the given stream and throws
// std::runtime_error if the launch fails.
#pragma once

#include "launch.hpp"

namespace primecfg::train::kernels {

// x [rows, cols]: values [rows, cols], scales [rows, ceil(cols / 128)] (groups of 1 x 128
// along a row; a last partial group scales what is there).
void fp8_quantize_rows(const bf16* x, std::int64_t rows, std::int64_t cols, float floor, std::uint8_t* values,
                       float* scales, cudaStream_t stream);

// The same casts of x^T with its rows zero-padded to a multiple of 128, without writing
// x^T: x [rows, cols] gives values [cols, padded], scales [cols, padded / 128], padded =
// rows rounded up to 128 (groups of 128 consecutive rows of x, one column each: the
// tokens of a weight gradient's operands).
void fp8_quantize_cols(const bf16* x, std::int64_t rows, std::int64_t cols, float floor, std::uint8_t* values,
                       float* scales, cudaStream_t stream);

// w [rows, cols]: values [rows, cols], scales [ceil(rows / 128), ceil(cols / 128)] (one per
// 128 x 128 block).
void fp8_quantize_blocks(const bf16* w, std::int64_t rows, std::int64_t cols, float floor,
                         std::uint8_t* values, float* scales, cudaStream_t stream);

}  // namespace primecfg::train::kernels
