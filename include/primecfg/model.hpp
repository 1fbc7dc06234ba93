// [model]: what to train and how it is laid out in memory.
#pragma once

#include <primecfg/detail/cxx_version.hpp>  // first: C++20 or later

#include <primecfg/describe.hpp>
#include <primecfg/int_or.hpp>
#include <primecfg/offload.hpp>
#include <primecfg/validate.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace primecfg {

enum class Attention { sdpa, flash_attention_2, flash_attention_3, flash_attention_4, eager, auto_ };
enum class ModelImpl { auto_, hf, custom, liger_kernel };
enum class Dtype { bfloat16, float32 };
enum class CpStyle { ring, ulysses };
enum class AcMode { full, selective };
enum class EpCommBackend { torch, deepep };
// The keywords prime-rl's `int | Literal[...]` fields take besides a number.
enum class LmHeadChunking { disabled };
enum class ExpertParallel { auto_ };

// Functions, not braced lists: g++ 12 crashes counting the fields of an
// aggregate whose std::vector<std::string> member has a braced default.
inline std::vector<std::string> default_ac_targets() { return {"norm"}; }

struct ActivationCheckpointConfig {
  std::int64_t freq = 1;
  AcMode mode = AcMode::full;
  std::vector<std::string> targets = default_ac_targets();

  static constexpr auto fields() {
    using S = ActivationCheckpointConfig;
    return describe(field(&S::freq, "Checkpoint every freq-th transformer block.", ge(1)),
                    field(&S::mode, "full recomputes whole blocks; selective only the listed targets."),
                    field(&S::targets,
                          "Sub-modules to recompute in selective mode: norm, attn_proj, mlp, mla_up_proj, "
                          "routed_experts, linear_attn (duplicates are dropped)."));
  }

  // prime-rl's validate_selective_targets.
  void validate(validation& v) {
    std::vector<std::string> unique;
    for (const std::string& t : targets)
      if (std::find(unique.begin(), unique.end(), t) == unique.end()) unique.push_back(t);
    targets = std::move(unique);
    if (mode == AcMode::selective && targets.empty())
      v.error(targets, "selective activation checkpointing needs at least one target");
  }
};

struct ActivationOffloadConfig {
  bool pin_memory = true;
  std::int64_t max_inflight_activations = 5;

  static constexpr auto fields() {
    using S = ActivationOffloadConfig;
    return describe(
        field(&S::pin_memory, "Keep offloaded activations in pinned host memory."),
        field(&S::max_inflight_activations, "Activations kept in flight to the host at once.", ge(1)));
  }
};

struct IndexCacheConfig {
  std::int64_t topk_freq = 1;
  std::optional<std::string> topk_pattern = std::nullopt;

  static constexpr auto fields() {
    using S = IndexCacheConfig;
    return describe(
        field(&S::topk_freq, "Recompute sparse-attention top-k indices every topk_freq layers.", ge(1)),
        field(&S::topk_pattern, "Per-layer schedule (F: fresh, S: reuse); overrides topk_freq."));
  }
};

struct CompileConfig {
  bool fullgraph = false;

  static constexpr auto fields() {
    return describe(field(&CompileConfig::fullgraph, "Compile each block as one graph (no graph breaks)."));
  }
};

// A function, not a braced list: g++ 12 crashes counting the fields of an
// aggregate whose std::vector<std::string> member has a braced default.
inline std::vector<std::string> default_lora_targets() {
  return {"q_proj",  "k_proj",    "v_proj",  "o_proj",          "gate_proj",
          "up_proj", "down_proj", "experts", "fc1_latent_proj", "fc2_latent_proj"};
}

struct LoraConfig {
  std::int64_t rank = 16;
  double alpha = 32.0;
  double dropout = 0.0;
  std::vector<std::string> target_modules = default_lora_targets();
  std::vector<std::string> modules_to_save = {};

  static constexpr auto fields() {
    using S = LoraConfig;
    return describe(field(&S::rank, "Rank of the low-rank adapters.", ge(1)),
                    field(&S::alpha, "Scaling numerator of the adapters (scale = alpha / rank).", gt(0)),
                    field(&S::dropout, "Dropout on the adapter input.", ge(0), lt(1)),
                    field(&S::target_modules,
                          "Module names or regexes that get adapters; names the model lacks are ignored."),
                    field(&S::modules_to_save, "Module names or regexes kept fully trainable."));
  }
};

enum class QuantizationType { fp8 };

// Modules prime-rl keeps in high precision under FP8 (regexes, re.search).
inline std::vector<std::string> default_fp8_ignore_patterns() {
  return {"lm_head", "router",       "mlp\\.gate\\.", "shared_expert_gate",
          "eh_proj", "weights_proj", "in_proj_a",     "in_proj_b"};
}

struct QuantizationConfig {
  QuantizationType type = QuantizationType::fp8;
  bool enable_grouped_gemm = true;
  std::vector<std::string> ignore_patterns = default_fp8_ignore_patterns();

  static constexpr auto fields() {
    using S = QuantizationConfig;
    return describe(field(&S::type, "Low-precision format of the matmuls."),
                    field(&S::enable_grouped_gemm, "Quantize the grouped expert matmuls too."),
                    field(&S::ignore_patterns, "Regexes of module names kept in high precision."));
  }
};

struct VlmConfig {
  bool freeze_vision_encoder = true;
  std::string language_model_attr = "model.language_model";
  std::string vision_encoder_attr = "model.visual";

  static constexpr auto fields() {
    using S = VlmConfig;
    return describe(field(&S::freeze_vision_encoder, "Keep the vision encoder's weights fixed."),
                    field(&S::language_model_attr, "Attribute path of the language model."),
                    field(&S::vision_encoder_attr, "Attribute path of the vision encoder."));
  }
};

