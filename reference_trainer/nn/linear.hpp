// A block's linear layer: y = x W^T (+ b), in bf16 (the model's dtype) or, where
// model.quantization chose it, with prime-rl's FP8 matmuls (nn/fp8.hpp). Every block
// runs its projections through this, so the choice is made once, at model build, per
// layer (Transformer::use_fp8).
//
// Internal to nn/ and models/.
#pragma once

#include <torch/torch.h>

#include <initializer_list>
#include <vector>

namespace primecfg::train {

struct Linear {
  torch::Tensor weight;  // [out, in]
  torch::Tensor bias;    // [out]; undefined where the layer has none (never with fp8)
  bool fp8 = false;

  // x [..., in] -> [..., out].
  torch::Tensor operator()(const torch::Tensor& x) const;
};

// Each of `layers` applied to x, [..., in] -> [..., out_i]: the projections of one input
// (q, k and v; gate and up). Where all of them are FP8, x is cast once for all of them
// (fp8::linears); otherwise each runs alone.
std::vector<torch::Tensor> apply_linears(const torch::Tensor& x, std::initializer_list<const Linear*> layers);

}  // namespace primecfg::train
