#include "nn/block.hpp"

#include "nn/kernels/fused_ops.hpp"

#include <cstdint>

namespace primecfg::train {

using torch::Tensor;

namespace {

// x @ w^T (+ b): a plain matmul where the architecture has no bias, as before biases existed.
Tensor project(const Tensor& x, const Tensor& w, const Tensor& b) {
  return b.defined() ? at::linear(x, w, b) : torch::matmul(x, w.t());
}

}  // namespace

Tensor block_forward(const BlockWeights& w, const BlockContext& c, const Tensor& x) {
  const auto& a = *c.args;
  const auto B = x.size(0), T = x.size(1);
  // Attention. The norms, RoPE and the SwiGLU are fused CUDA kernels on bf16 GPU tensors
  // (kernels/fused_ops.hpp), ATen's operators elsewhere.
  Tensor h = fused::rms_norm(x, w.in_norm, a.rms_eps);
  Tensor q = project(h, w.wq, w.bq).view({B, T, a.heads, a.head_dim});
  Tensor k = project(h, w.wk, w.bk).view({B, T, a.kv_heads, a.head_dim});
  Tensor v = project(h, w.wv, w.bv).view({B, T, a.kv_heads, a.head_dim});
  // QK-norm (where the architecture has it), then RoPE.
  q = fused::norm_rope(q, a.qk_norm() ? w.q_norm : Tensor(), c.cos, c.sin, a.rms_eps).transpose(1, 2);
  k = fused::norm_rope(k, a.qk_norm() ? w.k_norm : Tensor(), c.cos, c.sin, a.rms_eps).transpose(1, 2);
  v = v.transpose(1, 2);
  Tensor o = c.mask ? at::scaled_dot_product_attention(q, k, v, *c.mask, 0.0, false, std::nullopt, true)
                    : at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, true, std::nullopt, true);
  o = o.transpose(1, 2).reshape({B, T, a.heads * a.head_dim});
  Tensor x1 = x + project(o, w.wo, w.bo);
  // SwiGLU MLP
  Tensor g = fused::rms_norm(x1, w.post_norm, a.rms_eps);
  Tensor m = fused::swiglu(project(g, w.w_gate, w.b_gate), project(g, w.w_up, w.b_up));
  return x1 + project(m, w.w_down, w.b_down);
}

namespace {

// Activation checkpointing: forward runs the block without recording a graph and
// keeps only its input; backward runs the block again with grad enabled and
// backpropagates through that fresh graph (parameter gradients accumulate there,
// so their post-accumulate hooks fire as usual).
// The block weights and model args outlive the graph (they belong to the model);
// the per-batch RoPE tables and mask travel in the autograd context.
struct CheckpointedBlock : torch::autograd::Function<CheckpointedBlock> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, Tensor x, const BlockWeights* w,
                        const BlockContext* c, ActivationOffload* offload, std::int64_t slot) {
    ctx->saved_data["w"] = reinterpret_cast<std::int64_t>(w);
    ctx->saved_data["args"] = reinterpret_cast<std::int64_t>(c->args);
    ctx->saved_data["cos"] = c->cos;
    ctx->saved_data["sin"] = c->sin;
    if (c->mask) ctx->saved_data["mask"] = *c->mask;
    if (offload) {
      ctx->saved_data["offload"] = reinterpret_cast<std::int64_t>(offload);
      ctx->saved_data["handle"] = offload->stash(x, slot);
    } else {
      ctx->save_for_backward({x});
    }
    torch::NoGradGuard no_grad;
    return block_forward(*w, *c, x);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto* w = reinterpret_cast<const BlockWeights*>(ctx->saved_data["w"].toInt());
    BlockContext c{reinterpret_cast<const ModelArgs*>(ctx->saved_data["args"].toInt()),
                   ctx->saved_data["cos"].toTensor(), ctx->saved_data["sin"].toTensor(), std::nullopt};
    if (ctx->saved_data.count("mask")) c.mask = ctx->saved_data["mask"].toTensor();
    Tensor saved = ctx->saved_data.count("offload")
                       ? reinterpret_cast<ActivationOffload*>(ctx->saved_data["offload"].toInt())
                             ->take(ctx->saved_data["handle"].toInt())
                       : ctx->get_saved_variables()[0];
    Tensor x = saved.detach().requires_grad_(true);
    Tensor y;
    {
      torch::AutoGradMode grad_on(true);
      y = block_forward(*w, c, x);
    }
    torch::autograd::backward({y}, {grad_out[0]});
    return {x.grad(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

}  // namespace

Tensor checkpointed_block(const Tensor& x, const BlockWeights& w, const BlockContext& c,
                          ActivationOffload* offload, std::int64_t slot) {
  return CheckpointedBlock::apply(x, &w, &c, offload, slot);
}

}  // namespace primecfg::train
