// The Qwen3-MoE decoder block: Qwen3's attention (models/llama/block.hpp), then routed
// experts (nn/moe.hpp) or, in the blocks listed in mlp_only_layers, the dense SwiGLU MLP.
//
// Internal to models/.
#pragma once

#include "models/llama/block.hpp"
#include "nn/moe.hpp"

#include <torch/torch.h>

#include <optional>
#include <vector>

namespace primecfg::train {

class Qwen3MoeBlock final : public Block {
 public:
  Qwen3MoeBlock(const ModelArgs& args, int layer, const ParamLookup& find);
  torch::Tensor forward(const BlockContext& c, const torch::Tensor& x) const override;

 private:
  AttentionWeights attn_;
  int layer_;
  MoeWeights experts_;               // the router and each expert's projections (the routed blocks)
  std::optional<MlpWeights> dense_;  // the blocks in mlp_only_layers
};

}  // namespace primecfg::train
