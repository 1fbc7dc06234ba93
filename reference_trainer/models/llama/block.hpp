// The decoder block of the Llama family (Llama, Qwen2, Qwen3): RMSNorm, attention
// with RoPE (and QK-norm, biases where the architecture has them), SwiGLU MLP.
//
// Internal to models/.
#pragma once

#include "nn/block.hpp"

#include <torch/torch.h>

namespace primecfg::train {

class LlamaBlock final : public Block {
 public:
  // Takes handles to block `layer`'s parameters (they share the model's storage).
  LlamaBlock(int layer, const ParamLookup& find);
  torch::Tensor forward(const BlockContext& c, const torch::Tensor& x) const override;

 private:
  // Biases and QK-norms are undefined where the architecture has none.
  struct BlockWeights {
    torch::Tensor in_norm, wq, wk, wv, wo, q_norm, k_norm, post_norm, w_gate, w_up, w_down;
    torch::Tensor bq, bk, bv, bo, b_gate, b_up, b_down;
  };
  BlockWeights w_;
};

}  // namespace primecfg::train
