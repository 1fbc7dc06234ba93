// The GELU test architecture's block (gelu.hpp).
#include "models/gelu/gelu.hpp"

#include "nn/kernels/fused_ops.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace primecfg::train::test {

namespace {

using torch::Tensor;

class GeluBlock final : public Block {
 public:
  GeluBlock(int layer, const ParamLookup& find) {
    const std::string p = fmt::format("model.layers.{}.", layer);
    auto get = [&](const char* name) {
      Tensor t = find(p + name);
      if (!t.defined()) throw std::logic_error(fmt::format("GeluBlock: no parameter {}{}", p, name));
      return t;
    };
    in_norm_ = get("input_layernorm.weight"), post_norm_ = get("post_attention_layernorm.weight");
    wq_ = get("self_attn.q_proj.weight"), wk_ = get("self_attn.k_proj.weight");
    wv_ = get("self_attn.v_proj.weight"), wo_ = get("self_attn.o_proj.weight");
    fc_in_ = get("mlp.fc_in.weight"), fc_out_ = get("mlp.fc_out.weight");
  }

  Tensor forward(const BlockContext& c, const Tensor& x) const override {
    const auto& a = *c.args;
    const auto B = x.size(0), T = x.size(1);
    Tensor h = fused::rms_norm(x, in_norm_, a.rms_eps);
    Tensor q = torch::matmul(h, wq_.t()).view({B, T, a.heads, a.head_dim});
    Tensor k = torch::matmul(h, wk_.t()).view({B, T, a.kv_heads, a.head_dim});
    Tensor v = torch::matmul(h, wv_.t()).view({B, T, a.kv_heads, a.head_dim}).transpose(1, 2);
    q = fused::norm_rope(q, Tensor(), c.cos, c.sin, a.rms_eps).transpose(1, 2);
    k = fused::norm_rope(k, Tensor(), c.cos, c.sin, a.rms_eps).transpose(1, 2);
    Tensor o = c.mask
                   ? at::scaled_dot_product_attention(q, k, v, *c.mask, 0.0, false, std::nullopt, true)
                   : at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, true, std::nullopt, true);
    Tensor x1 = x + torch::matmul(o.transpose(1, 2).reshape({B, T, a.heads * a.head_dim}), wo_.t());
    Tensor g = fused::rms_norm(x1, post_norm_, a.rms_eps);
    return x1 + torch::matmul(at::gelu(torch::matmul(g, fc_in_.t()), "tanh"), fc_out_.t());
  }

 private:
  Tensor in_norm_, post_norm_, wq_, wk_, wv_, wo_, fc_in_, fc_out_;
};

}  // namespace

std::unique_ptr<Block> make_gelu_block(const ModelArgs&, int layer, const ParamLookup& find) {
  return std::make_unique<GeluBlock>(layer, find);
}

}  // namespace primecfg::train::test
