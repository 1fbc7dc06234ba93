#include "models/qwen3_moe/block.hpp"

#include "models/llama/names.hpp"
#include "models/qwen3_moe/names.hpp"
#include "nn/kernels/fused_ops.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace primecfg::train {

using torch::Tensor;

Qwen3MoeBlock::Qwen3MoeBlock(const ModelArgs& args, int layer, const ParamLookup& find)
    : attn_(layer, find), layer_(layer), routed_(args.moe.value().routed(layer)) {
  const std::string p = fmt::format("model.layers.{}.", layer);
  auto get = [&](std::string_view name) {
    Tensor t = find(p + std::string(name));
    if (!t.defined()) throw std::logic_error(fmt::format("Qwen3MoeBlock: no parameter {}{}", p, name));
    return t;
  };
  if (!routed_) {
    namespace n = llama_names;
    w_gate_ = get(std::string(n::gate) + ".weight");
    w_up_ = get(std::string(n::up) + ".weight");
    w_down_ = get(std::string(n::down) + ".weight");
    return;
  }
  namespace n = qwen3_moe_names;
  router_ = get(n::router);
  for (std::int64_t e = 0; e < args.moe.value().experts; ++e) {
    w1_.push_back(get(n::expert(e, n::gate)));
    w3_.push_back(get(n::expert(e, n::up)));
    w2_.push_back(get(n::expert(e, n::down)));
  }
}

Tensor Qwen3MoeBlock::forward(const BlockContext& c, const Tensor& x) const {
  const auto& a = *c.args;
  Tensor x1 = attention_residual(c, attn_, x);
  Tensor g = fused::rms_norm(x1, attn_.post_norm, a.rms_eps);
  if (!routed_)
    return x1 + torch::matmul(fused::swiglu(torch::matmul(g, w_gate_.t()), torch::matmul(g, w_up_.t())),
                              w_down_.t());
  // The experts are separate parameters (transformers' per-expert tensors, each sharded and
  // offloaded on its own); the grouped GEMM reads them stacked.
  MoeWeights w{router_, torch::stack(w1_), torch::stack(w3_), torch::stack(w2_)};
  MoeSettings s = c.moe ? *c.moe : MoeSettings{};
  s.top_k = a.moe.value().top_k;
  s.norm_topk_prob = a.moe.value().norm_topk_prob;
  const auto D = x.size(-1);
  MoeStats* stats = c.moe_stats ? &(*c.moe_stats)[static_cast<std::size_t>(layer_)] : nullptr;
  return x1 + moe_forward(w, s, g.reshape({-1, D}), stats).view_as(x1);
}

}  // namespace primecfg::train
