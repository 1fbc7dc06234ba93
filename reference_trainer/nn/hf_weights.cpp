// HfWeights and Transformer::load_hf_weights: an HF checkpoint's safetensors files
// into the model, every tensor accounted for.
#include "nn/hf_weights.hpp"

#include "base/strict_json.hpp"
#include "model/architecture.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace primecfg::train {

using torch::Tensor;

namespace {

torch::ScalarType to_torch(safetensors::dtype d) {
  switch (d) {
    case safetensors::dtype::F64:
      return torch::kFloat64;
    case safetensors::dtype::F32:
      return torch::kFloat32;
    case safetensors::dtype::F16:
      return torch::kFloat16;
    case safetensors::dtype::BF16:
      return torch::kBFloat16;
    case safetensors::dtype::I64:
      return torch::kInt64;
    case safetensors::dtype::I32:
      return torch::kInt32;
    case safetensors::dtype::I16:
      return torch::kInt16;
    case safetensors::dtype::I8:
      return torch::kInt8;
    case safetensors::dtype::U8:
      return torch::kUInt8;
    case safetensors::dtype::BOOL:
      return torch::kBool;
  }
  return torch::kFloat32;
}

}  // namespace

WeightFileSet open_weight_files(const std::filesystem::path& dir) {
  // The weights are what transformers loads: the shards that
  // model.safetensors.index.json names, else model.safetensors. Other safetensors
  // files in the folder (a checkpoint's optimizer state) are not weights.
  std::vector<std::filesystem::path> paths;
  std::map<std::string, std::string, std::less<>> index;  // tensor -> shard, when sharded
  const auto index_path = dir / "model.safetensors.index.json";
  std::error_code ec;
  // transformers would read model.safetensors and vLLM the index's files: not a
  // choice to make for the user.
  if (std::filesystem::exists(index_path, ec) && std::filesystem::exists(dir / "model.safetensors", ec))
    throw std::runtime_error(
        fmt::format("{}: holds both model.safetensors and model.safetensors.index.json; transformers would "
                    "load the former "
                    "and vLLM the files the latter names: remove the one that is not the model",
                    dir.string()));
  if (std::filesystem::exists(index_path, ec)) {
    std::ifstream in(index_path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    try {
      const strict_json::value root = strict_json::parse(text.str());
      const strict_json::value* map = strict_json::find(root, "weight_map");
      if (!map || !map->is_object())
        throw std::runtime_error(index_path.string() +
                                 ": \"weight_map\" must be an object of tensor -> file");
      std::set<std::string> shards;
      for (const auto& [tensor, file] : map->items()) {
        if (!file.is_string())
          throw std::runtime_error(fmt::format("{}: weight_map[\"{}\"] = {} is not a file name",
                                               index_path.string(), tensor, strict_json::dump(file)));
        const std::string& f = file.get_ref<const std::string&>();
        if (f.find('/') != std::string::npos || f == ".." || f == ".")
          throw std::runtime_error(fmt::format("{}: weight_map[\"{}\"] = \"{}\" is not a file in this folder",
                                               index_path.string(), tensor, f));
        index.emplace(tensor, f);
        shards.insert(f);
      }
      for (const auto& f : shards) paths.push_back(dir / f);
    } catch (const strict_json::error& e) {
      throw std::runtime_error(index_path.string() + ": " + e.what());
    }
  } else if (std::filesystem::exists(dir / "model.safetensors", ec)) {
    paths.push_back(dir / "model.safetensors");
  } else {
    throw std::runtime_error(dir.string() +
                             ": neither model.safetensors nor model.safetensors.index.json (only safetensors "
                             "weights are read)");
  }
  WeightFileSet set;
  for (const auto& p : paths) set.files.push_back(safetensors::file::open(p));
  // Where each tensor lies: in the file the index names for it, and only once.
  for (const auto& f : set.files)
    for (const auto& t : f.tensors()) {
      if (!index.empty()) {
        auto listed = index.find(t.name);
        if (listed == index.end() || f.path().filename() != listed->second)
          throw std::runtime_error(fmt::format("{}: tensor {} is not listed for this file in {}",
                                               f.path().string(), t.name, index_path.string()));
      }
      auto [it, fresh] = set.tensors.emplace(t.name, WeightFileSet::Found{&f, &t});
      if (!fresh)
        throw std::runtime_error(fmt::format("{}: tensor {} is also in {}; which one to load is ambiguous",
                                             f.path().string(), t.name, it->second.file->path().string()));
    }
  return set;
}

HfWeights::HfWeights(const std::filesystem::path& dir, const ModelArgs& args)
    : dir_(dir), args_(args), weights_(open_weight_files(dir)) {}

torch::Tensor HfWeights::as_tensor(const Found& t) const {
  const auto type = t.info->type;
  if (type != safetensors::dtype::F32 && type != safetensors::dtype::BF16 &&
      type != safetensors::dtype::F16 && type != safetensors::dtype::F64)
    throw std::runtime_error(fmt::format("{}: tensor {} has dtype {}; weights must be F32, BF16, F16 or F64",
                                         t.file->path().string(), t.info->name,
                                         safetensors::dtype_name(type)));
  return torch::from_blob(const_cast<std::byte*>(t.info->data), t.info->shape,
                          torch::TensorOptions().dtype(to_torch(type)));
}

void HfWeights::load(NamedParam& p) {
  torch::NoGradGuard no_grad;
  auto it = weights_.tensors.find(p.name);
  if (it == weights_.tensors.end() && load_fused(p)) return;
  if (it == weights_.tensors.end())
    throw std::runtime_error(
        fmt::format("{}: tensor {} not found in the *.safetensors files (config.json "
                    "describes a model that has it)",
                    dir_.string(), p.name));
  std::vector<std::int64_t> want(p.tensor.sizes().begin(), p.tensor.sizes().end());
  if (it->second.info->shape != want)
    throw std::runtime_error(fmt::format("{}: tensor {} has shape [{}], config.json implies [{}]",
                                         it->second.file->path().string(), p.name,
                                         fmt::join(it->second.info->shape, ", "), fmt::join(want, ", ")));
  p.tensor.detach().copy_(as_tensor(it->second));
  weights_.tensors.erase(it);
  // A tied model may still carry lm_head.weight; transformers then uses the
  // embedding, so the copy must be the same numbers or the two would disagree.
  if (p.name != kEmbeddingParam || !args_.tie_embeddings) return;
  if (auto head = weights_.tensors.find(std::string(kLmHeadParam)); head != weights_.tensors.end()) {
    Tensor embed = p.tensor.detach();
    std::vector<std::int64_t> want(embed.sizes().begin(), embed.sizes().end());
    if (head->second.info->shape != want || !torch::equal(as_tensor(head->second).to(embed.options()), embed))
      throw std::runtime_error(fmt::format(
          "{}: tensor lm_head.weight differs from model.embed_tokens.weight, but config.json ties them "
          "(tie_word_embeddings = true): transformers would ignore it",
          head->second.file->path().string()));
    weights_.tensors.erase(head);
  }
}

bool HfWeights::load_fused(NamedParam& p) {
  const std::optional<HfSlice> src = args_.architecture().hf_fused_source(args_, p.name);
  if (!src) return false;
  auto it = weights_.tensors.find(src->tensor);
  if (it == weights_.tensors.end()) return false;
  const auto& shape = it->second.info->shape;
  if (shape != src->tensor_shape)
    throw std::runtime_error(
        fmt::format("{}: tensor {} has shape [{}], config.json implies [{}] (it holds {})",
                    it->second.file->path().string(), src->tensor, fmt::join(shape, ", "),
                    fmt::join(src->tensor_shape, ", "), p.name));
  p.tensor.detach().copy_(as_tensor(it->second)[src->index].narrow(0, src->row_begin, src->rows));
  // Every slice must be some parameter's: [index][rows] blocks of equal height.
  auto& use = fused_used_[src->tensor];
  use.first += 1;
  use.second = shape[0] * (shape[1] / src->rows);
  return true;
}

void HfWeights::finish() {
  // A fused tensor is all parameters only when each of its slices was one: a folder that
  // holds some experts both per expert and fused would leave slices unread.
  for (const auto& [name, use] : fused_used_) {
    if (use.first != use.second) {
      const auto& t = weights_.tensors.at(name);
      throw std::runtime_error(fmt::format(
          "{}: tensor {}: {} of its {} slices are parameters, the others are held by name too; which to load "
          "is ambiguous",
          t.file->path().string(), name, use.first, use.second));
    }
    weights_.tensors.erase(name);
  }
  if (!weights_.tensors.empty()) {
    std::vector<std::string> names;
    for (const auto& [name, t] : weights_.tensors) names.push_back(name);
    const auto& first = weights_.tensors.begin()->second;
    throw std::runtime_error(fmt::format(
        "{}: tensor {} is not a parameter of the model that config.json describes, and primecfg-train "
        "does not ignore weights (not used: {})",
        first.file->path().string(), names.front(), fmt::join(names, ", ")));
  }
}

void Transformer::load_hf_weights(const std::filesystem::path& dir) {
  HfWeights weights(dir, args_);
  for (auto& p : params_) weights.load(p);
  weights.finish();
}

}  // namespace primecfg::train
