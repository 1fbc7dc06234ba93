// Qwen3-MoE as an architecture (spec.hpp): the Llama family's keys and attention
// (models/llama/spec.hpp), routed experts in the blocks transformers routes.
#include "models/qwen3_moe/spec.hpp"

#include "model/config.hpp"
#include "model/config_reader.hpp"
#include "models/llama/spec.hpp"
#include "models/qwen3_moe/names.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

namespace primecfg::train {

namespace {

using i64 = std::int64_t;
namespace json = strict_json;

class Qwen3Moe final : public Architecture {
 public:
  std::string_view name() const override { return "qwen3_moe"; }
  std::vector<std::string_view> model_types() const override { return {"qwen3_moe"}; }

  void read_config(ConfigReader& r, ModelArgs& a) const override {
    llama_family::read_config(r, a);
    MoeArgs m;
    // transformers 5 writes num_local_experts (its name for num_experts); 4.x and the
    // published configs num_experts.
    const bool local = r.get("num_local_experts") != nullptr;
    m.experts = r.size(local ? "num_local_experts" : "num_experts", 128);
    if (local && r.get("num_experts") && r.size("num_experts") != m.experts)
      r.fail("num_experts",
             fmt::format("{} disagrees with num_local_experts = {}", r.size("num_experts"), m.experts));
    if (!local) r.get("num_local_experts");
    m.top_k = r.size("num_experts_per_tok", 8);
    m.intermediate = r.size("moe_intermediate_size", 768);
    m.sparse_step = r.size("decoder_sparse_step", 1);
    if (const json::value* v = r.get("mlp_only_layers")) {
      if (!v->is_array()) r.fail_value("mlp_only_layers", *v, "must be a list of block indices");
      for (const auto& l : *v) {
        const std::optional<i64> n = json::integer(l);
        if (!n || *n < 0 || *n >= a.layers)
          r.fail_value("mlp_only_layers", l,
                       fmt::format("must be a block index below num_hidden_layers = {}", a.layers));
        m.dense_layers.push_back(*n);
      }
    }
    m.norm_topk_prob = r.boolean("norm_topk_prob", false);
    if (const json::value* v = r.get("router_aux_loss_coef")) {
      if (!v->is_number() || !(v->get<double>() >= 0) || !std::isfinite(v->get<double>()))
        r.fail_value("router_aux_loss_coef", *v, "must be a number at least 0");
      m.router_aux_loss_coef = v->get<double>();
    }
    // transformers adds router_aux_loss_coef x the load-balancing loss when this is true;
    // prime-rl never adds it, and neither does primecfg-train, so true would train
    // something else than it says.
    if (r.boolean("output_router_logits", false))
      r.fail(
          "output_router_logits",
          "true adds transformers' auxiliary load-balancing loss, which primecfg-train (like prime-rl) does "
          "not add; set false");
    if (m.top_k > m.experts)
      r.fail("num_experts_per_tok", fmt::format("{} is more than num_experts = {}", m.top_k, m.experts));
    a.moe = m;
  }

  json::ordered write_config(const ModelArgs& a) const override {
    json::ordered out = llama_family::write_config(a);
    const MoeArgs& m = a.moe.value();
    out["num_experts"] = m.experts;
    out["num_experts_per_tok"] = m.top_k;
    out["moe_intermediate_size"] = m.intermediate;
    out["decoder_sparse_step"] = m.sparse_step;
    out["mlp_only_layers"] = m.dense_layers;
    out["norm_topk_prob"] = m.norm_topk_prob;
    out["router_aux_loss_coef"] = m.router_aux_loss_coef;
    out["output_router_logits"] = false;
    return out;
  }

