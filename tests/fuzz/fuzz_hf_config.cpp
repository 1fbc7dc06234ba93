// Fuzz target: the trainer's reader of HF config.json (parse_hf_config,
// reference_trainer/model/config.hpp) on arbitrary text.
//
// Properties checked, beyond "no crash, no sanitizer report":
//  - it either returns a model or throws model_config_error (nothing else);
//  - an accepted model has positive sizes, an even head_dim, heads a multiple
//    of kv_heads, finite positive rms_eps and rope_theta;
//  - what the trainer writes for it (hf_config_json, the config.json of its
//    checkpoints) is read back as the same model, and written again byte for
//    byte the same (a checkpoint loads into the model that wrote it);
//  - its parameter list and RoPE frequencies can be computed (finite), with
//    counts that agree with each other.
#include "fuzz_check.hpp"
#include "model/config.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace {

using namespace primecfg::train;
using primecfg::fuzz::check;

bool same_opt(const std::optional<double>& a, const std::optional<double>& b) {
  return a.has_value() == b.has_value() && (!a || *a == *b);
}

bool same_moe(const std::optional<MoeArgs>& a, const std::optional<MoeArgs>& b) {
  if (a.has_value() != b.has_value()) return false;
  return !a || (a->experts == b->experts && a->top_k == b->top_k && a->intermediate == b->intermediate &&
                a->sparse_step == b->sparse_step && a->dense_layers == b->dense_layers &&
                a->norm_topk_prob == b->norm_topk_prob && a->router_aux_loss_coef == b->router_aux_loss_coef);
}

bool same(const ModelArgs& a, const ModelArgs& b) {
  const RopeScaling &r = a.rope_scaling, &s = b.rope_scaling;
  return same_moe(a.moe, b.moe) && a.model_type == b.model_type && a.qk_norm == b.qk_norm &&
         a.vocab_size == b.vocab_size && a.hidden == b.hidden && a.layers == b.layers && a.heads == b.heads &&
         a.kv_heads == b.kv_heads && a.head_dim == b.head_dim && a.intermediate == b.intermediate &&
         a.rope_theta == b.rope_theta && a.max_positions == b.max_positions && a.rms_eps == b.rms_eps &&
         a.tie_embeddings == b.tie_embeddings && a.attention_bias == b.attention_bias &&
         a.qkv_bias == b.qkv_bias && a.mlp_bias == b.mlp_bias && a.bos_token_id == b.bos_token_id &&
         a.eos_token_id == b.eos_token_id && a.pad_token_id == b.pad_token_id && r.type == s.type &&
         r.factor == s.factor && r.low_freq_factor == s.low_freq_factor &&
         r.high_freq_factor == s.high_freq_factor && r.original_max_positions == s.original_max_positions &&
         r.beta_fast == s.beta_fast && r.beta_slow == s.beta_slow &&
         same_opt(r.attention_factor, s.attention_factor) && same_opt(r.mscale, s.mscale) &&
         same_opt(r.mscale_all_dim, s.mscale_all_dim) && r.truncate == s.truncate;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  ModelArgs a;
  try {
    a = parse_hf_config(text, "config.json");
  } catch (const model_config_error& e) {
    check(std::string_view(e.what()).rfind("config.json: ", 0) == 0, "the error names the file", e.what());
    return 0;
  }
  check(a.vocab_size > 0 && a.hidden > 0 && a.layers > 0 && a.heads > 0 && a.kv_heads > 0 && a.head_dim > 0 &&
            a.intermediate > 0 && a.max_positions > 0,
        "an accepted config.json has positive sizes", text);
  check(a.head_dim % 2 == 0 && a.heads % a.kv_heads == 0, "head_dim even, heads a multiple of kv_heads",
        text);
  check(std::isfinite(a.rms_eps) && a.rms_eps > 0 && std::isfinite(a.rope_theta) && a.rope_theta > 0,
        "rms_eps and rope_theta finite and positive", text);

  const std::string written = hf_config_json(a, "bfloat16");
  ModelArgs b;
  try {
    b = parse_hf_config(written, "written.json");
  } catch (const model_config_error& e) {
    check(false, "what hf_config_json writes reads back",
          text + "\n--- written:\n" + written + "\n--- " + e.what());
  }
  check(same(a, b), "hf_config_json reads back as the same model", text + "\n--- written:\n" + written);
  check(hf_config_json(b, "bfloat16") == written, "hf_config_json is a fixpoint", written);

  // What the trainer and the planner compute from it next.
  const auto params = a.params();
  std::int64_t total = 0;
  for (const auto& p : params) {
    check(p.rows > 0 && p.cols > 0, "every parameter has a positive shape", text);
    total += p.numel();
  }
  check(total == a.total_params(), "total_params is the sum of params()", text);
  check(a.matmul_params() > 0 && a.matmul_params() <= total, "matmul_params within total_params", text);
  const auto inv = a.rope_inv_freq();
  check(inv.size() == static_cast<std::size_t>(a.head_dim / 2), "head_dim / 2 RoPE frequencies", text);
  for (double f : inv) check(std::isfinite(f) && f >= 0, "RoPE frequencies finite, not negative", text);
  const double scale = a.rope_attention_scaling();
  check(std::isfinite(scale) && scale > 0, "RoPE attention scaling finite and positive", text);
  return 0;
}
