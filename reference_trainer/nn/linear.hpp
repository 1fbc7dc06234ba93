// A block's linear layer: y = x W^T (+ b), in bf16 (the model's dtype) or, where
// model.quantization chose it, with prime-rl's FP8 matmuls (nn/fp8.hpp). Every block
// runs its projections through this, so the choice is made once, at model build, per
// layer (Transformer::use_fp8).
//
// Internal to nn/ and models/.
#pragma once

#include <torch/torch.h>

namespace primecfg::train {

struct Linear {
  torch::Tensor weight;  // [out, in]
  torch::Tensor bias;    // [out]; undefined where the layer has none (never with fp8)
  bool fp8 = false;

  // x [..., in] -> [..., out].
  torch::Tensor operator()(const torch::Tensor& x) const;
};

}  // namespace primecfg::train
