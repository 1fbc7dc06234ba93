// FullOffload's step on a GPU, one micro-batch, replayed event by event at the
// profile's rates: what offload/full/full_offload.cpp and worker.cpp do with them.
//
// The closed forms (max of GPU, link and CPU) miss how the three wait on each other:
// backward stalls when the gradient staging ring is full and the worker frees it only
// in order; the worker picks what the next forward needs first, idles until a gradient
// has landed, and the forward waits block by block for the deferred updates. Which of
// these sets the step depends on the ring's size against the gradients and on the CPU
// rate against the backward, so the step model replays them (docs/memory-planner.md,
// "Step time", full).
#pragma once

#include <vector>

namespace primecfg::train::plan::detail {

// Parameters the forward reads together (the embedding lookup, one block, the final
// norm and the LM head). The worker updates them job by job: one job a parameter, as
// the hooks hand them over, small ones merged (their order within a unit hardly matters).
struct ReplayGroup {
  std::vector<double> jobs;  // this rank's parameters in each job
  double copy_bytes = 0;     // a parameter's gradient, device to host
  bool in_ring = true;       // staged in the gradient ring (the tied head share has a buffer of its own)
  double upload_bytes = 2;   // a parameter's new weight, host to device
  double forward_s = 0;      // GPU time of the forward that reads them
  double backward_s = 0;     // GPU time of the backward (and recompute) that ends with their gradient
  // Updated only when nothing else has landed, after everything else (the tied
  // embedding's head share: only the LM head at the end of the forward reads it).
  bool filler = false;
};

struct ReplayInputs {
  std::vector<ReplayGroup> groups;  // in the order the forward reads them; backward produces the reverse
  double cpu_params_per_s = 0;
  double d2h_bytes_per_s = 0, h2d_bytes_per_s = 0;  // each while the other way runs too
  double ring_bytes = 0;                            // the gradient staging ring
};

struct ReplayResult {
  bool replayed = false;    // false: the inputs cannot be replayed (a job larger than the ring)
  double step = 0;          // steady state: one forward start to the next
  double cpu_busy = 0;      // of that, the worker updating
  double forward_wait = 0;  // the forward waiting for deferred updates
  double ring_wait = 0;     // backward waiting for staging room
};

ReplayResult replay_full_step(const ReplayInputs& in);

}  // namespace primecfg::train::plan::detail
