#include "models/qwen3_moe/block.hpp"

#include "models/qwen3_moe/names.hpp"
#include "nn/kernels/fused_ops.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace primecfg::train {

using torch::Tensor;

Qwen3MoeBlock::Qwen3MoeBlock(const ModelArgs& args, int layer, const ParamLookup& find)
    : attn_(layer, find), layer_(layer) {
  const std::string p = fmt::format("model.layers.{}.", layer);
  auto get = [&](std::string_view name) {
    Tensor t = find(p + std::string(name));
    if (!t.defined()) throw std::logic_error(fmt::format("Qwen3MoeBlock: no parameter {}{}", p, name));
    return t;
  };
  if (!args.moe.value().routed(layer)) {
    dense_.emplace(layer, find);
    return;
  }
  namespace n = qwen3_moe_names;
  experts_.router = get(n::router);
  for (std::int64_t e = 0; e < args.moe.value().experts; ++e) {
    experts_.w1.push_back(get(n::expert(e, n::gate)));
    experts_.w3.push_back(get(n::expert(e, n::up)));
    experts_.w2.push_back(get(n::expert(e, n::down)));
  }
}

Tensor Qwen3MoeBlock::forward(const BlockContext& c, const Tensor& x) const {
  const auto& a = *c.args;
  Tensor x1 = attention_residual(c, attn_, x);
  if (dense_) return mlp_residual(c, *dense_, attn_.post_norm, x1);
  Tensor g = fused::rms_norm(x1, attn_.post_norm, a.rms_eps);
  // The experts are separate parameters (transformers' per-expert tensors, each sharded and
  // offloaded on its own); moe_forward stacks them for the grouped GEMM.
  MoeSettings s = c.moe ? *c.moe : MoeSettings{};
  s.top_k = a.moe.value().top_k;
  s.norm_topk_prob = a.moe.value().norm_topk_prob;
  s.recompute_experts = c.recompute_routed_experts;
  const auto D = x.size(-1);
  MoeStats* stats = c.moe_stats ? &(*c.moe_stats)[static_cast<std::size_t>(layer_)] : nullptr;
  return x1 + moe_forward(experts_, s, g.reshape({-1, D}), stats).view_as(x1);
}

}  // namespace primecfg::train