  std::vector<std::pair<std::string, std::string>> computation_keys(const ModelArgs& a) const override {
    const MoeArgs& m = a.moe.value();
    return {{"intermediate_size", fmt::format("{}", a.intermediate)},
            {"attention_bias", fmt::format("{}", a.attention_bias)},
            {"num_experts", fmt::format("{}", m.experts)},
            {"num_experts_per_tok", fmt::format("{}", m.top_k)},
            {"moe_intermediate_size", fmt::format("{}", m.intermediate)},
            {"decoder_sparse_step", fmt::format("{}", m.sparse_step)},
            {"mlp_only_layers", fmt::format("[{}]", fmt::join(m.dense_layers, ", "))},
            {"norm_topk_prob", fmt::format("{}", m.norm_topk_prob)}};
  }

  std::vector<std::pair<std::string, ModelArgs>> presets() const override {
    // The published config.json files of Qwen3-30B-A3B and Qwen3-235B-A22B.
    auto qwen3_moe = [](i64 hidden, i64 layers, i64 heads, i64 inter, i64 moe_inter) {
      ModelArgs a;
      a.model_type = "qwen3_moe";
      a.qk_norm = true;
      a.vocab_size = 151936, a.hidden = hidden, a.layers = layers, a.heads = heads, a.kv_heads = 4;
      a.head_dim = 128, a.intermediate = inter, a.rope_theta = 1000000.0, a.max_positions = 40960;
      a.tie_embeddings = false;
      a.bos_token_id = "151643", a.eos_token_id = "151645";
      MoeArgs m;
      m.experts = 128, m.top_k = 8, m.intermediate = moe_inter, m.norm_topk_prob = true;
      a.moe = m;
      return a;
    };
    // Small enough for the CPU tests: 8 experts, top-2, the second block dense.
    ModelArgs tiny;
    tiny.model_type = "qwen3_moe";
    MoeArgs m;
    m.experts = 8, m.top_k = 2, m.intermediate = 96, m.norm_topk_prob = true, m.dense_layers = {1};
    tiny.moe = m;
    return {{"primecfg/tiny-moe", tiny},
            {"Qwen/Qwen3-30B-A3B", qwen3_moe(2048, 48, 32, 6144, 768)},
            {"Qwen/Qwen3-235B-A22B", qwen3_moe(4096, 94, 64, 12288, 1536)}};
  }

  void block_params(const ModelArgs& a, int l, std::vector<ParamShape>& out) const override {
    using K = ParamShape::Kind;
    llama_family::attention_params(a, l, out);
    const i64 D = a.hidden;
    const std::string p = fmt::format("model.layers.{}.", l);
    auto matrix = [&](std::string_view name, i64 rows, i64 cols) {
      out.push_back({p + std::string(name), rows, cols, l, K::matrix});
    };
    if (!a.moe.value().routed(l)) return llama_family::mlp_params(a, l, out);
    namespace n = qwen3_moe_names;
    const MoeArgs& m = a.moe.value();
    matrix(n::router, m.experts, D);
    for (i64 e = 0; e < m.experts; ++e) {
      out.push_back({p + n::expert(e, n::gate), m.intermediate, D, l, K::matrix, e});
      out.push_back({p + n::expert(e, n::up), m.intermediate, D, l, K::matrix, e});
      out.push_back({p + n::expert(e, n::down), D, m.intermediate, l, K::matrix, e});
    }
  }

  // Counted, not listed: a block of 2^31 experts would be a list of billions of tensors.
  double block_param_count(const ModelArgs& a, int l) const override {
    std::vector<ParamShape> attn;
    llama_family::attention_params(a, l, attn);
    double n = 0;
    for (const auto& p : attn) n += static_cast<double>(p.rows) * static_cast<double>(p.cols);
    const double D = static_cast<double>(a.hidden);
    const MoeArgs& m = a.moe.value();
    if (!m.routed(l)) return n + 3 * D * static_cast<double>(a.intermediate);
    return n + static_cast<double>(m.experts) * D * (1 + 3 * static_cast<double>(m.intermediate));
  }

