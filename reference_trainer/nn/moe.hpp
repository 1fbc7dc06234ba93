// Routed experts (a mixture-of-experts MLP), as transformers' Qwen3-MoE and prime-rl's
// MoE layer compute them: a router picks top_k of num_experts experts per token, each
// expert is a SwiGLU MLP, and a token's output is the sum of its experts' outputs,
// each scaled by its routing weight. Architecture-independent: a block of any
// architecture with routed experts calls moe_forward.
//
//   probs        = softmax(x @ router^T)             in FP32 (the gate GEMM in router_dtype)
//   weights, ids = top_k(probs)                     (force_balanced: ids fixed, weights gathered)
//   weights     /= sum(weights) + 1e-20             when norm_topk_prob
//   y[t]         = sum_j weights[t, j] * expert_{ids[t, j]}(x[t])   (in FP32, rounded once)
//   expert_e(x)  = (silu(x @ w1[e]^T) * (x @ w3[e]^T)) @ w2[e]^T
//
// The token slots are sorted by expert (stable), so each expert's rows are contiguous in
// the buffer the experts run on, gathered from x (padding included) and gathered back
// into the sum, both ways by gathers (no scatter); three ways run the experts on it,
// the same function of the weights:
//   grouped  the groups padded to multiples of `align` rows, at::_grouped_mm on CUDA
//            (bf16, compute capability 9.0: H100/H200), else one batched matmul over
//            the groups padded to the largest (the CPU, FP32);
//   loop     one matmul per expert with tokens (model.moe_use_grouped_mm = false);
//   fp8      one FP8 linear per projection and expert (nn/fp8.hpp; model.quantization with
//            enable_grouped_gemm), each expert's rows its own 1 x 128 groups along the
//            tokens for the weight gradient, as prime-rl's grouped FP8 GEMMs group them.
// With recompute_experts (selective activation checkpointing of prime-rl's
// "routed_experts" target) the forward keeps only x, the routing and the sorted slots'
// weights; the backward gathers the rows and runs the experts again.
//
// Expert parallelism (an `exchange` of P ranks): this rank runs experts
// [index x E / P, (index + 1) x E / P) only. The sorted slots' rows go to the ranks that
// run their experts (one all-to-all, after one of the per-expert counts), are regrouped
// there by expert, run, and come back by the reverse all-to-all; the routing weights
// are applied where the token is, as without it. The backward exchanges the gradients
// the same ways. Under recompute_experts the received rows are what is kept.
//
// Internal to nn/ and the architectures that use it.
#pragma once

#include "nn/token_exchange.hpp"

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace primecfg::train {

struct MoeWeights {
  torch::Tensor router;  // [E, D], the gate (HF: mlp.gate.weight)
  // Each projection of every expert: one stacked tensor (w1, w3 [E, I, D]; w2 [E, D, I]),
  // or E tensors, one per expert (the model's parameters; moe_forward stacks them where
  // a grouped GEMM needs them, and under recompute_experts only for as long as it does).
  std::vector<torch::Tensor> w1, w3;  // gate_proj, up_proj
  std::vector<torch::Tensor> w2;      // down_proj
};

struct MoeSettings {
  std::int64_t top_k = 2;
  bool norm_topk_prob = true;
  torch::ScalarType router_dtype = torch::kFloat32;  // model.moe_router_dtype: the gate GEMM's dtype
  bool grouped = true;                               // model.moe_use_grouped_mm
  bool force_balanced = false;                       // model.debug.force_balanced_routing
  std::int64_t align = 8;                            // rows a group is padded to a multiple of (grouped)
  bool fp8 = false;                                  // model.quantization.enable_grouped_gemm: FP8 experts
  bool recompute_experts = false;                    // ac.mode = "selective" with "routed_experts"
  // Expert parallelism (model.ep > 1): the ranks the experts are split over, which must
  // outlive the backward; null: every expert runs here.
  TokenExchange* exchange = nullptr;
};

// What the router did, summed over the calls since it was made (prime-rl's load-balance
// figures come from these): slots routed to each expert, and the sum over tokens of the
// chosen experts' probabilities before renormalisation.
struct MoeStats {
  torch::Tensor tokens_per_expert;  // [E] FP32, on the device
  torch::Tensor confidence_sum;     // [] FP32
  std::int64_t tokens = 0;          // tokens routed
};

// y [N, D] for x [N, D] (differentiable in x and every weight; the router learns through
// the routing weights). `stats`, when given, accumulates this call's routing. Under
// s.recompute_experts, `w` must outlive the autograd graph (the backward reads the
// experts' weights through it, and their gradients accumulate there).
torch::Tensor moe_forward(const MoeWeights& w, const MoeSettings& s, const torch::Tensor& x,
                          MoeStats* stats = nullptr);

// Whether the grouped path runs at::_grouped_mm (else the batched fallback) for these
// weights: CUDA, bf16, compute capability 9.x.
bool grouped_mm_available(const torch::Tensor& weight);

}  // namespace primecfg::train
