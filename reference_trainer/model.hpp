// The model: a Llama/Qwen3-style decoder written as plain functions over named
// tensors (HF names, so a checkpoint directory is also an HF model directory).
//
//   h = embed(ids)
//   for each block:  h += attn(rmsnorm(h))   (RoPE, grouped-query attention, optional QK-norm)
//                    h += mlp(rmsnorm(h))    (SwiGLU)
//   loss = cross_entropy(rmsnorm(h) @ lm_head^T)   computed in chunks, logits never whole
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace primecfg::train {

struct ModelArgs {
  std::int64_t vocab_size = 260;
  std::int64_t hidden = 128;
  std::int64_t layers = 2;
  std::int64_t heads = 4;
  std::int64_t kv_heads = 2;
  std::int64_t head_dim = 32;
  std::int64_t intermediate = 384;
  double rope_theta = 10000.0;
  double rms_eps = 1e-6;
  bool qk_norm = true;
  bool tie_embeddings = true;

  // Parameters inside matmuls (what the MFU formula calls N): everything but
  // norms and the input embedding (counted when tied, since it is the LM head).
  std::int64_t matmul_params() const;
  std::int64_t total_params() const;
};

// Presets by model.name: "primecfg/tiny" (the default run), "Qwen/Qwen3-0.6B",
// "meta-llama/Meta-Llama-3-8B", "meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-3B".
std::optional<ModelArgs> preset(std::string_view name);
std::vector<std::string> preset_names();

// Reads an HF config.json (llama, qwen2 without biases, qwen3).
ModelArgs args_from_hf_config(const std::filesystem::path& config_json);
void write_hf_config(const std::filesystem::path& config_json, const ModelArgs& a);

// One parameter: its HF name and the tensor the forward pass uses.
struct NamedParam {
  std::string name;
  torch::Tensor tensor;
  int block = -1;  // transformer block it belongs to; -1 for embedding / final norm / head
};

// The tensors of one transformer block (handles that share storage with params()).
struct BlockWeights {
  torch::Tensor in_norm, wq, wk, wv, wo, q_norm, k_norm, post_norm, w_gate, w_up, w_down;
};

class Transformer {
 public:
  // Random init (normal 0.02, norms 1) on device in dtype, from the given seed.
  Transformer(const ModelArgs& args, torch::Device device, torch::ScalarType dtype, std::uint64_t seed);

  const ModelArgs& args() const { return args_; }
  std::vector<NamedParam>& params() { return params_; }
  const torch::Tensor& param(std::string_view name) const;
  torch::Device device() const { return device_; }
  torch::ScalarType dtype() const { return dtype_; }

  // Copies weights from HF safetensors files (every *.safetensors in dir); every
  // parameter must be found with the right shape.
  void load_hf_weights(const std::filesystem::path& dir);

  struct Inputs {
    torch::Tensor input_ids;            // [B, T] int64
    torch::Tensor positions;            // [B, T] int64
    std::optional<torch::Tensor> mask;  // [B, 1, T, T] bool (true = attend); absent: causal
  };
  // Called in the forward pass just before weights are first used: with -1 before the
  // embedding lookup, with l before block l, with the number of layers before the
  // final norm and the LM head. FullOffload's deferred updates wait there.
  using BlockHook = std::function<void(int block)>;

  // Final hidden states [B, T, D] after the last norm.
  torch::Tensor hidden(const Inputs& in, bool checkpoint_blocks, std::int64_t ac_freq = 1,
                       const BlockHook* before_block = nullptr);
  // Receives the LM head's share of the LM head weight's gradient, rows [first_row,
  // first_row + rows.size(0)) of it at a time. With tied embeddings that share is final
  // for every embedding row the batch's input ids do not touch: the input embedding's
  // share, added at the very end of backward, is zero there. FullOffload starts the CPU
  // update of those rows from here instead of after backward.
  using HeadGradHook = std::function<void(std::int64_t first_row, const torch::Tensor& rows)>;
  // Called before the loss reads rows [first_row, end_row) of the LM head weight: once
  // for all of them with token chunks, per chunk with vocabulary chunks. FullOffload
  // waits there for the last step's CPU updates of those rows (the tied embedding's),
  // which then run beside the loss's first pass instead of before it.
  using HeadRowsHook = std::function<void(std::int64_t first_row, std::int64_t end_row)>;
  struct LossHooks {  // null: none ({} gives both; no member initializers, so {} works as a default argument
                      // here)
    const HeadGradHook* on_head_grad;  // must outlive the backward pass
    const HeadRowsHook* before_head_rows;
  };

  // How the fused LM head + cross-entropy walks the logits, never all of them at once.
  enum class LossChunks {
    // Chunks of tokens; the head gradient is whole only after the last chunk, and the
    // hook gets it in one piece when backward starts.
    tokens,
    // Chunks of vocabulary rows, in two passes (log-sum-exp first, then the gradients),
    // one extra GEMM; the hook gets each chunk's rows of the head gradient during the
    // forward pass, as soon as they are computed. The returned loss must then be
    // backpropagated with gradient 1 (loss.backward()).
    vocabulary,
  };

  // Sum of token cross-entropies times scale (targets -100 are ignored); a chunk holds
  // about chunk_tokens x vocab logits either way.
  torch::Tensor loss(const torch::Tensor& hidden, const torch::Tensor& targets, double scale,
                     std::int64_t chunk_tokens, LossHooks hooks = {}, LossChunks chunks = LossChunks::tokens);
  // Greedy continuation (no KV cache: for the small demo model).
  std::vector<std::int64_t> generate(std::vector<std::int64_t> prompt, std::int64_t max_new,
                                     std::int64_t stop);

  const torch::Tensor& lm_head() const;

 private:
  ModelArgs args_;
  torch::Device device_;
  torch::ScalarType dtype_;
  std::vector<NamedParam> params_;
  std::vector<BlockWeights> blocks_;
};

}  // namespace primecfg::train
