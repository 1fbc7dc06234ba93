// The Llama family (model_type llama, qwen2, qwen3) as an architecture
// (model/architecture.hpp): its config.json keys, presets, parameters and planner terms.
#pragma once

#include "model/architecture.hpp"

namespace primecfg::train {

const Architecture& llama_architecture();

}  // namespace primecfg::train
