// The decoder block of the Llama family (Llama, Qwen2, Qwen3): RMSNorm, attention
// with RoPE (and QK-norm, biases where the architecture has them), SwiGLU MLP. Its
// attention half is also Qwen3-MoE's (models/qwen3_moe/).
//
// Internal to models/.
#pragma once

#include "nn/block.hpp"

#include <torch/torch.h>

namespace primecfg::train {

// Block `layer`'s norms and attention weights; biases and QK-norms are undefined where
// the architecture has none.
struct AttentionWeights {
  torch::Tensor in_norm, q_norm, k_norm, post_norm;
  Linear q, k, v, o;
  AttentionWeights(int layer, const ParamLookup& find);
};

// x + attention(rmsnorm(x)): the block's first residual.
torch::Tensor attention_residual(const BlockContext& c, const AttentionWeights& w, const torch::Tensor& x);

// Block `layer`'s dense SwiGLU MLP; biases undefined where the architecture has none.
struct MlpWeights {
  Linear gate, up, down;
  MlpWeights(int layer, const ParamLookup& find);
};

// x1 + mlp(rmsnorm(x1)) with the post-attention norm's weight: the block's second residual.
torch::Tensor mlp_residual(const BlockContext& c, const MlpWeights& w, const torch::Tensor& post_norm,
                           const torch::Tensor& x1);

class LlamaBlock final : public Block {
 public:
  // Takes handles to block `layer`'s parameters (they share the model's storage).
  LlamaBlock(int layer, const ParamLookup& find);
  torch::Tensor forward(const BlockContext& c, const torch::Tensor& x) const override;

 private:
  AttentionWeights attn_;
  MlpWeights mlp_;
};

}  // namespace primecfg::train