  // A token is multiplied by the router and by its top_k experts, not by the others.
  // (prime-rl's MFU counts every block as routed; for the published Qwen3-MoE configs,
  // which route in every block, the two agree.)
  i64 block_active_matmul_params(const ModelArgs& a, int l) const override {
    if (!a.moe.value().routed(l)) return Architecture::block_active_matmul_params(a, l);
    std::vector<ParamShape> attn;
    llama_family::attention_params(a, l, attn);
    i64 n = 0;
    for (const auto& p : attn)
      if (p.is_matrix()) n += p.numel();
    const MoeArgs& m = a.moe.value();
    return n + m.experts * a.hidden + m.top_k * 3 * m.intermediate * a.hidden;
  }

  // model.layers.{l}.mlp.gate.weight
  bool is_router(std::string_view name) const override {
    return name.rfind("model.layers.", 0) == 0 && name.size() > qwen3_moe_names::router.size() &&
           name.ends_with(qwen3_moe_names::router) &&
           name[name.size() - qwen3_moe_names::router.size() - 1] == '.';
  }

  // prime-rl's Qwen3-MoE holds the router's linear as mlp.router.gate
  // (models/layers/moe.py's TokenChoiceTopKRouter), where transformers has mlp.gate.
  std::string linear_module(std::string_view weight) const override {
    if (!is_router(weight)) return Architecture::linear_module(weight);
    weight.remove_suffix(qwen3_moe_names::router.size());
    return std::string(weight) + "mlp.router.gate";
  }

  // transformers 5's layout: experts.gate_up_proj [E, 2I, D] (each expert's gate rows,
  // then its up rows) and experts.down_proj [E, D, I].
  std::optional<HfSlice> hf_fused_source(const ModelArgs& a, std::string_view name) const override {
    constexpr std::string_view layers = "model.layers.", experts = ".mlp.experts.";
    if (name.rfind(layers, 0) != 0) return std::nullopt;
    const auto mid = name.find(experts);
    if (mid == std::string_view::npos) return std::nullopt;
    const std::string_view block(name.substr(0, mid));  // model.layers.{l}
    std::string_view rest = name.substr(mid + experts.size());
    const auto dot = rest.find('.');
    if (dot == std::string_view::npos) return std::nullopt;
    i64 e = 0;
    for (char ch : rest.substr(0, dot)) {
      if (ch < '0' || ch > '9') return std::nullopt;
      e = e * 10 + (ch - '0');
    }
    rest.remove_prefix(dot + 1);
    namespace n = qwen3_moe_names;
    const i64 E = a.moe.value().experts, I = a.moe.value().intermediate, D = a.hidden;
    const std::string fused = std::string(block) + std::string(experts);
    if (rest == std::string(n::gate) + ".weight")
      return HfSlice{fused + "gate_up_proj", {E, 2 * I, D}, e, 0, I};
    if (rest == std::string(n::up) + ".weight")
      return HfSlice{fused + "gate_up_proj", {E, 2 * I, D}, e, I, I};
    if (rest == std::string(n::down) + ".weight") return HfSlice{fused + "down_proj", {E, D, I}, e, 0, D};
    return std::nullopt;
  }

