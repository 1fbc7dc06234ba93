// How a checkpoint's weights are split into files: as transformers' save_pretrained and
// prime-rl's weight checkpoints do (huggingface_hub's split_torch_state_dict_into_shards),
// so that a step folder is an HF model directory of the usual shape at any size:
//
//   up to max_bytes in all:  model.safetensors
//   more:                    model-00001-of-0000N.safetensors ... and
//                            model.safetensors.index.json ({"metadata": {"total_size"},
//                            "weight_map": tensor -> file})
//
// Files of at most 5 GB also keep a 70B model (141 GB) under the Hugging Face Hub's
// limit of 50 GB per file. The rule, taken over from huggingface_hub: tensors in the
// state dict's order fill a file until the next would take it past max_bytes; a tensor
// larger than max_bytes gets a file of its own, placed before the file being filled.
//
// No LibTorch: used by checkpoint/tensors.hpp, tested in test_io.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace primecfg::train {

// huggingface_hub's MAX_SHARD_SIZE ("5GB", decimal), the default of save_pretrained
// and of prime-rl's save_state_dict.
inline constexpr std::uint64_t hf_max_shard_bytes = 5'000'000'000;

struct WeightFiles {
  struct File {
    std::string name;
    std::vector<std::size_t> tensors;  // indices into the list given to split_weight_files
  };
  std::vector<File> files;
  std::uint64_t total_bytes = 0;

  // Several files: the folder needs model.safetensors.index.json.
  bool indexed() const { return files.size() > 1; }
};

// The split of tensors (each a name and its size in bytes, in state-dict order) into
// files of at most max_bytes (a larger tensor alone in its file). max_bytes >= 1.
WeightFiles split_weight_files(const std::vector<std::uint64_t>& bytes, std::uint64_t max_bytes);

// model.safetensors.index.json's text for such a split (names[i]: tensor i's name).
std::string weight_index_json(const WeightFiles& split, const std::vector<std::string>& names);

// The order of transformers' state dict for primecfg-train's parameter names: within a
// block, self_attn.* before mlp.* before the two layer norms (ModelArgs::params lists
// each norm before the projections it feeds). A permutation of 0..names.size()-1.
std::vector<std::size_t> hf_state_dict_order(const std::vector<std::string>& names);

}  // namespace primecfg::train
