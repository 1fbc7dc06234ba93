// The Llama family (model_type llama, qwen2, qwen3) as an architecture
// (model/architecture.hpp): its config.json keys, presets, parameters and planner terms.
// The decoders built on its attention (Qwen3-MoE) use the parts below.
#pragma once

#include "model/architecture.hpp"

#include <vector>

namespace primecfg::train {

const Architecture& llama_architecture();

namespace llama_family {

// config.json's keys of a Llama / Qwen2 / Qwen3 decoder (and Qwen3-MoE's, which are
// Qwen3's): the attention, RoPE, norms, tying, biases, sliding window (refused),
// hidden_act (silu), with each model_type's defaults.
void read_config(ConfigReader& r, ModelArgs& a);
// Those keys written back, "architectures" and "model_type" first.
strict_json::ordered write_config(const ModelArgs& a);
// Block l's norms and attention parameters (input norm, q, k, v, o with their biases,
// QK-norm, post-attention norm), in the trainer's order.
void attention_params(const ModelArgs& a, int l, std::vector<ParamShape>& out);
// Block l's dense SwiGLU MLP (gate, up, down with their biases), after the attention's.
void mlp_params(const ModelArgs& a, int l, std::vector<ParamShape>& out);
// What the attention half of the block saves per token, and its backward's peak (one stage).
BlockMemory attention_memory(const ModelArgs& a, const BlockKernels& k);

}  // namespace llama_family

}  // namespace primecfg::train
