// What a model is, without LibTorch: the settings of a decoder as HF's config.json
// states them, the presets, and the list of parameters; what is specific to an
// architecture comes from its folder (model/architecture.hpp, models/<name>/). The trainer builds its tensors
// from it and the planner its memory model, so both read config.json the same way.
//
// The reader is strict on purpose: every key of config.json is either used,
// known not to change what the model computes, or an error that names the file,
// the key and its value. A checkpoint never loads into a model that computes
// something else than transformers does.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace primecfg::train {

// A config.json (or preset) the trainer cannot represent faithfully.
struct model_config_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Architecture;  // model/architecture.hpp

// RoPE frequency scaling (HF's rope_scaling / rope_parameters).
struct RopeScaling {
  enum class Type { none, linear, llama3, yarn };
  Type type = Type::none;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  std::int64_t original_max_positions = 0;               // llama3, yarn
  double beta_fast = 32.0, beta_slow = 1.0;              // yarn
  std::optional<double> attention_factor;                // yarn: cos/sin scale; else from factor / mscale
  std::optional<double> mscale, mscale_all_dim;          // yarn
  bool truncate = true;                                  // yarn: round the correction range
};
std::string_view rope_type_name(RopeScaling::Type t);

// The parameters outside the blocks, by the names every architecture here gives them
// (HF's): the input embedding (the token lookup, and the LM head when tied), the final
// norm, and the LM head when untied.
inline constexpr std::string_view kEmbeddingParam = "model.embed_tokens.weight";
inline constexpr std::string_view kFinalNormParam = "model.norm.weight";
inline constexpr std::string_view kLmHeadParam = "lm_head.weight";

// One parameter tensor, in the trainer's order.
struct ParamShape {
  enum class Kind { matrix, norm, bias };
  std::string name;
  std::int64_t rows = 0, cols = 1;  // cols = 1 for vectors (norms, biases)
  int block = -1;                   // transformer block, -1 outside the blocks
  Kind kind = Kind::matrix;
  // Routed expert of its block that the parameter belongs to, -1 for the rest: what
  // expert parallelism splits over the ranks (distributed/piece_layout.hpp).
  std::int64_t expert = -1;
  std::int64_t numel() const { return rows * cols; }
  bool is_matrix() const { return kind == Kind::matrix; }
};

// Routed experts (a Mixture-of-Experts decoder's sparse MLPs), as config.json states them.
struct MoeArgs {
  std::int64_t experts = 0;                // num_experts (transformers 5: num_local_experts too)
  std::int64_t top_k = 0;                  // num_experts_per_tok
  std::int64_t intermediate = 0;           // moe_intermediate_size: each expert's SwiGLU width
  std::int64_t sparse_step = 1;            // decoder_sparse_step
  std::vector<std::int64_t> dense_layers;  // mlp_only_layers: blocks with a dense MLP instead
  bool norm_topk_prob = false;             // the top-k routing weights renormalised to sum to 1
  double router_aux_loss_coef = 0.001;     // kept for config.json; the loss has no auxiliary term
  // Block `layer` routes its tokens to experts (transformers' rule): not listed in
  // dense_layers, and (layer + 1) a multiple of sparse_step.
  bool routed(std::int64_t layer) const;
};

struct ModelArgs {
  std::string model_type = "qwen3";  // config.json's: which architecture (architecture())
  std::int64_t vocab_size = 260;
  std::int64_t hidden = 128;
  std::int64_t layers = 2;
  std::int64_t heads = 4;
  std::int64_t kv_heads = 2;
  std::int64_t head_dim = 32;
  std::int64_t intermediate = 384;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling = {};
  std::int64_t max_positions = 32768;  // max_position_embeddings
  double rms_eps = 1e-6;
  bool tie_embeddings = true;
  // The Llama family's settings (models/llama/), read and written by its folder.
  bool qk_norm = true;          // RMSNorm on each head of q and k (qwen3)
  bool attention_bias = false;  // biases on q, k, v and o (llama, qwen3: attention_bias)
  bool qkv_bias = false;        // biases on q, k and v only (qwen2, always)
  bool mlp_bias = false;        // biases on gate, up and down (llama: mlp_bias)
  // Routed experts (qwen3_moe); absent in a dense model.
  std::optional<MoeArgs> moe;
  // Token ids as config.json wrote them (JSON text: a number, a list or null), written
  // back unchanged so that HF and vLLM stop generation where the source model did.
  std::string bos_token_id = "null", eos_token_id = "null", pad_token_id = "null";

