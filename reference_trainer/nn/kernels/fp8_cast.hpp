// FP8 e4m3 casts with blockwise scales from bf16, several in one pass over the input: each
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

// Where the casts of one pass over x [rows, cols] go; a null `values` skips that cast.
struct Fp8Casts {
  // Groups of 1 x 128 along x's rows (a last partial group scales what is there):
  // values [rows, cols], scales [rows, ceil(cols / 128)].
  std::uint8_t* rows_values = nullptr;
  float* rows_scales = nullptr;
  // The same casts of x^T with its rows zero-padded to a multiple of 128, without writing
  // x^T: values [cols, padded], scales [cols, padded / 128], padded = rows rounded up to
  // 128 (groups of 128 consecutive rows of x, one column each: the tokens of a weight
  // gradient's operands).
  std::uint8_t* cols_values = nullptr;
  float* cols_scales = nullptr;
  // One scale per 128 x 128 block: values [rows, cols], scales [ceil(rows / 128),
  // ceil(cols / 128)].
  std::uint8_t* block_values = nullptr;
  float* block_scales = nullptr;
  // The blocks' casts of x^T (the same blocks, transposed): values [cols, rows], scales
  // [ceil(cols / 128), ceil(rows / 128)].
  std::uint8_t* block_t_values = nullptr;
  float* block_t_scales = nullptr;
};

// Every cast `out` asks for, in one read of x.
void fp8_quantize(const bf16* x, std::int64_t rows, std::int64_t cols, float floor, const Fp8Casts& out,
                  cudaStream_t stream);

}  // namespace primecfg::train::kernels
