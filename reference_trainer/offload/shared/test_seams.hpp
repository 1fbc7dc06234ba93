// Switches only tests turn: they make a rare path of FullOffload run every step, or
// run the alternative that must give the same bits, on a CPU. A link-time seam:
// primecfg-train links offload/test_seams.cpp (every switch at its product setting);
// the trainer's tests link tests/trainer/test_seams.cpp instead, which lets them set
// the switches. Production code has no way to turn them.
#pragma once

#include <optional>

namespace primecfg::train::test_seams {

struct FullOffload {
  // Updates left when backward ends run beside the next forward (nullopt: on a GPU only).
  std::optional<bool> defer;
  // With tied embeddings, the rows the batch does not touch are updated from the LM
  // head's share of the gradient as backward starts (false: after backward, whole).
  bool split_tied = true;
  // The worker holds that head share back until the next forward names the rows its
  // lookup reads, so that the lookup path runs every step.
  bool hold_head_share = false;
  // The worker waits this long before each update, so that the next forward finds
  // the updates of the step before still pending, block after block.
  int worker_delay_ms = 0;
  // With tied embeddings, the loss walks vocabulary chunks where vocab_chunked_loss
  // says so (false: token chunks, as NoOffload and OptimizerOffload do, so that a
  // comparison with them differs only in the update code).
  bool vocabulary_loss = true;
};

// Read once by each FullOffload pipeline, when it is made.
FullOffload full_offload();

}  // namespace primecfg::train::test_seams
