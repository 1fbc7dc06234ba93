// Activation checkpointing of any block, and the blocks' parameter lookup (nn/block.hpp).
#include "nn/block.hpp"

#include <cstdint>

namespace primecfg::train {

using torch::Tensor;

namespace {

// Activation checkpointing: forward runs the block without recording a graph and
// keeps only its input; backward runs the block again with grad enabled and
// backpropagates through that fresh graph (parameter gradients accumulate there,
// so their post-accumulate hooks fire as usual).
// The block and the model args outlive the graph (they belong to the model);
// the per-batch RoPE tables and mask travel in the autograd context.
struct CheckpointedBlock : torch::autograd::Function<CheckpointedBlock> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, Tensor x, const Block* b,
                        const BlockContext* c, ActivationOffload* offload, std::int64_t slot) {
    ctx->saved_data["block"] = reinterpret_cast<std::int64_t>(b);
    ctx->saved_data["args"] = reinterpret_cast<std::int64_t>(c->args);
    ctx->saved_data["cos"] = c->cos;
    ctx->saved_data["sin"] = c->sin;
    if (c->mask) ctx->saved_data["mask"] = *c->mask;
    ctx->saved_data["moe"] = reinterpret_cast<std::int64_t>(c->moe);
    if (offload) {
      ctx->saved_data["offload"] = reinterpret_cast<std::int64_t>(offload);
      ctx->saved_data["handle"] = offload->stash(x, slot);
    } else {
      ctx->save_for_backward({x});
    }
    torch::NoGradGuard no_grad;
    return b->forward(*c, x);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto* b = reinterpret_cast<const Block*>(ctx->saved_data["block"].toInt());
    BlockContext c{reinterpret_cast<const ModelArgs*>(ctx->saved_data["args"].toInt()),
                   ctx->saved_data["cos"].toTensor(), ctx->saved_data["sin"].toTensor(), std::nullopt};
    if (ctx->saved_data.count("mask")) c.mask = ctx->saved_data["mask"].toTensor();
    // The same routing settings as the forward (force_balanced, the router's dtype, the
    // grouped GEMM), or the recomputed block would not be the one that ran.
    c.moe = reinterpret_cast<const MoeSettings*>(ctx->saved_data["moe"].toInt());
    Tensor saved = ctx->saved_data.count("offload")
                       ? reinterpret_cast<ActivationOffload*>(ctx->saved_data["offload"].toInt())
                             ->take(ctx->saved_data["handle"].toInt())
                       : ctx->get_saved_variables()[0];
    Tensor x = saved.detach().requires_grad_(true);
    Tensor y;
    {
      torch::AutoGradMode grad_on(true);
      y = b->forward(c, x);
    }
    torch::autograd::backward({y}, {grad_out[0]});
    return {x.grad(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

}  // namespace

Linear ParamLookup::linear(const std::string& prefix) const {
  Linear l{find_(prefix + ".weight"), find_(prefix + ".bias")};
  if (!l.weight.defined()) return l;
  if (linears_) linears_->push_back(prefix + ".weight");
  l.fp8 = fp8_ && fp8_(prefix + ".weight");
  return l;
}

Tensor checkpointed_block(const Tensor& x, const Block& b, const BlockContext& c, ActivationOffload* offload,
                          std::int64_t slot) {
  return CheckpointedBlock::apply(x, &b, &c, offload, slot);
}

}  // namespace primecfg::train
