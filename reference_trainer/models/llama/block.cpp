#include "models/llama/block.hpp"

#include "models/llama/names.hpp"
#include "nn/kernels/fused_ops.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <string>

namespace primecfg::train {

using torch::Tensor;

namespace {

// Block `layer`'s tensor NAME; undefined when the model has none.
auto block_lookup(int layer, const ParamLookup& find) {
  return [p = fmt::format("model.layers.{}.", layer), &find](std::string_view name) {
    return find(p + std::string(name));
  };
}

// Block `layer`'s linear layer NAME.
auto block_linear(int layer, const ParamLookup& find) {
  return [p = fmt::format("model.layers.{}.", layer), &find](std::string_view name) {
    return find.linear(p + std::string(name));
  };
}

}  // namespace

AttentionWeights::AttentionWeights(int layer, const ParamLookup& find) {
  namespace n = llama_names;
  auto get = block_lookup(layer, find);
  auto linear = block_linear(layer, find);
  in_norm = get(n::input_norm);
  q = linear(n::q), k = linear(n::k), v = linear(n::v), o = linear(n::o);
  q_norm = get(n::q_norm);
  k_norm = get(n::k_norm);
  post_norm = get(n::post_norm);
}

Tensor attention_residual(const BlockContext& c, const AttentionWeights& w, const Tensor& x) {
  const auto& a = *c.args;
  const auto B = x.size(0), T = x.size(1);
  // The norms, RoPE and the SwiGLU are fused CUDA kernels on bf16 GPU tensors
  // (kernels/fused_ops.hpp), ATen's operators elsewhere.
  Tensor h = fused::rms_norm(x, w.in_norm, a.rms_eps);
  const auto qkv = apply_linears(h, {&w.q, &w.k, &w.v});
  Tensor q = qkv[0].view({B, T, a.heads, a.head_dim});
  Tensor k = qkv[1].view({B, T, a.kv_heads, a.head_dim});
  Tensor v = qkv[2].view({B, T, a.kv_heads, a.head_dim});
  // QK-norm (where the architecture has it), then RoPE.
  q = fused::norm_rope(q, a.qk_norm ? w.q_norm : Tensor(), c.cos, c.sin, a.rms_eps).transpose(1, 2);
  k = fused::norm_rope(k, a.qk_norm ? w.k_norm : Tensor(), c.cos, c.sin, a.rms_eps).transpose(1, 2);
  v = v.transpose(1, 2);
  Tensor o = c.mask ? at::scaled_dot_product_attention(q, k, v, *c.mask, 0.0, false, std::nullopt, true)
                    : at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, true, std::nullopt, true);
  o = o.transpose(1, 2).reshape({B, T, a.heads * a.head_dim});
  return x + w.o(o);
}

MlpWeights::MlpWeights(int layer, const ParamLookup& find) {
  namespace n = llama_names;
  auto linear = block_linear(layer, find);
  gate = linear(n::gate), up = linear(n::up), down = linear(n::down);
}

Tensor mlp_residual(const BlockContext& c, const MlpWeights& w, const Tensor& post_norm, const Tensor& x1) {
  Tensor g = fused::rms_norm(x1, post_norm, c.args->rms_eps);
  const auto gate_up = apply_linears(g, {&w.gate, &w.up});
  return x1 + w.down(fused::swiglu(gate_up[0], gate_up[1]));
}

LlamaBlock::LlamaBlock(int layer, const ParamLookup& find) : attn_(layer, find), mlp_(layer, find) {}

Tensor LlamaBlock::forward(const BlockContext& c, const Tensor& x) const {
  return mlp_residual(c, mlp_, attn_.post_norm, attention_residual(c, attn_, x));
}

}  // namespace primecfg::train
