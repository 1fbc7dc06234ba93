#include "models/llama/block.hpp"

#include "models/llama/names.hpp"

#include "nn/kernels/fused_ops.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <string>

namespace primecfg::train {

using torch::Tensor;

namespace {

// x @ w^T (+ b): a plain matmul where the architecture has no bias, as before biases existed.
Tensor project(const Tensor& x, const Tensor& w, const Tensor& b) {
  return b.defined() ? at::linear(x, w, b) : torch::matmul(x, w.t());
}

}  // namespace

LlamaBlock::LlamaBlock(int layer, const ParamLookup& find) {
  namespace n = llama_names;
  const std::string p = fmt::format("model.layers.{}.", layer);
  auto get = [&](std::string_view name, std::string_view suffix = "") {
    return find(p + std::string(name) + std::string(suffix));
  };
  auto& b = w_;
  b.in_norm = get(n::input_norm);
  b.wq = get(n::q, ".weight"), b.bq = get(n::q, ".bias");
  b.wk = get(n::k, ".weight"), b.bk = get(n::k, ".bias");
  b.wv = get(n::v, ".weight"), b.bv = get(n::v, ".bias");
  b.wo = get(n::o, ".weight"), b.bo = get(n::o, ".bias");
  b.q_norm = get(n::q_norm);
  b.k_norm = get(n::k_norm);
  b.post_norm = get(n::post_norm);
  b.w_gate = get(n::gate, ".weight"), b.b_gate = get(n::gate, ".bias");
  b.w_up = get(n::up, ".weight"), b.b_up = get(n::up, ".bias");
  b.w_down = get(n::down, ".weight"), b.b_down = get(n::down, ".bias");
}

Tensor LlamaBlock::forward(const BlockContext& c, const Tensor& x) const {
  const BlockWeights& w = w_;
  const auto& a = *c.args;
  const auto B = x.size(0), T = x.size(1);
  // Attention. The norms, RoPE and the SwiGLU are fused CUDA kernels on bf16 GPU tensors
  // (kernels/fused_ops.hpp), ATen's operators elsewhere.
  Tensor h = fused::rms_norm(x, w.in_norm, a.rms_eps);
  Tensor q = project(h, w.wq, w.bq).view({B, T, a.heads, a.head_dim});
  Tensor k = project(h, w.wk, w.bk).view({B, T, a.kv_heads, a.head_dim});
  Tensor v = project(h, w.wv, w.bv).view({B, T, a.kv_heads, a.head_dim});
  // QK-norm (where the architecture has it), then RoPE.
  q = fused::norm_rope(q, a.qk_norm ? w.q_norm : Tensor(), c.cos, c.sin, a.rms_eps).transpose(1, 2);
  k = fused::norm_rope(k, a.qk_norm ? w.k_norm : Tensor(), c.cos, c.sin, a.rms_eps).transpose(1, 2);
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

}  // namespace primecfg::train
