// The weights of an HF directory, read one parameter at a time: what transformers
// loads (the shards model.safetensors.index.json names, else model.safetensors), every
// tensor accounted for. One parameter at a time, so that a sharded run keeps its piece
// of each and never holds the whole model.
//
// Internal to primecfg-train.
#pragma once

#include "base/safetensors.hpp"
#include "nn/transformer.hpp"

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace primecfg::train {

// The safetensors files holding a folder's weights, opened, and where each tensor lies:
// the files that model.safetensors.index.json names (each tensor in the file the index
// names for it), else model.safetensors. Errors (no weights, a bad index, a tensor
// twice) name the file and the tensor. Movable, not copyable: `tensors` points into
// `files`.
struct WeightFileSet {
  struct Found {
    const safetensors::file* file;
    const safetensors::tensor_info* info;
  };
  std::vector<safetensors::file> files;
  std::map<std::string, Found, std::less<>> tensors;

  WeightFileSet() = default;
  WeightFileSet(WeightFileSet&&) = default;
  WeightFileSet& operator=(WeightFileSet&&) = default;
  WeightFileSet(const WeightFileSet&) = delete;
  WeightFileSet& operator=(const WeightFileSet&) = delete;
};
WeightFileSet open_weight_files(const std::filesystem::path& dir);

class HfWeights {
 public:
  // Opens and indexes the files; errors (no weights, a bad index, a tensor twice)
  // name the file and the tensor.
  HfWeights(const std::filesystem::path& dir, const ModelArgs& args);
  HfWeights(const HfWeights&) = delete;
  HfWeights& operator=(const HfWeights&) = delete;

  // Copies p's tensor from the files into p (found once, the right shape, a
  // floating-point dtype). For a tied embedding, an lm_head.weight in the files must
  // equal it (transformers would ignore it).
  void load(NamedParam& p);
  // After every parameter: each tensor of the files was one.
  void finish();

 private:
  using Found = WeightFileSet::Found;
  torch::Tensor as_tensor(const Found& t) const;
  // p from a fused tensor of the files (model/architecture.hpp's hf_fused_source); false
  // when the architecture has no fused source for it or the files lack that tensor.
  bool load_fused(NamedParam& p);

  std::filesystem::path dir_;
  ModelArgs args_;
  WeightFileSet weights_;  // its tensors: those not loaded yet
  // Fused tensors some parameters were sliced from: slices taken, slices it holds.
  std::map<std::string, std::pair<std::int64_t, std::int64_t>> fused_used_;
};

}  // namespace primecfg::train
