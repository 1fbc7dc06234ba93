// The GELU test architecture's description (gelu.hpp).
#include "model/config.hpp"
#include "model/config_reader.hpp"
#include "models/gelu/gelu.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace primecfg::train::test {

namespace {

using i64 = std::int64_t;

class Gelu final : public Architecture {
 public:
  std::string_view name() const override { return kGeluName; }
  std::vector<std::string_view> model_types() const override { return {kGeluModelType}; }

  void read_config(ConfigReader& r, ModelArgs& a) const override {
    a.qk_norm = false;
    a.intermediate = r.size("intermediate_size");
    a.kv_heads = r.size("num_key_value_heads");
    a.head_dim = r.size("head_dim", a.hidden / a.heads);
    a.max_positions = r.size("max_position_embeddings", 2048);
    a.rms_eps = r.positive("rms_norm_eps", 1e-6);
    a.tie_embeddings = r.boolean("tie_word_embeddings", false);
    read_rope(r, a);
    if (const std::string act = r.string("hidden_act", "gelu_pytorch_tanh"); act != "gelu_pytorch_tanh")
      r.fail("hidden_act", fmt::format("\"{}\" is not this architecture's (gelu_pytorch_tanh)", act));
  }

  strict_json::ordered write_config(const ModelArgs& a) const override {
    return {{"architectures", {"PrimecfgGeluTestForCausalLM"}},
            {"model_type", kGeluModelType},
            {"vocab_size", a.vocab_size},
            {"hidden_size", a.hidden},
            {"num_hidden_layers", a.layers},
            {"num_attention_heads", a.heads},
            {"num_key_value_heads", a.kv_heads},
            {"head_dim", a.head_dim},
            {"intermediate_size", a.intermediate},
            {"hidden_act", "gelu_pytorch_tanh"},
            {"max_position_embeddings", a.max_positions},
            {"rope_theta", a.rope_theta},
            {"rope_scaling", rope_scaling_json(a)},
            {"rms_norm_eps", a.rms_eps},
            {"tie_word_embeddings", a.tie_embeddings}};
  }

  std::vector<std::pair<std::string, std::string>> computation_keys(const ModelArgs& a) const override {
    return {{"intermediate_size", fmt::format("{}", a.intermediate)}};
  }

  std::vector<std::pair<std::string, ModelArgs>> presets() const override {
    ModelArgs a;
    a.model_type = std::string(kGeluModelType);
    a.qk_norm = false;
    a.vocab_size = 260, a.hidden = 64, a.layers = 2, a.heads = 4, a.kv_heads = 2, a.head_dim = 16;
    a.intermediate = 256, a.tie_embeddings = true;
    return {{std::string(kGeluPreset), a}};
  }

  void block_params(const ModelArgs& a, int l, std::vector<ParamShape>& out) const override {
    using K = ParamShape::Kind;
    const i64 D = a.hidden, q = a.heads * a.head_dim, kv = a.kv_heads * a.head_dim, I = a.intermediate;
    const std::string p = fmt::format("model.layers.{}.", l);
    auto add = [&](std::string_view name, i64 rows, i64 cols, K kind) {
      out.push_back({p + std::string(name), rows, cols, l, kind});
    };
    add("input_layernorm.weight", D, 1, K::norm);
    add("self_attn.q_proj.weight", q, D, K::matrix);
    add("self_attn.k_proj.weight", kv, D, K::matrix);
    add("self_attn.v_proj.weight", kv, D, K::matrix);
    add("self_attn.o_proj.weight", D, q, K::matrix);
    add("post_attention_layernorm.weight", D, 1, K::norm);
    add("mlp.fc_in.weight", I, D, K::matrix);
    add("mlp.fc_out.weight", D, I, K::matrix);
  }

  // ATen's operators under autograd: RMSNorm saves its input and rstd (FP32 copies on
  // the composite path), SDPA q, k, v, its output and logsumexp, fc_in its input, the GELU
  // its input (fc_in's output), fc_out the GELU's output.
  BlockMemory block_memory(const ModelArgs& s, const BlockKernels& k) const override {
    const i64 dt = k.dtype_bytes, D = s.hidden, q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
    const i64 I = s.intermediate;
    const i64 attn = rms_norm_saved(D, dt, k.fused_norm) + 4 + D * dt + (2 * q + 2 * kv) * dt + s.heads * 4;
    const i64 mlp = rms_norm_saved(D, dt, k.fused_norm) + 4 + D * dt + 2 * I * dt;
    // The MLP's backward holds the residual gradient and two I-wide gradients; the
    // attention's dq, dk, dv and an FP32 dq accumulator.
    return {attn + mlp, {{.per_token = (D + 2 * I) * dt}, {.per_token = (D + 2 * q + 2 * kv) * dt + 4 * q}}};
  }
};

}  // namespace

const Architecture& gelu_architecture() {
  static const Gelu a;
  return a;
}

}  // namespace primecfg::train::test
