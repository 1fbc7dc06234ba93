// A test architecture, outside the product: the Llama block with a GELU MLP (fc_in, tanh
// GELU, fc_out) in place of SwiGLU, and no QK-norm or biases. It exists to show that an
// architecture is one folder (models/README.md): its description (spec.cpp) and its
// block (block.cpp) are all there is, registered by one line (../registry.cpp).
#pragma once

#include "model/architecture.hpp"
#include "nn/block.hpp"

namespace primecfg::train::test {

inline constexpr std::string_view kGeluName = "gelu_test";
inline constexpr std::string_view kGeluModelType = "primecfg_gelu_test";
inline constexpr std::string_view kGeluPreset = "primecfg/gelu-test-tiny";

const Architecture& gelu_architecture();
std::unique_ptr<Block> make_gelu_block(const ModelArgs& args, int layer, const ParamLookup& find);

}  // namespace primecfg::train::test
