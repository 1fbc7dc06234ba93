// The presets by model.name (model/config.hpp): the one table in the tree.
#include "model/config.hpp"

#include <fmt/format.h>

#include <cmath>

namespace primecfg::train {

namespace fs = std::filesystem;
using i64 = std::int64_t;

namespace {

ModelArgs llama(i64 vocab, i64 hidden, i64 layers, i64 heads, i64 kv, i64 head_dim, i64 inter, double theta,
                double eps, bool tied) {
  ModelArgs a;
  a.arch = Arch::llama;
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

struct preset_row {
  std::string_view name;
  ModelArgs args;
};

const std::vector<preset_row>& presets() {
  static const std::vector<preset_row> rows = [] {
    ModelArgs tiny;  // small enough to learn reverse-text in about a minute on two CPU cores
    ModelArgs qwen3;
    qwen3.arch = Arch::qwen3;
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
    return std::vector<preset_row>{
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
  }();
  return rows;
}

}  // namespace

std::optional<ModelArgs> preset(std::string_view name) {
  if (name == "tiny") name = "primecfg/tiny";
  for (const auto& r : presets())
    if (r.name == name) return r.args;
  return std::nullopt;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> out;
  for (const auto& r : presets()) out.emplace_back(r.name);
  return out;
}

}  // namespace primecfg::train
