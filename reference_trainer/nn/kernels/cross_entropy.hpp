// Cross-entropy of a chunk of bf16 logits and its gradient, in place: the LM head's loss
// without the FP32 copies of the logits that ATen's log_softmax, exp and scaling make
// (two reads and one write of the bf16 logits instead of about 24 bytes per logit).
// FP32 arithmetic, one rounding to bf16 per gradient element.
#pragma once

#include "launch.hpp"

namespace primecfg::train::kernels {

// For each row r of the row-major [rows, vocab] logits x, with t = targets[r]:
//   loss[r] = logsumexp(x[r, :]) - x[r, t]                      (FP32)
//   x[r, j] <- bf16(scale * (softmax(x[r, :])[j] - (j == t)))   (in place)
// An ignored token (t = kIgnoreIndex, the -100 of the data's labels) gives loss[r] = 0 and
// a zero gradient row; any other target outside [0, vocab) gives loss[r] = NaN, never a
// silent zero.
inline constexpr std::int64_t kIgnoreIndex = -100;
void cross_entropy_grad(bf16* logits, const std::int64_t* targets, float* loss, std::int64_t rows,
                        std::int64_t vocab, float scale, cudaStream_t stream);

}  // namespace primecfg::train::kernels
