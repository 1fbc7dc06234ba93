// The fused LM head + cross-entropy: the loss of the hidden states against the targets
// without ever holding all the logits (chunks of tokens or of vocabulary rows:
// nn/loss_chunking.hpp decides their size, for the planner too). Transformer::loss is
// its public face; the hooks are Transformer's HeadGradHook and HeadRowsHook.
//
// Internal to nn/.
#pragma once

#include "nn/transformer.hpp"

#include <torch/torch.h>

#include <cstdint>

namespace primecfg::train {

// Sum of token cross-entropies of h [N, D] @ w^T against targets [N] (-100: ignored),
// times scale; a chunk holds about `chunk` tokens' worth of logits.
torch::Tensor linear_cross_entropy(const torch::Tensor& h, const torch::Tensor& w,
                                   const torch::Tensor& targets, double scale, std::int64_t chunk,
                                   const Transformer::HeadGradHook* on_head_grad,
                                   const Transformer::HeadRowsHook* before_rows, bool by_vocabulary);

}  // namespace primecfg::train
