// What an architecture is, without LibTorch: the interface that each architecture's
// folder implements (models/<name>/spec.cpp) and that the config reader, the parameter
// list, MFU, the planner and --calibrate consume. Its block, the half with LibTorch, is
// nn/block.hpp's Block, made by make_block.
//
// The architectures are listed in models/registry.cpp, one line each; tests add their
// own with add_architecture.
#pragma once

#include "base/strict_json.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace primecfg::train {

class ConfigReader;  // model/config_reader.hpp
struct ModelArgs;    // model/config.hpp
struct ParamShape;

// The kernels a block runs with, which decide what its forward saves.
struct BlockKernels {
  std::int64_t dtype_bytes = 2;           // of the activations
  bool fused_norm = false;                // kernels.fused_rms_norm (saves its input, not FP32 copies)
  bool fused_swiglu = false;              // kernels.fused_swiglu (does not save silu(gate))
  bool recompute_routed_experts = false;  // ac.mode = "selective" with "routed_experts": experts recomputed
  // Expert parallelism (model.ep): a rank runs experts / ep of each block's routed experts,
  // on the rows the ranks send it (as many as its own tokens' slots, when routing is balanced).
  std::int64_t expert_parallel = 1;
};

// What an RMSNorm over `width` elements keeps per row for the backward, besides its FP32
// rstd: the fused kernel (CUDA) keeps its input; LibTorch's composite (CPU) keeps an FP32
// copy of the input and the FP32 normalised values.
inline std::int64_t rms_norm_saved(std::int64_t width, std::int64_t dtype_bytes, bool fused) {
  return fused ? width * dtype_bytes : 8 * width;
}

// One moment of a block's backward that may be its peak: what it holds then beyond what
// its forward saved. A backward frees as it goes (each op's saved inputs once its
// gradient is made), so the moments differ in what they hold, not only in how much.
struct BackwardStage {
  std::int64_t per_token = 0;    // per token; negative where it has freed more than it holds
  std::int64_t in_use = 0;       // of the block's in-use bytes (below), whatever its tokens
  std::int64_t in_use_grad = 0;  // of their gradient, as much of it as is made by then
  // Only where the block's forward runs again in its backward (activation checkpointing):
  // a moment of that recompute.
  bool recomputed = false;
};

// The device bytes of one block's activations, per token of a micro-batch.
struct BlockMemory {
  std::int64_t saved = 0;  // what the forward keeps for the backward
  // The moments of its backward (and of a recompute in it) that may be its peak.
  std::vector<BackwardStage> backward;
  // Bytes a block holds while it runs, whatever its tokens, and not between its forward and
  // its backward (Qwen3-MoE: its experts' weights stacked for the grouped GEMM).
  std::int64_t in_use_per_block = 0;
};

// Where a parameter lies in a checkpoint that fuses several of them into one tensor
// (transformers 5's experts.gate_up_proj [E, 2I, D]): rows [row_begin, row_begin + rows)
// of slice `index` along the first dimension of `tensor`, whose shape must be
// `tensor_shape` (so that every slice of it is some parameter's).
struct HfSlice {
  std::string tensor;
  std::vector<std::int64_t> tensor_shape;
  std::int64_t index = 0;
  std::int64_t row_begin = 0, rows = 0;
};

class Architecture {
 public:
  virtual ~Architecture() = default;

  // Its folder's name (models/<name>/): in messages and in the profile's block timings.
  virtual std::string_view name() const = 0;
  // The config.json model_type values it reads.
  virtual std::vector<std::string_view> model_types() const = 0;

  // config.json: every key but model_type, vocab_size, hidden_size, num_hidden_layers,
  // num_attention_heads and the token ids (read before) is read here, used or refused
  // by name; a key read by no one is an error afterwards.
  virtual void read_config(ConfigReader& r, ModelArgs& a) const = 0;
  // The config.json that transformers reads back as `a`, but for the token ids and
  // torch_dtype (added after).
  virtual strict_json::ordered write_config(const ModelArgs& a) const = 0;
  // Its config.json keys that change what it computes beyond the decoder's shared ones
  // (model/config.hpp's computation_differences), with their values as text.
  virtual std::vector<std::pair<std::string, std::string>> computation_keys(const ModelArgs& a) const = 0;
  // The presets it ships, by model.name.
  virtual std::vector<std::pair<std::string, ModelArgs>> presets() const = 0;

  // Block `layer`'s parameters, in the trainer's order, with their HF names.
  virtual void block_params(const ModelArgs& a, int layer, std::vector<ParamShape>& out) const = 0;
  // How many parameters block `layer` has (the config reader's bound on the model's
  // size, before any list is built): by default, block_params' sum; an architecture whose
  // blocks hold very many tensors (routed experts) counts them directly.
  virtual double block_param_count(const ModelArgs& a, int layer) const;
  // The parameters of block `layer` one token is multiplied by in the forward (MFU's
  // and the step model's FLOPs): every matrix of the block unless an architecture
  // routes tokens past some of them.
  virtual std::int64_t block_active_matmul_params(const ModelArgs& a, int layer) const;

  // Where parameter `name` lies in the fused layout of a checkpoint that does not hold it
  // by name; nullopt when the architecture has no such layout (the default).
  virtual std::optional<HfSlice> hf_fused_source(const ModelArgs& a, std::string_view name) const;

  // Whether parameter `name` is a router's, which model.freeze_moe_router keeps as loaded
  // (prime-rl freezes each MoE layer's router); none by default.
  virtual bool is_router(std::string_view name) const;

  // The qualified name that prime-rl's own model class gives the linear layer whose
  // weight has HF name `weight`: what model.quantization.ignore_patterns are matched
  // against. By default the weight's name without ".weight" (prime-rl's dense models
  // name their linears as transformers does).
  virtual std::string linear_module(std::string_view weight) const;

  // The planner's terms for one block (nn/block.hpp's Block::forward under autograd).
  virtual BlockMemory block_memory(const ModelArgs& a, const BlockKernels& k) const = 0;
};

// The architecture that reads config.json's `model_type`; nullptr when none does.
const Architecture* find_architecture(std::string_view model_type);
// The same by folder name (the profile's block timings name it).
const Architecture* find_architecture_named(std::string_view name);
// Every architecture: the product's (models/registry.cpp), then those added.
std::vector<const Architecture*> architectures();
// Adds an architecture from outside the product (a test's); `a` must outlive its use.
// Throws std::logic_error when its name or a model_type is taken.
void add_architecture(const Architecture& a);

}  // namespace primecfg::train
