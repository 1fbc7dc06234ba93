// The host's gradient arithmetic when FullOffload accumulates several micro-batches:
// the staged gradient added into the FP32 accumulator, and its sum of squares for the
// step's gradient norm.
#pragma once

#include <torch/torch.h>

namespace primecfg::train {

// acc += g: acc FP32 and contiguous, g of any floating type with acc's number of elements.
void accumulate_grad(torch::Tensor& acc, const torch::Tensor& g);

// The sum of g's squared elements (in FP32 by slices, the slices' sums added in FP64).
double squared_norm(const torch::Tensor& g);

}  // namespace primecfg::train
