#include "checkpoint/weight_files.hpp"

#include "base/strict_json.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string_view>
#include <tuple>

namespace primecfg::train {

WeightFiles split_weight_files(const std::vector<std::uint64_t>& bytes, std::uint64_t max_bytes) {
  if (max_bytes < 1) throw std::invalid_argument("split_weight_files: max_bytes must be at least 1");
  WeightFiles out;
  std::vector<std::vector<std::size_t>> files;
  std::vector<std::size_t> filling;
  std::uint64_t filled = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    out.total_bytes += bytes[i];
    if (bytes[i] > max_bytes) {
      files.push_back({i});
      continue;
    }
    if (filled + bytes[i] > max_bytes) {
      files.push_back(std::move(filling));
      filling.clear();
      filled = 0;
    }
    filling.push_back(i);
    filled += bytes[i];
  }
  if (!filling.empty()) files.push_back(std::move(filling));
  for (std::size_t f = 0; f < files.size(); ++f)
    out.files.push_back({files.size() == 1
                             ? std::string("model.safetensors")
                             : fmt::format("model-{:05}-of-{:05}.safetensors", f + 1, files.size()),
                         std::move(files[f])});
  return out;
}

std::string weight_index_json(const WeightFiles& split, const std::vector<std::string>& names) {
  strict_json::value map = strict_json::value::object();  // sorted by name, as huggingface_hub writes it
  for (const auto& file : split.files)
    for (std::size_t i : file.tensors) map[names.at(i)] = file.name;
  strict_json::value index = {{"metadata", {{"total_size", split.total_bytes}}}, {"weight_map", map}};
  return strict_json::dump(index, 2) + "\n";
}

std::vector<std::size_t> hf_state_dict_order(const std::vector<std::string>& names) {
  // (part of the model, block, part of the block): embedding, blocks, final norm, head.
  auto key = [](std::string_view n) {
    constexpr std::string_view layers = "model.layers.";
    if (n.rfind(layers, 0) == 0) {
      n.remove_prefix(layers.size());
      const auto dot = n.find('.');
      const long block = std::stol(std::string(n.substr(0, dot)));
      const std::string_view rest = n.substr(dot + 1);
      const int part = rest.rfind("self_attn.", 0) == 0         ? 0
                       : rest.rfind("mlp.", 0) == 0             ? 1
                       : rest.rfind("input_layernorm.", 0) == 0 ? 2
                                                                : 3;
      return std::tuple(1, block, part);
    }
    const int where = n.rfind("model.embed_tokens.", 0) == 0 ? 0 : n.rfind("model.", 0) == 0 ? 2 : 3;
    return std::tuple(where, 0L, 0);
  };
  std::vector<std::size_t> order(names.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return key(names[a]) < key(names[b]); });
  return order;
}

}  // namespace primecfg::train
