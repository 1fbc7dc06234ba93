// The Llama family as an architecture (spec.hpp): Llama, Qwen2 and Qwen3 share one
// block; they differ in biases, QK-norm and config.json's defaults.
#include "models/llama/spec.hpp"

#include "model/config.hpp"
#include "model/config_reader.hpp"
#include "models/llama/names.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace primecfg::train {

namespace {

using i64 = std::int64_t;
namespace json = strict_json;

// Llama 3.x: its published configs' settings.
ModelArgs llama(i64 vocab, i64 hidden, i64 layers, i64 heads, i64 kv, i64 head_dim, i64 inter, double theta,
                double eps, bool tied) {
  ModelArgs a;
  a.model_type = "llama";
  a.qk_norm = false;
  a.vocab_size = vocab, a.hidden = hidden, a.layers = layers, a.heads = heads, a.kv_heads = kv;
  a.head_dim = head_dim, a.intermediate = inter, a.rope_theta = theta, a.rms_eps = eps;
  a.tie_embeddings = tied;
  a.bos_token_id = "128000", a.eos_token_id = "128001";
  return a;
}

// Llama 3.1 / 3.2: the llama3 RoPE scaling of their published configs.
ModelArgs with_llama3_rope(ModelArgs a, double factor) {
  a.rope_scaling.type = RopeScaling::Type::llama3;
  a.rope_scaling.factor = factor;
  a.rope_scaling.low_freq_factor = 1.0;
  a.rope_scaling.high_freq_factor = 4.0;
  a.rope_scaling.original_max_positions = 8192;
  a.max_positions = 131072;
  return a;
}

class Llama final : public Architecture {
 public:
  std::string_view name() const override { return "llama"; }
  std::vector<std::string_view> model_types() const override { return {"llama", "qwen2", "qwen3"}; }

  void read_config(ConfigReader& r, ModelArgs& a) const override { llama_family::read_config(r, a); }

  json::ordered write_config(const ModelArgs& a) const override { return llama_family::write_config(a); }

  std::vector<std::pair<std::string, std::string>> computation_keys(const ModelArgs& a) const override {
    return {{"intermediate_size", fmt::format("{}", a.intermediate)},
            {"attention_bias", fmt::format("{}", a.attention_bias)},
            {"mlp_bias", fmt::format("{}", a.mlp_bias)}};
  }

  std::vector<std::pair<std::string, ModelArgs>> presets() const override {
    ModelArgs tiny;  // small enough to learn reverse-text in about a minute on two CPU cores
    ModelArgs qwen3;
    qwen3.model_type = "qwen3";
    qwen3.vocab_size = 151936, qwen3.hidden = 1024, qwen3.layers = 28, qwen3.heads = 16, qwen3.kv_heads = 8;
    qwen3.head_dim = 128, qwen3.intermediate = 3072, qwen3.rope_theta = 1000000.0,
    qwen3.max_positions = 40960;
    qwen3.bos_token_id = "151643", qwen3.eos_token_id = "151645";
    // The larger Qwen3 dense models: the same block, wider and deeper; from 8B up the LM
    // head is a matrix of its own.
    auto qwen3_size = [&](i64 hidden, i64 layers, i64 heads, i64 inter, bool tied) {
      ModelArgs a = qwen3;
      a.hidden = hidden, a.layers = layers, a.heads = heads, a.intermediate = inter, a.tie_embeddings = tied;
      return a;
    };
    ModelArgs llama3_8b = llama(128256, 4096, 32, 32, 8, 128, 14336, 500000.0, 1e-5, false);
    llama3_8b.max_positions = 8192;
    return {
        {"primecfg/tiny", tiny},
        {"Qwen/Qwen3-0.6B", qwen3},
        {"Qwen/Qwen3-1.7B", qwen3_size(2048, 28, 16, 6144, true)},
        {"Qwen/Qwen3-4B", qwen3_size(2560, 36, 32, 9728, true)},
        {"Qwen/Qwen3-8B", qwen3_size(4096, 36, 32, 12288, false)},
        {"Qwen/Qwen3-14B", qwen3_size(5120, 40, 40, 17408, false)},
        {"Qwen/Qwen3-32B", qwen3_size(5120, 64, 64, 25600, false)},
        {"meta-llama/Llama-3.2-1B",
         with_llama3_rope(llama(128256, 2048, 16, 32, 8, 64, 8192, 500000.0, 1e-5, true), 32)},
        {"meta-llama/Llama-3.2-3B",
         with_llama3_rope(llama(128256, 3072, 28, 24, 8, 128, 8192, 500000.0, 1e-5, true), 32)},
        {"meta-llama/Meta-Llama-3-8B", llama3_8b},
        {"meta-llama/Llama-3.1-8B", with_llama3_rope(llama3_8b, 8)},
        {"meta-llama/Llama-3.1-70B",
         with_llama3_rope(llama(128256, 8192, 80, 64, 8, 128, 28672, 500000.0, 1e-5, false), 8)},
    };
  }

