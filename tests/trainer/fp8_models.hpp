// Two small models whose every block linear can run in FP8 (every side a multiple of 128):
// a dense Qwen3-like one and the same with routed experts (Qwen3-MoE), for the FP8 tests on
// the CPU and on the GPU.
#pragma once

#include "model/config.hpp"

#include <array>

namespace primecfg::train {

inline std::array<ModelArgs, 2> fp8_test_models() {
  ModelArgs dense;
  dense.vocab_size = 512, dense.hidden = 256, dense.heads = 2, dense.kv_heads = 1, dense.head_dim = 128,
  dense.intermediate = 512;
  ModelArgs moe = dense;
  moe.model_type = "qwen3_moe";
  MoeArgs m;
  m.experts = 8, m.top_k = 2, m.intermediate = 256, m.norm_topk_prob = true;
  moe.moe = m;
  return {dense, moe};
}

}  // namespace primecfg::train
