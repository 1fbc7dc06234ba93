// The HF names of a Qwen3-MoE block's MLP tensors, after "model.layers.{l}.": the one
// spelling, for the parameter list (spec.cpp) and the block (block.cpp). Its norms and
// attention are the Llama family's (models/llama/names.hpp); a block listed in
// mlp_only_layers has the Llama family's dense MLP.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace primecfg::train::qwen3_moe_names {

inline constexpr std::string_view router = "mlp.gate.weight";
// Expert e's projection: "mlp.experts.{e}.gate_proj.weight" and so on (transformers'
// per-expert layout, what save_pretrained writes in 4.x and 5.x).
inline std::string expert(std::int64_t e, std::string_view proj) {
  return fmt::format("mlp.experts.{}.{}.weight", e, proj);
}
inline constexpr std::string_view gate = "gate_proj", up = "up_proj", down = "down_proj";

}  // namespace primecfg::train::qwen3_moe_names