  void block_params(const ModelArgs& a, int l, std::vector<ParamShape>& out) const override {
    llama_family::attention_params(a, l, out);
    llama_family::mlp_params(a, l, out);
  }

  // models/llama/block.cpp's forward under autograd, with the CUDA kernels: fused RMSNorm
  // saves its input and an FP32 rstd per row; SDPA saves q, k, v, its output and an FP32
  // logsumexp per head; RoPE saves only the shared cos/sin tables; the matmuls save
  // their activation input.
  BlockMemory block_memory(const ModelArgs& s, const BlockKernels& k) const override {
    const i64 dt = k.dtype_bytes, D = s.hidden, I = s.intermediate;
    const BlockMemory attn = llama_family::attention_memory(s, k);
    const i64 mlp_norm = rms_norm_saved(D, dt, k.fused_norm) + 4 + D * dt;  // x1, rstd, rmsnorm(x1)
    const i64 mlp = (k.fused_swiglu && dt == 2 ? 3 : 4) * I * dt;           // gate, silu(gate), up, product
    // The MLP stage of the backward: the residual gradient plus two I-wide gradients
    // (mul backward); the attention stage's, with the MLP's activations already freed.
    const i64 mlp_stage = (D + 2 * I) * dt;
    return {attn.saved + mlp_norm + mlp,
            {{.per_token = mlp_stage}, {.per_token = attn.backward.front().per_token - (mlp + mlp_norm)}}};
  }
};

}  // namespace

