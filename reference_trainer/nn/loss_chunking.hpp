// How the fused LM head + cross-entropy walks the logits: chunks of tokens, or of
// the vocabulary. The model, the offload pipelines and the memory planner all ask
// here, so they cannot drift apart.
#pragma once

#include <primecfg/int_or.hpp>
#include <primecfg/model.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>

namespace primecfg::train {

// As many logits per chunk as a chunk of `chunk_tokens` tokens holds over the whole
// vocabulary, spread over the micro-batch's `tokens` tokens, and at least 8 chunks
// per vocabulary, so that the first rows of the head gradient come early.
inline std::int64_t vocab_chunk_rows(std::int64_t chunk_tokens, std::int64_t vocab, std::int64_t tokens) {
  return std::clamp<std::int64_t>(chunk_tokens * vocab / std::max<std::int64_t>(tokens, 1), 1,
                                  std::max<std::int64_t>(1, (vocab + 7) / 8));
}

// Tokens per chunk of the fused LM head + cross-entropy when
// model.fused_lm_head_token_chunk_size is unset: 2^28 / vocab tokens (1 GiB of
// FP32 logits), at least 256. Larger chunks keep the head's GEMMs efficient.
inline std::int64_t default_ce_chunk_tokens(std::int64_t vocab_size) {
  return std::max<std::int64_t>(256, (std::int64_t{1} << 28) / std::max<std::int64_t>(1, vocab_size));
}

// The chunk for model.fused_lm_head_token_chunk_size: the number given, the default
// above for "None", and all tokens of a micro-batch for "disabled" (prime-rl's plain
// LM head: the whole logits at once, the same loss).
inline std::int64_t ce_chunk_tokens(const std::optional<int_or<LmHeadChunking>>& setting,
                                    std::int64_t vocab_size, std::int64_t micro_batch_tokens) {
  if (!setting) return default_ce_chunk_tokens(vocab_size);
  if (setting->is(LmHeadChunking::disabled)) return std::max<std::int64_t>(1, micro_batch_tokens);
  return setting->number();
}

// Whether FullOffload with a tied embedding walks the loss in vocabulary chunks
// (Transformer::LossChunks::vocabulary) for micro-batches of `tokens` tokens. That
// costs the GPU one more GEMM and more passes over the logits, which grow with the
// tokens, to let the CPU update start during the loss instead of after it: worth it
// while the CPU update sets the step time. On the H200 machine with Qwen3-0.6B,
// 8192 tokens gained 3% and 32768 lost 13% (docs/performance.md); the line lies
// between.
inline constexpr std::int64_t kVocabChunkedLossMaxTokens = 16384;
inline bool vocab_chunked_loss(bool tied_embeddings, std::int64_t tokens) {
  return tied_embeddings && tokens <= kVocabChunkedLossMaxTokens;
}

}  // namespace primecfg::train
