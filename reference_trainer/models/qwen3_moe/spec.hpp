// Qwen3-MoE (model_type qwen3_moe) as an architecture (model/architecture.hpp): Qwen3's
// attention with routed experts in place of the dense MLP (nn/moe.hpp), where
// transformers puts them.
#pragma once

#include "model/architecture.hpp"

namespace primecfg::train {

const Architecture& qwen3_moe_architecture();

}  // namespace primecfg::train