namespace llama_family {

void read_config(ConfigReader& r, ModelArgs& a) {
  const bool is_llama = a.model_type == "llama";
  const bool moe = a.model_type == "qwen3_moe";
  a.qk_norm = a.model_type == "qwen3" || moe;
  a.intermediate = r.size("intermediate_size");
  // Absent: llama uses the attention heads, Qwen2/3's configs default to 32, Qwen3-MoE's to 4.
  a.kv_heads = r.has("num_key_value_heads") && !r.get("num_key_value_heads")
                   ? a.heads  // null: both fall back to the attention heads
                   : r.size("num_key_value_heads", is_llama ? a.heads
                                                   : moe    ? 4
                                                            : 32);
  // Absent: Qwen3's config defaults to 128, the others (Qwen3-MoE's too) to hidden_size / heads.
  a.head_dim = r.size("head_dim", a.model_type == "qwen3" ? 128 : a.hidden / a.heads);
  a.max_positions = r.size("max_position_embeddings", is_llama ? 2048 : 32768);
  a.rms_eps = r.positive("rms_norm_eps", 1e-6);
  a.tie_embeddings = r.boolean("tie_word_embeddings", false);
  read_rope(r, a);

  if (const std::string act = r.string("hidden_act", "silu"); act != "silu")
    r.fail("hidden_act", fmt::format("\"{}\" is not implemented (the MLP is SwiGLU: silu)", act));
  if (const json::value* v = r.get("attention_dropout"); v && !(v->is_number() && v->get<double>() == 0.0))
    r.fail_value("attention_dropout", *v, "only 0.0 is implemented");
  if (a.model_type == "qwen2") {
    a.qkv_bias = true;  // Qwen2's q, k and v projections always have biases, o has none
  } else {
    a.attention_bias = r.boolean("attention_bias", false);
  }
  if (is_llama) {
    a.mlp_bias = r.boolean("mlp_bias", false);
    // Splits the projections into slices in transformers 4.x: the same sums.
    if (r.get("pretraining_tp")) r.size("pretraining_tp");
  } else {
    // Sliding-window attention is off unless use_sliding_window; then the window
    // size and max_window_layers have no effect.
    if (r.boolean("use_sliding_window", false))
      r.fail("use_sliding_window", "true is not implemented (sliding-window attention)");
    if (const json::value* w = r.get("sliding_window"); w && !w->is_number())
      r.fail_value("sliding_window", *w, "must be an integer or null");
    if (const json::value* m = r.get("max_window_layers"); m && !m->is_number())
      r.fail_value("max_window_layers", *m, "must be an integer");
    if (const json::value* lt = r.get("layer_types")) {
      if (!lt->is_array() || static_cast<i64>(lt->size()) != a.layers)
        r.fail_value("layer_types", *lt,
                     fmt::format("must list num_hidden_layers = {} layer types", a.layers));
      for (const auto& t : *lt)
        if (!t.is_string() || t.get<std::string>() != "full_attention")
          r.fail_value("layer_types", t, "only \"full_attention\" layers are implemented");
    }
  }
}

json::ordered write_config(const ModelArgs& a) {
  json::ordered out = {
      {"architectures",
       {a.model_type == "llama"       ? "LlamaForCausalLM"
        : a.model_type == "qwen2"     ? "Qwen2ForCausalLM"
        : a.model_type == "qwen3_moe" ? "Qwen3MoeForCausalLM"
                                      : "Qwen3ForCausalLM"}},
      {"model_type", a.model_type},
      {"vocab_size", a.vocab_size},
      {"hidden_size", a.hidden},
      {"num_hidden_layers", a.layers},
      {"num_attention_heads", a.heads},
      {"num_key_value_heads", a.kv_heads},
      {"head_dim", a.head_dim},
      {"intermediate_size", a.intermediate},
      {"hidden_act", "silu"},
      {"max_position_embeddings", a.max_positions},
      {"rope_theta", a.rope_theta},
      {"rope_scaling", rope_scaling_json(a)},
      {"rms_norm_eps", a.rms_eps},
      {"tie_word_embeddings", a.tie_embeddings},
      {"attention_dropout", 0.0},
  };
  if (a.model_type != "qwen2") out["attention_bias"] = a.attention_bias;
  if (a.model_type == "llama") out["mlp_bias"] = a.mlp_bias;
  if (a.model_type != "llama") out["use_sliding_window"] = false;
  return out;
}

void attention_params(const ModelArgs& a, int l, std::vector<ParamShape>& out) {
  using K = ParamShape::Kind;
  namespace n = llama_names;
  const i64 D = a.hidden, q = a.heads * a.head_dim, kv = a.kv_heads * a.head_dim;
  const std::string p = fmt::format("model.layers.{}.", l);
  auto add = [&](std::string_view name, i64 rows, i64 cols, K kind) {
    out.push_back({p + std::string(name), rows, cols, l, kind});
  };
  // A projection: its weight, then its bias when the architecture has one.
  auto linear = [&](std::string_view name, i64 out_features, i64 in_features, bool bias) {
    add(std::string(name) + ".weight", out_features, in_features, K::matrix);
    if (bias) add(std::string(name) + ".bias", out_features, 1, K::bias);
  };
  add(n::input_norm, D, 1, K::norm);
  linear(n::q, q, D, a.q_bias());
  linear(n::k, kv, D, a.q_bias());
  linear(n::v, kv, D, a.q_bias());
  linear(n::o, D, q, a.o_bias());
  if (a.qk_norm) {
    add(n::q_norm, a.head_dim, 1, K::norm);
    add(n::k_norm, a.head_dim, 1, K::norm);
  }
  add(n::post_norm, D, 1, K::norm);
}

void mlp_params(const ModelArgs& a, int l, std::vector<ParamShape>& out) {
  namespace n = llama_names;
  const i64 D = a.hidden, I = a.intermediate;
  const std::string p = fmt::format("model.layers.{}.", l);
  auto linear = [&](std::string_view name, i64 out_features, i64 in_features) {
    out.push_back(
        {p + std::string(name) + ".weight", out_features, in_features, l, ParamShape::Kind::matrix});
    if (a.mlp_bias)
      out.push_back({p + std::string(name) + ".bias", out_features, 1, l, ParamShape::Kind::bias});
  };
  linear(n::gate, I, D);
  linear(n::up, I, D);
  linear(n::down, D, I);
}

// block.cpp's attention under autograd, with the CUDA kernels: fused RMSNorm saves its
// input and an FP32 rstd per row; SDPA saves q, k, v, its output and an FP32 logsumexp
// per head; RoPE saves only the shared cos/sin tables; the matmuls save their input.
BlockMemory attention_memory(const ModelArgs& s, const BlockKernels& k) {
  const i64 dt = k.dtype_bytes, D = s.hidden, q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  const i64 attn_norm = rms_norm_saved(D, dt, k.fused_norm) + 4;  // x, rstd
  const i64 qkv_in = D * dt;                                      // rmsnorm(x)
  const i64 qk_norm = s.qk_norm ? rms_norm_saved(q + kv, dt, k.fused_norm) + (s.heads + s.kv_heads) * 4
                                : 0;                     // q, k before their norms, rstd
  const i64 sdpa = (2 * q + 2 * kv) * dt + s.heads * 4;  // q, k, v, out, lse
  // The attention stage of the backward: dq/dk/dv, an FP32 dq accumulator, softmax_d,
  // GQA expansion.
  const i64 stage =
      (D + 2 * q + 2 * kv) * dt + 4 * q + 4 * s.heads + (s.heads != s.kv_heads ? 2 * q * dt : 0);
  return {attn_norm + qkv_in + qk_norm + sdpa, {{.per_token = stage}}};
}

}  // namespace llama_family

const Architecture& llama_architecture() {
  static const Llama a;
  return a;
}

}  // namespace primecfg::train
