// The model: a Llama / Qwen2 / Qwen3 decoder written as plain functions over named
// tensors (HF names, so a checkpoint directory is also an HF model directory).
//
//   h = embed(ids)
//   for each block:  h += attn(rmsnorm(h))   (scaled RoPE, grouped-query attention, QK-norm
//                                            and projection biases where the architecture has them)
//                    h += mlp(rmsnorm(h))    (SwiGLU)
//   loss = cross_entropy(rmsnorm(h) @ lm_head^T)   computed in chunks, logits never whole
#pragma once

#include "model/config.hpp"
#include "nn/block.hpp"

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace primecfg::train {

// One parameter: its HF name and the tensor the forward pass uses.
struct NamedParam {
  std::string name;
  torch::Tensor tensor;
  int block = -1;  // transformer block it belongs to; -1 for embedding / final norm / head
  // Kept as loaded (model.freeze_moe_router): its gradient is zeroed where it arrives
  // (offload/shared/param_state.cpp) and every mode's update leaves it as it is.
  bool frozen = false;
};

// What activation checkpointing (model.ac) recomputes in the backward.
enum class Recompute {
  nothing,
  blocks,          // mode = "full": whole blocks
  routed_experts,  // mode = "selective", target "routed_experts": the experts of routed blocks
};

class Transformer {
 public:
  // Called for each parameter as soon as its weights are drawn, in params() order:
  // where a sharded run loads it, keeps its piece and frees the whole (so that no
  // rank ever holds the whole model).
  using ParamBuilt = std::function<void(std::size_t index, NamedParam& p)>;
  // Random init (normal 0.02, norms 1, biases 0) on device in dtype, from the given seed.
  Transformer(const ModelArgs& args, torch::Device device, torch::ScalarType dtype, std::uint64_t seed,
              const ParamBuilt& built = {});

  const ModelArgs& args() const { return args_; }
  // How routed experts run (model.moe_use_grouped_mm and the like); the model's own
  // settings (top_k, norm_topk_prob) come from args().moe.
  void set_moe_settings(const MoeSettings& s) { moe_settings_ = s; }
  // Each block's routing since the last call (undefined counts for blocks without routed
  // experts), counted in the forward only; the counts start again from zero.
  std::vector<MoeStats> take_moe_stats();
  // One linear layer's precision under model.quantization.
  struct LinearPrecision {
    std::string weight;  // its HF name (the tied embedding's for a tied LM head)
    std::string module;  // prime-rl's qualified name, which the ignore patterns are matched against
    std::optional<std::string> bf16_because;  // why it stays in the model's dtype; nullopt: FP8
  };
  // Runs in FP8 (nn/fp8.hpp) the blocks' linear layers that prime-rl's
  // model.quantization = {type = "fp8"} would: every one whose module name
  // (Architecture::linear_module) no pattern finds with a regex search and whose
  // dimensions are multiples of 128. Routed experts are not linears there, nor here
  // (model.quantization.enable_grouped_gemm, checked by the caller). Returns each
  // linear's decision, the LM head's included. Throws std::invalid_argument naming the
  // layer where this model cannot do what prime-rl would: an FP8 LM head (the fused
  // cross-entropy has no FP8 path), a linear with a bias (prime-rl's FP8 layer drops it),
  // one its block does not run as a Linear (nn/linear.hpp), and for a pattern that is not
  // a regex; the model is unchanged then.
  std::vector<LinearPrecision> use_fp8(const std::vector<std::string>& ignore_patterns);
  std::vector<NamedParam>& params() { return params_; }
  const torch::Tensor& param(std::string_view name) const;
  torch::Device device() const { return device_; }
  torch::ScalarType dtype() const { return dtype_; }

  // Copies weights from HF safetensors files (every *.safetensors in dir). Every
  // parameter must be found once with the right shape and a floating-point dtype,
  // and every tensor of the files must be a parameter (a tied LM head only when it
  // equals the embedding); anything else is an error naming the file and tensor.
  void load_hf_weights(const std::filesystem::path& dir);

  struct Inputs {
    torch::Tensor input_ids;            // [B, T] int64
    torch::Tensor positions;            // [B, T] int64
    std::optional<torch::Tensor> mask;  // [B, 1, T, T] bool (true = attend); absent: causal
  };
  // Called in the forward pass around the use of weights: with -1 for the embedding
  // lookup, with l for block l, with the number of layers for the final norm and the
  // LM head. `before` runs just before the weights are first used (FullOffload waits
  // there for its deferred updates; a parallelism that shards the weights gathers
  // them), `after` once that part's forward is queued, with its output (such a
  // parallelism may release them, and hook the output's gradient to gather them again
  // for the backward). A recomputed block (activation checkpointing) calls neither: what its
  // backward needs is the gradient hooks' business.
  struct BlockHook {
    std::function<void(int block)> before;
    std::function<void(int block, const torch::Tensor& out)> after;
  };
  // Several parties hook the same points (the offload pipeline, the parallelism): each
  // is called in list order; null entries are skipped.
  using BlockHooks = std::vector<const BlockHook*>;

  // Final hidden states [B, T, D] after the last norm. `recompute` applies to every
  // ac_freq-th block: Recompute::blocks keeps only the block's input for backward
  // (`offload`, activation offloading, which needs ac_freq = 1, keeps those inputs in
  // host memory); Recompute::routed_experts keeps a routed block's activations but
  // those of its experts.
  torch::Tensor hidden(const Inputs& in, Recompute recompute, std::int64_t ac_freq = 1,
                       const BlockHooks& hooks = {}, ActivationOffload* offload = nullptr);
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
  MoeSettings moe_settings_;
  std::vector<MoeStats> moe_stats_;  // one per block, when the model has routed experts
  torch::Device device_;
  torch::ScalarType dtype_;
  std::vector<NamedParam> params_;
  std::vector<std::unique_ptr<Block>> blocks_;  // models/<name>/, by make_block
  torch::Tensor inv_freq_;                      // RoPE inverse frequencies, FP32 on the device

  // The blocks, with the linears of these weights in FP8; the weights taken as
  // linears are added to `linears` when given.
  std::vector<std::unique_ptr<Block>> make_blocks(const std::set<std::string>& fp8,
                                                  std::vector<std::string>* linears = nullptr) const;
};

}  // namespace primecfg::train
