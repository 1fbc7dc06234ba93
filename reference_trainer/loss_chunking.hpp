// How many vocabulary rows one chunk of the vocabulary-chunked loss holds
// (Transformer::LossChunks::vocabulary). The model walks the logits with it and the
// memory planner sizes the chunk with it, so the two cannot drift apart.
#pragma once

#include <algorithm>
#include <cstdint>

namespace primecfg::train {

// As many logits per chunk as a chunk of `chunk_tokens` tokens holds over the whole
// vocabulary, spread over the micro-batch's `tokens` tokens, and at least 8 chunks
// per vocabulary, so that the first rows of the head gradient come early.
inline std::int64_t vocab_chunk_rows(std::int64_t chunk_tokens, std::int64_t vocab, std::int64_t tokens) {
  return std::clamp<std::int64_t>(chunk_tokens * vocab / std::max<std::int64_t>(tokens, 1), 1,
                                  std::max<std::int64_t>(1, (vocab + 7) / 8));
}

}  // namespace primecfg::train