  // nn/moe.cpp's forward and backward under autograd, per token, for a routed block
  // (checked on the GPU: docs/memory-planner.md); a dense one is the Llama family's MLP.
  // The groups' padding (fewer than align rows per expert and micro-batch: an expert
  // without tokens gets align rows) is left out.
  BlockMemory block_memory(const ModelArgs& s, const BlockKernels& k) const override {
    const i64 dt = k.dtype_bytes, D = s.hidden;
    const BlockMemory attn = llama_family::attention_memory(s, k);
    const i64 mlp_norm = rms_norm_saved(D, dt, k.fused_norm) + 4 + D * dt;  // x1, rstd, rmsnorm(x1)
    const MoeArgs& m = s.moe.value();
    // The routed block: the router's FP32 input and probabilities, the top-k weights and
    // ids; per slot its row in the experts' buffer, its gate, up, silu(gate) and product,
    // its expert's output (which the weighted sum keeps), and the sum's indices (the
    // slot's buffer row, the row's token, 8 bytes each, and its weight, 4).
    const i64 K = m.top_k, I = m.intermediate;
    const i64 router = D * 4 + m.experts * 4 + K * (4 + 8);
    // Recomputed in the backward (selective checkpointing of "routed_experts"), the
    // experts keep only the slots' order and weights; with expert parallelism also the
    // rows received (which they recompute from), the rows returned (which the weighted
    // sum keeps, outside the recompute) and two indices of each.
    const i64 exchanged = k.expert_parallel > 1 ? 2 * D * dt + 16 : 0;
    const i64 experts_whole = K * (D * dt + 4 * I * dt + D * dt + 8 + 8 + 4);
    const i64 experts = k.recompute_routed_experts ? K * (8 + 4 + exchanged) : experts_whole;
    // The dense MLP (the blocks in mlp_only_layers) is the Llama family's.
    const i64 dense = (k.fused_swiglu && dt == 2 ? 3 : 4) * s.intermediate * dt;
    // The largest of the kinds of block the model has.
    bool any_routed = false, any_dense = false;
    for (i64 l = 0; l < s.layers; ++l) (m.routed(l) ? any_routed : any_dense) = true;
    const i64 mlp = std::max(any_routed ? router + experts : 0, any_dense ? dense : 0);
    // The backward's stages are against the block's activations whole (recomputed ones
    // included): what they free is of those.
    const i64 mlp_whole = std::max(any_routed ? router + experts_whole : 0, any_dense ? dense : 0);
    // The grouped GEMM reads the experts stacked ([E, I, D] per projection, nn/moe.cpp): a
    // copy, made in the block's forward (or its experts' recompute) and again for its
    // backward, freed between; with expert parallelism, of this rank's experts only.
    const i64 stacked = any_routed ? 3 * (m.experts / k.expert_parallel) * I * D * dt : 0;
    const i64 third = stacked / 3;
    // The routed block's backward (nn/moe.cpp; the order bench/trainer/moe_memory_replica.py
    // shows), beside the gradient coming in (D a token), per slot against what it saved:
    // the weighted sum's backward, each slot's share of its token's gradient and its
    // product with the expert's output in FP32; then each GEMM's backward with the copy
    // stacked again, which frees a projection's third of it and makes its gradient's: the
    // down projection's (the output's row gone, the product's gradient made), the SwiGLU's
    // (its three saved rows gone, two I-wide gradients made), then the gate's and the up
    // projection's, each a D-wide gradient of the slot's row.
    const i64 g = D * dt;
    std::vector<BackwardStage> stages;
    if (any_routed) {
      stages = {
          {.per_token = g + K * 8 * D},
          {.per_token = g + K * I * dt, .in_use = stacked, .in_use_grad = third},
          {.per_token = g + K * (2 * I - D) * dt, .in_use = 2 * third, .in_use_grad = third},
          {.per_token = g - K * 2 * I * dt, .in_use = 2 * third, .in_use_grad = 2 * third},
          {.per_token = g + K * (D - 3 * I) * dt, .in_use = third, .in_use_grad = stacked},
          // The attention's, the experts' gradient still held.
          {.per_token = attn.backward.front().per_token - (mlp_whole + mlp_norm), .in_use_grad = stacked}};
      // The weighted sum's forward, where it runs again: each slot's row gathered and its
      // FP32 product with its weight, and the FP32 sum. Selective checkpointing of the
      // experts reruns it in every backward, unless the sum waits for the exchange's return.
      stages.push_back({.per_token = g + K * (dt + 4) * D + 4 * D,
                        .recomputed = !(k.recompute_routed_experts && k.expert_parallel == 1)});
    }
    // The dense MLP's (the blocks in mlp_only_layers): the residual gradient and two
    // I-wide gradients.
    if (any_dense) stages.push_back({.per_token = (D + 2 * s.intermediate) * dt});
    if (!any_routed)
      stages.push_back({.per_token = attn.backward.front().per_token - (mlp_whole + mlp_norm)});
    return {attn.saved + mlp_norm + mlp, std::move(stages), stacked};
  }
};

}  // namespace

const Architecture& qwen3_moe_architecture() {
  static const Qwen3Moe a;
  return a;
}

}  // namespace primecfg::train
