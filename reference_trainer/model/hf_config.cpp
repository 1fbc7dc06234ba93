// config.json, read strictly and written for checkpoints (model/config.hpp).
#include "model/config.hpp"

#include "model/architecture.hpp"
#include "model/config_reader.hpp"

#include "base/strict_json.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

namespace primecfg::train {

namespace fs = std::filesystem;
using i64 = std::int64_t;

namespace {

namespace json = strict_json;

// A JSON value as text, for messages and for the token ids written back.
std::string to_text(const json::value& v) { return json::dump(v); }

// Keys of config.json that say nothing about what the model computes.
const std::set<std::string, std::less<>>& metadata_keys() {
  static const std::set<std::string, std::less<>> keys = {
      "_name_or_path",        "architectures",        "torch_dtype", "dtype",
      "transformers_version", "initializer_range",    "use_cache",   "tokenizer_class",
      "output_attentions",    "output_hidden_states", "return_dict", "bos_token_id",
      "eos_token_id",         "pad_token_id",
  };
  return keys;
}

}  // namespace

void ConfigReader::fail(std::string_view key, const std::string& what) const {
  throw model_config_error(fmt::format("{}: \"{}\": {}", path_, key, what));
}
void ConfigReader::fail_value(std::string_view key, const json::value& v, const std::string& what) const {
  fail(key, fmt::format("{} (found {})", what, to_text(v)));
}

const json::value* ConfigReader::get(std::string_view key) {
  seen_.emplace(key);
  const json::value* v = json::find(root_, key);
  return v && !v->is_null() ? v : nullptr;
}

i64 ConfigReader::size(std::string_view key, std::optional<i64> fallback) {
  const json::value* v = get(key);
  if (!v) {
    if (fallback) return *fallback;
    fail(key, "missing (a positive integer is required)");
  }
  const std::optional<i64> n = json::integer(*v);
  if (!n) fail_value(key, *v, "must be a positive integer");
  if (*n <= 0 || *n > (i64{1} << 31)) fail_value(key, *v, "must be a positive integer below 2^31");
  return *n;
}

double ConfigReader::positive(std::string_view key, double fallback) {
  const json::value* v = get(key);
  if (!v) return fallback;
  if (!v->is_number() || !(v->get<double>() > 0) || !std::isfinite(v->get<double>()))
    fail_value(key, *v, "must be a positive number");
  return v->get<double>();
}

bool ConfigReader::boolean(std::string_view key, bool fallback) {
  const json::value* v = get(key);
  if (!v) return fallback;
  if (!v->is_boolean()) fail_value(key, *v, "must be true or false");
  return v->get<bool>();
}

std::string ConfigReader::string(std::string_view key, std::string fallback) {
  const json::value* v = get(key);
  if (!v) return fallback;
  if (!v->is_string()) fail_value(key, *v, "must be a string");
  return v->get<std::string>();
}

std::string ConfigReader::raw(std::string_view key) {
  const json::value* v = get(key);
  return v ? to_text(*v) : "null";
}

void ConfigReader::reject_unread() const {
  for (const auto& [key, v] : root_.items())
    if (!seen_.count(key) && !metadata_keys().count(key))
      fail_value(key, v,
                 "primecfg-train does not know this key, so it cannot promise to compute what transformers "
                 "computes with it");
}

void read_rope(ConfigReader& r, ModelArgs& a) {
  const json::value* scaling = r.get("rope_scaling");
  const json::value* params = r.get("rope_parameters");
  if (scaling && params)
    r.fail("rope_parameters",
           "both rope_scaling (transformers 4.x) and rope_parameters (5.x) are set; keep one of them");
  const char* dict_key = params ? "rope_parameters" : "rope_scaling";
  const json::value* dict = params ? params : scaling;
  std::optional<double> top_theta;
  if (r.get("rope_theta")) top_theta = r.positive("rope_theta", 0);
  if (const json::value* p = r.get("partial_rotary_factor");
      p && !(p->is_number() && p->get<double>() == 1.0))
    r.fail_value("partial_rotary_factor", *p, "only 1.0 (RoPE over the whole head) is implemented");
  a.rope_theta = top_theta.value_or(10000.0);
  if (!dict) return;
  if (!dict->is_object()) r.fail_value(dict_key, *dict, "must be an object or null");
  const json::value& d = *dict;
  auto key = [&](std::string_view k) { return fmt::format("{}.{}", dict_key, k); };
  auto find = [&](std::string_view k) -> const json::value* {
    const json::value* v = json::find(d, k);
    return v && !v->is_null() ? v : nullptr;
  };
  auto number = [&](std::string_view k, std::optional<double> fallback) -> double {
    const json::value* v = find(k);
    if (!v) {
      if (fallback) return *fallback;
      r.fail(key(k), "missing: this rope type needs it");
    }
    if (!v->is_number() || !std::isfinite(v->get<double>()) || !(v->get<double>() > 0))
      r.fail_value(key(k), *v, "must be a positive number");
    return v->get<double>();
  };
  std::string type = "default";
  const json::value* rope_type = find("rope_type");
  const json::value* legacy_type = find("type");
  if (rope_type && legacy_type && to_text(*rope_type) != to_text(*legacy_type))
    r.fail(key("type"),
           fmt::format("{} disagrees with rope_type = {}", to_text(*legacy_type), to_text(*rope_type)));
  if (const json::value* t = rope_type ? rope_type : legacy_type) {
    if (!t->is_string()) r.fail_value(key("rope_type"), *t, "must be a string");
    type = t->get<std::string>();
  }
  if (const json::value* t = find("rope_theta")) {
    const double theta = number("rope_theta", std::nullopt);
    if (top_theta && *top_theta != theta)
      r.fail(key("rope_theta"), fmt::format("{} disagrees with rope_theta = {}", to_text(*t), *top_theta));
    a.rope_theta = theta;
  }
  if (const json::value* p = find("partial_rotary_factor"); p && !(p->is_number() && p->get<double>() == 1.0))
    r.fail_value(key("partial_rotary_factor"), *p, "only 1.0 (RoPE over the whole head) is implemented");

  std::set<std::string, std::less<>> allowed = {"rope_type", "type", "rope_theta", "partial_rotary_factor"};
  auto& s = a.rope_scaling;
  auto original = [&] {
    const json::value* v = find("original_max_position_embeddings");
    if (!v) return a.max_positions;  // transformers falls back to max_position_embeddings
    const std::optional<i64> n = json::integer(*v);
    if (!n || *n <= 0)
      r.fail_value(key("original_max_position_embeddings"), *v, "must be a positive integer");
    return *n;
  };
  if (type == "default") {
    s.type = RopeScaling::Type::none;
  } else if (type == "linear") {
    s.type = RopeScaling::Type::linear;
    s.factor = number("factor", std::nullopt);
    allowed.insert("factor");
  } else if (type == "llama3") {
    s.type = RopeScaling::Type::llama3;
    s.factor = number("factor", std::nullopt);
    s.low_freq_factor = number("low_freq_factor", std::nullopt);
    s.high_freq_factor = number("high_freq_factor", std::nullopt);
    s.original_max_positions = original();
    if (s.high_freq_factor <= s.low_freq_factor)
      r.fail(key("high_freq_factor"), fmt::format("must be greater than low_freq_factor ({} <= {})",
                                                  s.high_freq_factor, s.low_freq_factor));
    allowed.insert({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  } else if (type == "yarn") {
    s.type = RopeScaling::Type::yarn;
    s.original_max_positions = original();
    s.factor = find("factor")
                   ? number("factor", std::nullopt)
                   : static_cast<double>(a.max_positions) / static_cast<double>(s.original_max_positions);
    if (find("attention_factor")) s.attention_factor = number("attention_factor", std::nullopt);
    if (find("mscale")) s.mscale = number("mscale", std::nullopt);
    if (find("mscale_all_dim")) s.mscale_all_dim = number("mscale_all_dim", std::nullopt);
    s.beta_fast = number("beta_fast", 32.0);
    s.beta_slow = number("beta_slow", 1.0);
    if (const json::value* t = find("truncate")) {
      if (!t->is_boolean()) r.fail_value(key("truncate"), *t, "must be true or false");
      s.truncate = t->get<bool>();
    }
    allowed.insert({"factor", "original_max_position_embeddings", "attention_factor", "mscale",
                    "mscale_all_dim", "beta_fast", "beta_slow", "truncate"});
  } else {
    r.fail(key("rope_type"),
           fmt::format("\"{}\" is not implemented (default, linear, llama3, yarn are)", type));
  }
  for (const auto& [k, v] : d.items())
    if (!allowed.count(k))
      r.fail_value(key(k), v,
                   fmt::format("is not a setting of rope type \"{}\" that primecfg-train implements", type));
}

// Published models have at most a few hundred.
constexpr i64 max_layers = i64{1} << 16;

ModelArgs parse_hf_config(std::string_view text, const std::string& path) {
  json::value root;
  try {
    root = json::parse(text);
  } catch (const json::error& e) {
    throw model_config_error(fmt::format("{}: {}", path, e.what()));
  }
  if (!root.is_object()) throw model_config_error(path + ": must hold a JSON object");
  ConfigReader r(root, path);
  ModelArgs a;

  a.model_type = r.string("model_type", "");
  const Architecture* arch = find_architecture(a.model_type);
  if (!arch) {
    std::vector<std::string_view> known;
    for (const Architecture* x : architectures())
      for (std::string_view t : x->model_types()) known.push_back(t);
    r.fail("model_type", a.model_type.empty() ? fmt::format("missing ({})", fmt::join(known, ", "))
                                              : fmt::format("\"{}\" is not supported ({} are)", a.model_type,
                                                            fmt::join(known, ", ")));
  }
  a.vocab_size = r.size("vocab_size");
  a.hidden = r.size("hidden_size");
  a.layers = r.size("num_hidden_layers");
  a.heads = r.size("num_attention_heads");
  arch->read_config(r, a);
  a.bos_token_id = r.raw("bos_token_id");
  a.eos_token_id = r.raw("eos_token_id");
  a.pad_token_id = r.raw("pad_token_id");
  r.reject_unread();

  if (a.heads % a.kv_heads != 0)
    r.fail("num_key_value_heads",
           fmt::format("num_attention_heads = {} is not a multiple of num_key_value_heads = {}", a.heads,
                       a.kv_heads));
  if (a.head_dim % 2 != 0)
    r.fail("head_dim", fmt::format("{} is odd; RoPE rotates pairs of channels", a.head_dim));
  // Without head_dim, hidden_size / num_attention_heads: 0 when there are more heads than channels.
  if (a.head_dim <= 0)
    r.fail("head_dim",
           fmt::format("missing, and hidden_size / num_attention_heads = {} / {} is 0", a.hidden, a.heads));
  // The parameter bound below lets 2^31 layers of width 1 through: a list of
  // billions of tensors (and an int overflow in params()).
  if (a.layers > max_layers)
    r.fail("num_hidden_layers", fmt::format("{} layers; more than {} is refused", a.layers, max_layers));
  double blocks = 0;
  for (int l = 0; l < a.layers; ++l) blocks += arch->block_param_count(a, l);
  if (static_cast<double>(a.vocab_size) * static_cast<double>(a.hidden) * 2 + blocks > std::ldexp(1.0, 46))
    r.fail("num_hidden_layers", "the model would have more than 2^46 parameters");
  if (a.rope_scaling.type == RopeScaling::Type::yarn && a.rope_scaling.original_max_positions <= 0)
    r.fail("rope_scaling", "yarn needs original_max_position_embeddings");
  // The highest RoPE frequency, 1 / rope_theta^((head_dim - 2) / head_dim), must be a
  // number: a positive rope_theta below about 1e-308 makes it infinite.
  if (a.head_dim > 0 &&
      !std::isfinite(1.0 / std::pow(a.rope_theta, static_cast<double>(a.head_dim - 2) / a.head_dim)))
    r.fail("rope_theta", fmt::format("{} makes the RoPE frequencies infinite", a.rope_theta));
  return a;
}

ModelArgs read_hf_config(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    throw model_config_error(path.string() + ": not a regular file (a model directory needs config.json)");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw model_config_error(path.string() + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_hf_config(ss.str(), path.string());
}

json::ordered rope_scaling_json(const ModelArgs& a) {
  // Doubles stay doubles ("10000.0", not "10000": transformers' config classes
  // type-check some fields); nlohmann writes the shortest text that reads back as
  // the same double.
  json::ordered rope = nullptr;
  const auto& s = a.rope_scaling;
  switch (s.type) {
    case RopeScaling::Type::none:
      break;
    case RopeScaling::Type::linear:
      rope = {{"rope_type", "linear"}, {"factor", s.factor}};
      break;
    case RopeScaling::Type::llama3:
      rope = {{"rope_type", "llama3"},
              {"factor", s.factor},
              {"low_freq_factor", s.low_freq_factor},
              {"high_freq_factor", s.high_freq_factor},
              {"original_max_position_embeddings", s.original_max_positions}};
      break;
    case RopeScaling::Type::yarn:
      rope = {{"rope_type", "yarn"},
              {"factor", s.factor},
              {"original_max_position_embeddings", s.original_max_positions},
              {"beta_fast", s.beta_fast},
              {"beta_slow", s.beta_slow},
              {"truncate", s.truncate}};
      if (s.attention_factor) rope["attention_factor"] = *s.attention_factor;
      if (s.mscale) rope["mscale"] = *s.mscale;
      if (s.mscale_all_dim) rope["mscale_all_dim"] = *s.mscale_all_dim;
      break;
  }
  return rope;
}

std::string hf_config_json(const ModelArgs& a, std::string_view torch_dtype) {
  json::ordered out = a.architecture().write_config(a);
  // Token ids as config.json wrote them (JSON text), read again so that only JSON is written.
  for (const auto& [key, text] :
       {std::pair{"bos_token_id", &a.bos_token_id}, std::pair{"eos_token_id", &a.eos_token_id},
        std::pair{"pad_token_id", &a.pad_token_id}})
    out[key] = json::ordered(json::parse(*text));
  out["torch_dtype"] = torch_dtype;
  return json::dump(out, 2) + "\n";
}

std::vector<std::string> computation_differences(const ModelArgs& a, std::string_view a_name,
                                                 const ModelArgs& b, std::string_view b_name) {
  std::vector<std::string> out;
  auto differ = [&](std::string_view key, const auto& x, const auto& y) {
    if (x != y) out.push_back(fmt::format("{}: {} in {}, {} in {}", key, x, a_name, y, b_name));
  };
  differ("model_type", a.model_type, b.model_type);
  differ("vocab_size", a.vocab_size, b.vocab_size);
  differ("hidden_size", a.hidden, b.hidden);
  differ("num_hidden_layers", a.layers, b.layers);
  differ("num_attention_heads", a.heads, b.heads);
  differ("num_key_value_heads", a.kv_heads, b.kv_heads);
  differ("head_dim", a.head_dim, b.head_dim);
  differ("rope_theta", a.rope_theta, b.rope_theta);
  differ("rms_norm_eps", a.rms_eps, b.rms_eps);
  differ("tie_word_embeddings", a.tie_embeddings, b.tie_embeddings);
  // The architecture's own keys, when both are of one architecture (else model_type differs).
  if (&a.architecture() == &b.architecture()) {
    const auto ka = a.architecture().computation_keys(a), kb = b.architecture().computation_keys(b);
    for (std::size_t i = 0; i < std::min(ka.size(), kb.size()); ++i)
      differ(ka[i].first, ka[i].second, kb[i].second);
  }
  const RopeScaling &r = a.rope_scaling, &q = b.rope_scaling;
  differ("rope_scaling.rope_type", rope_type_name(r.type), rope_type_name(q.type));
  if (r.type == q.type && r.type != RopeScaling::Type::none) {
    auto opt = [](const std::optional<double>& v) {
      return v ? fmt::format("{}", *v) : std::string("unset");
    };
    differ("rope_scaling.factor", r.factor, q.factor);
    if (r.type == RopeScaling::Type::llama3) {
      differ("rope_scaling.low_freq_factor", r.low_freq_factor, q.low_freq_factor);
      differ("rope_scaling.high_freq_factor", r.high_freq_factor, q.high_freq_factor);
    }
    if (r.type == RopeScaling::Type::llama3 || r.type == RopeScaling::Type::yarn)
      differ("rope_scaling.original_max_position_embeddings", r.original_max_positions,
             q.original_max_positions);
    if (r.type == RopeScaling::Type::yarn) {
      differ("rope_scaling.beta_fast", r.beta_fast, q.beta_fast);
      differ("rope_scaling.beta_slow", r.beta_slow, q.beta_slow);
      differ("rope_scaling.attention_factor", opt(r.attention_factor), opt(q.attention_factor));
      differ("rope_scaling.mscale", opt(r.mscale), opt(q.mscale));
      differ("rope_scaling.mscale_all_dim", opt(r.mscale_all_dim), opt(q.mscale_all_dim));
      differ("rope_scaling.truncate", r.truncate, q.truncate);
    }
  }
  // Any other input of the rotary embedding (max_position_embeddings, where a scaling
  // reads it): the frequencies it yields are what the model computes with.
  if (out.empty() &&
      (a.rope_inv_freq() != b.rope_inv_freq() || a.rope_attention_scaling() != b.rope_attention_scaling()))
    differ("max_position_embeddings", a.max_positions, b.max_positions);
  return out;
}

}  // namespace primecfg::train