struct ModelDebugConfig {
  std::optional<std::int64_t> num_layers = std::nullopt;
  bool random_init = false;
  bool force_balanced_routing = false;

  static constexpr auto fields() {
    using S = ModelDebugConfig;
    return describe(field(&S::num_layers, "Keep only the first num_layers blocks.", ge(1)),
                    field(&S::random_init, "Initialise weights randomly instead of loading them."),
                    field(&S::force_balanced_routing, "Route MoE tokens round-robin (benchmarks)."));
  }
};

struct ModelConfig {
  std::string name = "Qwen/Qwen3-0.6B";
  Offload offload = Offload::optimizer;
  std::optional<std::int64_t> seq_len = std::nullopt;
  Attention attn = Attention::auto_;
  ModelImpl impl = ModelImpl::auto_;
  Dtype optimization_dtype = Dtype::float32;
  Dtype reduce_dtype = Dtype::float32;
  std::optional<CompileConfig> compile = CompileConfig{};
  // On by default, as in prime-rl: at long context the checkpointed block inputs are
  // what is left on the GPU once the optimizer state has gone.
  std::optional<ActivationCheckpointConfig> ac = ActivationCheckpointConfig{};
  std::optional<ActivationOffloadConfig> ac_offloading = ActivationOffloadConfig{};
  std::optional<int_or<LmHeadChunking>> fused_lm_head_token_chunk_size = std::nullopt;
  std::int64_t dp_replicate = 1;
  int_or<ExpertParallel> ep = 1;
  EpCommBackend ep_comm_backend = EpCommBackend::torch;
  std::int64_t deepep_num_sms = 20;
  std::optional<std::int64_t> deepep_token_chunk_size = std::nullopt;
  std::int64_t cp = 1;
  CpStyle cp_style = CpStyle::ring;
  bool reshard_after_forward = true;
  bool trust_remote_code = false;
  std::optional<LoraConfig> lora = std::nullopt;
  std::optional<QuantizationConfig> quantization = std::nullopt;
  std::optional<VlmConfig> vlm = std::nullopt;
  std::optional<ModelDebugConfig> debug = std::nullopt;
  std::optional<std::filesystem::path> conversion_dir = std::nullopt;
  Dtype moe_router_dtype = Dtype::float32;
  bool moe_use_grouped_mm = true;
  bool moe_fused_kernel = false;
  bool freeze_moe_router = false;
  std::optional<IndexCacheConfig> index_cache = std::nullopt;

  static constexpr auto fields() {
    using S = ModelConfig;
    return describe(
        field(&S::name, "Model: a preset name, a HuggingFace id, or a local HF-style directory."),
        field(&S::offload,
              "Where FP32 training state lives: none (all on GPU), optimizer (moments on host), "
              "full (masters, moments and gradients on host; CPU optimizer)."),
        field(&S::seq_len, "Sequence length the trainer packs to (RL trainer).", ge(1)),
        field(&S::attn,
              "Attention kernel; auto picks FA3 on Hopper and FA4 on Blackwell (prime-rl's default)."),
        field(&S::impl, "Model implementation (auto picks the custom one when available)."),
        field(&S::optimization_dtype, "Dtype of the master weights the optimizer updates."),
        field(&S::reduce_dtype, "Dtype of gradient reductions across ranks."),
        field(&S::compile, "torch.compile settings; \"None\" disables compilation."),
        field(&S::ac, "Activation checkpointing; an empty table enables it with defaults."),
        field(&S::ac_offloading, "Offload checkpointed activations to host memory."),
        field(&S::fused_lm_head_token_chunk_size,
              "Tokens per chunk of the fused LM head + cross-entropy (logits never whole); \"disabled\": "
              "the plain LM head; \"None\": chosen from the vocabulary size.",
              ge(1)),
        field(&S::dp_replicate, "Data-parallel replicas outside FSDP (HSDP).", ge(1)),
        field(&S::ep,
              "Expert-parallel degree; \"auto\": min(GPUs per FSDP island, 8) for MoE models, 1 otherwise.",
              ge(1)),
        field(&S::ep_comm_backend, "Expert-parallel all-to-all: torch collectives or DeepEP kernels."),
        field(&S::deepep_num_sms, "SMs given to DeepEP dispatch/combine kernels.", ge(1)),
        field(&S::deepep_token_chunk_size, "Tokens per DeepEP pipelining chunk; \"None\" does not chunk.",
              ge(1)),
        field(&S::cp, "Context-parallel degree.", ge(1)), field(&S::cp_style, "Context-parallel algorithm."),
        field(&S::reshard_after_forward, "Free gathered FSDP weights after forward."),
        field(&S::trust_remote_code, "Allow model code from the checkpoint directory."),
        field(&S::lora, "LoRA adapters; absent trains all weights."),
        field(&S::quantization, "Quantized training."), field(&S::vlm, "Vision-language model settings."),
        field(&S::debug, "Debugging and benchmarking knobs."),
        field(&S::conversion_dir,
              "Folder for auto-converted weights; \"None\" writes into the model snapshot."),
        field(&S::moe_router_dtype, "Compute dtype of MoE router gates."),
        field(&S::moe_use_grouped_mm, "Grouped matmuls for MoE layers."),
        field(&S::moe_fused_kernel, "Fused MoE CUDA kernel for routed experts (Blackwell)."),
        field(&S::freeze_moe_router, "Keep MoE router weights fixed."),
        field(&S::index_cache, "Reuse sparse-attention top-k indices across layers."),
        retired("optim_cpu_offload", "offload"), retired("fsdp_cpu_offload", "offload"),
        retired("full_offload", "offload"), retired("numa_bind", ""), retired("cpu_optimizer_backend", ""));
  }
};

}  // namespace primecfg
