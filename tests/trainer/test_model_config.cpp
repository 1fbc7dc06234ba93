// config.json as the trainer reads it (model_config.hpp, no LibTorch): the cases
// that tests/trainer/hf_parity_test.py does not reach with transformers' own files.
#include "model/config.hpp"

#include <doctest/doctest.h>

#include <string>

namespace train = primecfg::train;

namespace {

// A valid Qwen3 config.json with `extra` spliced in before the closing brace.
std::string qwen3(const std::string& extra = "") {
  return R"({"model_type": "qwen3", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48)" +
         extra + "}";
}

train::ModelArgs parse(const std::string& text) { return train::parse_hf_config(text, "cfg/config.json"); }

}  // namespace

TEST_CASE("config.json: the defaults transformers' config classes use") {
  auto a = parse(qwen3());
  CHECK(a.head_dim == 128);  // Qwen3Config's default, not hidden_size / heads
  CHECK(a.rope_theta == 10000.0);
  CHECK_FALSE(a.tie_embeddings);
  auto b = parse(R"({"model_type": "qwen2", "vocab_size": 64, "hidden_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 32, "intermediate_size": 48})");
  CHECK(b.kv_heads == 32);  // Qwen2Config's default when the key is absent
  CHECK(b.head_dim == 2);
  CHECK(b.qkv_bias);
  CHECK_FALSE(b.o_bias());
  auto c = parse(R"({"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "intermediate_size": 48})");
  CHECK(c.kv_heads == 4);
  CHECK(c.max_positions == 2048);
}

TEST_CASE("config.json: what would be ambiguous or silently different is refused by name") {
  auto refused = [](const std::string& text, const char* needle) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(parse(text), doctest::Contains(needle), train::model_config_error);
  };
  refused(qwen3(R"(, "hidden_size": 64)"), "duplicate key");
  refused(qwen3(R"(, "rope_scaling": {"rope_type": "linear", "factor": 2.0},
                  "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0})"),
          "\"rope_parameters\"");
  refused(qwen3(R"(, "rope_theta": 5.0, "rope_parameters": {"rope_type": "default", "rope_theta": 6.0})"),
          "disagrees");
  refused(qwen3(R"(, "use_sliding_window": true)"), "\"use_sliding_window\"");
  refused(qwen3(R"(, "layer_types": ["full_attention", "sliding_attention"])"), "\"layer_types\"");
  refused(qwen3(R"(, "layer_types": ["full_attention"])"), "num_hidden_layers = 2");
  refused(qwen3(R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0})"), "low_freq_factor");
  refused(qwen3(R"(, "rope_scaling": {"rope_type": "linear", "factor": 2.0, "beta_fast": 3})"), "beta_fast");
  refused(qwen3(R"(, "rope_scaling": {"rope_type": "longrope"})"), "longrope");
  refused(qwen3(R"(, "partial_rotary_factor": 0.5)"), "partial_rotary_factor");
  refused(qwen3(R"(, "quantization_config": {"quant_method": "gptq"})"), "\"quantization_config\"");
  refused(qwen3(R"(, "head_dim": 7)"), "odd");
  // Positive, but 1 / theta^(254/256) overflows: infinite frequencies (the fuzzer's find).
  refused(qwen3(R"(, "head_dim": 256, "rope_theta": 10000001e-320)"), "RoPE frequencies infinite");
  refused(R"({"model_type": "qwen3", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 3, "intermediate_size": 48})",
          "not a multiple");
  refused(qwen3(R"(, "vocab_size": -1)"), "\"vocab_size\"");
  refused(qwen3(R"(, "vocab_size": 1.5)"), "\"vocab_size\"");
  refused(R"({"model_type": "qwen2", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2,
              "num_attention_heads": 4, "intermediate_size": 48, "attention_bias": false})",
          "\"attention_bias\"");
  refused(R"({"vocab_size": 64})", "\"model_type\"");
}

TEST_CASE("config.json: written and read back, every setting survives") {
  for (const auto& name : train::preset_names()) {
    CAPTURE(name);
    auto a = *train::preset(name);
    auto b = parse(train::hf_config_json(a, "bfloat16"));
    CHECK(b.params().size() == a.params().size());
    CHECK(b.total_params() == a.total_params());
    CHECK(b.rope_inv_freq() == a.rope_inv_freq());
    CHECK(b.rope_attention_scaling() == a.rope_attention_scaling());
    CHECK(b.eos_token_id == a.eos_token_id);
  }
}

TEST_CASE("presets: Llama 3.1 and 3.2 carry their llama3 RoPE scaling, Llama 3 does not") {
  auto l3 = *train::preset("meta-llama/Meta-Llama-3-8B");
  auto l31 = *train::preset("meta-llama/Llama-3.1-8B");
  CHECK(l3.rope_scaling.type == train::RopeScaling::Type::none);
  CHECK(l31.rope_scaling.type == train::RopeScaling::Type::llama3);
  CHECK(l31.rope_scaling.factor == 8.0);
  CHECK(train::preset("meta-llama/Llama-3.2-1B")->rope_scaling.factor == 32.0);
  CHECK(l3.total_params() == l31.total_params());
  // The highest frequency is not scaled, the lowest is divided by the factor.
  auto f3 = l3.rope_inv_freq(), f31 = l31.rope_inv_freq();
  CHECK(f31.front() == f3.front());
  CHECK(f31.back() == doctest::Approx(f3.back() / 8.0));
}

TEST_CASE("Qwen3-MoE presets: transformers' parameter counts, and MFU counts the experts a token uses") {
  // Qwen3MoeForCausalLM of these configs on the meta device (transformers 5.24): 30,532,122,624
  // and 235,093,634,560 parameters.
  const auto a3b = primecfg::train::preset("Qwen/Qwen3-30B-A3B");
  const auto a22b = primecfg::train::preset("Qwen/Qwen3-235B-A22B");
  REQUIRE(a3b);
  REQUIRE(a22b);
  CHECK(a3b->total_params() == 30532122624);
  CHECK(a22b->total_params() == 235093634560);
  // Per routed block: q, k, v, o (18,874,368), the router (128 x 2048) and 8 of 128 experts'
  // three 768 x 2048 projections; then the LM head: 3.04 B of the 3.3 B "activated" (the
  // embedding is the rest).
  const std::int64_t block = 18874368 + 128 * 2048 + 8 * 3 * 768 * 2048;
  CHECK(a3b->active_matmul_params() == 48 * block + 151936 * 2048);
  CHECK(a3b->flops_per_token(4096) == 6.0 * (48 * block + 151936 * 2048) + 12.0 * 48 * 32 * 128 * 4096);
  // transformers' rule for which blocks route: not in mlp_only_layers, (i + 1) % step == 0.
  primecfg::train::MoeArgs m;
  m.experts = 4, m.sparse_step = 2, m.dense_layers = {3};
  CHECK_FALSE(m.routed(0));
  CHECK(m.routed(1));
  CHECK_FALSE(m.routed(3));
  CHECK(m.routed(5));
}
