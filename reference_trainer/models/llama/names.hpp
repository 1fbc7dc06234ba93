// The HF names of a Llama-family block's tensors, after "model.layers.{l}.": the one
// spelling, for the parameter list (spec.cpp) and the block that binds them
// (block.cpp). A projection's weight is NAME + ".weight", its bias NAME + ".bias".
#pragma once

#include <string_view>

namespace primecfg::train::llama_names {

inline constexpr std::string_view input_norm = "input_layernorm.weight";
inline constexpr std::string_view q = "self_attn.q_proj", k = "self_attn.k_proj", v = "self_attn.v_proj",
                                  o = "self_attn.o_proj";
inline constexpr std::string_view q_norm = "self_attn.q_norm.weight", k_norm = "self_attn.k_norm.weight";
inline constexpr std::string_view post_norm = "post_attention_layernorm.weight";
inline constexpr std::string_view gate = "mlp.gate_proj", up = "mlp.up_proj", down = "mlp.down_proj";

}  // namespace primecfg::train::llama_names
