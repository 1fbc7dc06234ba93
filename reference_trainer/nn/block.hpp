// A decoder block, of whatever architecture: the interface the model (nn/transformer)
// runs its blocks through, and activation checkpointing, which works the same for
// every block. Each architecture's block is in its folder (models/<name>/), made by
// make_block (models/blocks.cpp, one line per architecture).
//
// Internal to nn/ and models/.
#pragma once

#include "model/config.hpp"
#include "nn/activation_offload.hpp"
#include "nn/linear.hpp"
#include "nn/moe.hpp"

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace primecfg::train {

// What every block of one forward pass shares: the model's shape and this batch's
// RoPE tables and mask.
struct BlockContext {
  const ModelArgs* args;
  torch::Tensor cos, sin;
  std::optional<torch::Tensor> mask;
  const MoeSettings* moe = nullptr;  // how routed experts run (the trainer's model.moe_* fields)
  // Where block l's routing is counted (index l); null where nothing is counted (the
  // recompute of a checkpointed block, which would count its tokens twice).
  std::vector<MoeStats>* moe_stats = nullptr;
  // Selective activation checkpointing of this block's routed experts (model.ac.mode =
  // "selective" with target "routed_experts"): set per block by the model.
  bool recompute_routed_experts = false;
};

class Block {
 public:
  virtual ~Block() = default;
  // The block on x [B, T, D], recording the autograd graph as usual.
  virtual torch::Tensor forward(const BlockContext& c, const torch::Tensor& x) const = 0;
};

// A block's view of the model's parameters, by HF name.
class ParamLookup {
 public:
  // The parameter tensor of an HF name; undefined when the model has none.
  using Find = std::function<torch::Tensor(const std::string& name)>;
  // Whether the linear layer whose weight has that HF name runs in FP8 (model.quantization).
  using Fp8 = std::function<bool(const std::string& weight)>;
  // Each weight a block took as a Linear is added to `linears` when given.
  explicit ParamLookup(Find find, Fp8 fp8 = {}, std::vector<std::string>* linears = nullptr)
      : find_(std::move(find)), fp8_(std::move(fp8)), linears_(linears) {}

  torch::Tensor operator()(const std::string& name) const { return find_(name); }
  // The linear layer PREFIX.weight (+ PREFIX.bias where the model has one), in FP8 where
  // the model's quantization chose it; an undefined weight where the model has none.
  Linear linear(const std::string& prefix) const;

 private:
  Find find_;
  Fp8 fp8_;
  std::vector<std::string>* linears_;
};

// Block `layer` of `args`' architecture, holding handles to its parameters (found with
// `find`, which must outlive nothing: the handles share the parameters' storage).
// Defined in models/blocks.cpp, where each architecture's block is listed by the
// architecture's name (model/architecture.hpp); a missing one is a std::logic_error.
std::unique_ptr<Block> make_block(const ModelArgs& args, int layer, const ParamLookup& find);

using BlockMaker = std::unique_ptr<Block> (*)(const ModelArgs& args, int layer, const ParamLookup& find);
// Whether the architecture of that name has a block.
bool has_block(std::string_view architecture);
// Adds the block of an architecture from outside the product (a test's, beside its
// add_architecture). Throws std::logic_error when it has one already.
void add_block(std::string_view architecture, BlockMaker maker);

// The block under activation checkpointing: the forward keeps only x (in `offload` when
// given, as checkpointed block number `slot`); the backward runs the block again and
// backpropagates through it. b, c.args and offload must outlive the graph.
torch::Tensor checkpointed_block(const torch::Tensor& x, const Block& b, const BlockContext& c,
                                 ActivationOffload* offload = nullptr, std::int64_t slot = 0);

}  // namespace primecfg::train