  // The architecture of model_type (model/architecture.hpp); throws model_config_error
  // when none reads it.
  const Architecture& architecture() const;

  bool q_bias() const { return attention_bias || qkv_bias; }
  bool o_bias() const { return attention_bias; }

  // Every parameter in the trainer's order: the embedding, block by block, the final
  // norm, the LM head when untied.
  std::vector<ParamShape> params() const;
  // Parameters inside matmuls (what the MFU formula calls N): everything but norms,
  // biases and the input embedding (counted when tied, since it is the LM head).
  std::int64_t matmul_params() const;
  // Of those, the ones a token is multiplied by (routed experts it skips excluded).
  std::int64_t active_matmul_params() const;
  std::int64_t total_params() const;
  // Training FLOPs per token at `seq_len` tokens, as prime-rl's MFU counts them:
  // 6 x active matmul parameters + 12 x layers x heads x head_dim x seq_len (attention).
  // The one formula for the trainer's MFU and the planner's.
  double flops_per_token(std::int64_t seq_len) const;

  // RoPE as transformers computes it: the inverse frequencies (head_dim / 2 of them)
  // and the factor that scales cos and sin (1 except for yarn).
  std::vector<double> rope_inv_freq() const;
  double rope_attention_scaling() const;
};

// Presets by model.name, the architectures' (model/architecture.hpp): "primecfg/tiny"
// (the default run; "tiny" too) and published models' shapes (models/<name>/spec.cpp).
std::optional<ModelArgs> preset(std::string_view name);
std::vector<std::string> preset_names();
// The local HF directory that model.name names: not a preset, and a folder holding
// config.json; nullopt otherwise. The one place that tells the two apart.
std::optional<std::filesystem::path> hf_directory(std::string_view name);

// The model that model.name names, decided here for the trainer, the planner and the
// config check alike: a preset, else a local directory with config.json (nothing is
// downloaded); model.debug.num_layers keeps that many blocks. hf_dir is the directory
// when the model comes from one (its weights are read from there unless
// model.debug.random_init). Throws model_config_error: neither a preset nor such a
// directory (the message lists the presets and how to download), or a config.json
// that read_hf_config refuses.
struct ResolvedModel {
  ModelArgs args;
  std::optional<std::filesystem::path> hf_dir;
};
ResolvedModel resolve_model(std::string_view name,
                            std::optional<std::int64_t> debug_num_layers = std::nullopt);

// Reads an HF config.json. Throws model_config_error naming the file, the key and the
// value for anything that is missing, malformed, out of range or not implemented.
ModelArgs read_hf_config(const std::filesystem::path& config_json);
// The same from text (path names the source in messages).
ModelArgs parse_hf_config(std::string_view text, const std::string& path);
// The config.json that transformers (4.x and 5.x) and vLLM read back as this model.
std::string hf_config_json(const ModelArgs& a, std::string_view torch_dtype);

// Every config.json key whose value differs between two models in a way that changes
// what the model computes (shapes, RoPE, norms' epsilon, biases, tying), as
// "key: A in <a_name>, B in <b_name>" in config.json's names; token ids are not among
// them. Empty when the two compute the same function of the same weights.
std::vector<std::string> computation_differences(const ModelArgs& a, std::string_view a_name,
                                                 const ModelArgs& b, std::string_view b_name);

}  // namespace primecfg::train
