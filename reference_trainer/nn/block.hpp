// The decoder block of the Llama family (Llama, Qwen2, Qwen3): RMSNorm, attention
// with RoPE (and QK-norm, biases where the architecture has them), SwiGLU MLP; and
// the same block under activation checkpointing. A new kind of block (a mixture of
// experts) is a file of its own beside this one (docs/architecture.md, "A new
// architecture").
//
// Internal to nn/.
#pragma once

#include "model/config.hpp"
#include "nn/activation_offload.hpp"

#include <torch/torch.h>

#include <optional>

namespace primecfg::train {

// The tensors of one transformer block (handles that share storage with params());
// biases and QK-norms are undefined where the architecture has none.
struct BlockWeights {
  torch::Tensor in_norm, wq, wk, wv, wo, q_norm, k_norm, post_norm, w_gate, w_up, w_down;
  torch::Tensor bq, bk, bv, bo, b_gate, b_up, b_down;
};

// What every block of one forward pass shares: the model's shape and this batch's
// RoPE tables and mask.
struct BlockContext {
  const ModelArgs* args;
  torch::Tensor cos, sin;
  std::optional<torch::Tensor> mask;
};

// The block on x [B, T, D], recording the autograd graph as usual.
torch::Tensor block_forward(const BlockWeights& w, const BlockContext& c, const torch::Tensor& x);

// The block under activation checkpointing: the forward keeps only x (in `offload` when
// given, as checkpointed block number `slot`); the backward runs the block again and
// backpropagates through it. w, c.args and offload must outlive the graph.
torch::Tensor checkpointed_block(const torch::Tensor& x, const BlockWeights& w, const BlockContext& c,
                                 ActivationOffload* offload = nullptr, std::int64_t slot = 0);

}  // namespace primecfg::train
