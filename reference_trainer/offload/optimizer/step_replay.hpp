// OptimizerOffload's step on a GPU without clipping, replayed event by event at the
// profile's rates: what offload/optimizer/optimizer_offload.cpp does with the moments.
//
// The closed form (the link's bytes after the forward, beside the backward) misses how
// the moment window ties the two directions together: an upload needs room that only a
// written-back update frees, an update waits for its moments, and the write-backs held
// to the end of the step (deferral) and the embedding's move beside the next forward.
// On Qwen3-30B-A3B's blocks, whose moments are many times the window, that order set
// the step 15 to 18% above the closed form on the H200 (docs/performance.md), so the
// step model replays it (docs/memory-planner.md, "Step time", optimizer).
#pragma once

#include <vector>

namespace primecfg::train::plan::detail {

// An update group (optim/update_groups.hpp): parameters updated together in the hook
// of the last of them, their moments fetched into the window together.
struct MomentGroup {
  double bytes = 0;       // its moments, one way
  double copies = 0;      // copies each way (one a moment and 64 MiB piece)
  double params = 0;      // this rank's parameters, for the GPU update
  double backward_s = 0;  // GPU time from the group before's final gradient to this one's
  bool deferred = false;  // its write-back waits for the end of the step (offload.deferred_share)
};

struct MomentReplayInputs {
  std::vector<MomentGroup> groups;  // in the order their gradients become final (the hooks' order)
  // The input embedding's moments (bytes 0: none): a buffer and an upload stream of their
  // own, fetched from the forward's start once its last write-back landed, updated after
  // every group, written back at the step's end beside the next forward.
  MomentGroup tail;
  double forward_s = 0;                             // the forward with what runs beside it
  double window_bytes = 0;                          // the moment window (a ring, given back oldest first)
  double h2d_bytes_per_s = 0, d2h_bytes_per_s = 0;  // each while the other way runs too
  double copy_s = 0;                                // each copy's cost beyond its bytes
  double update_params_per_s = 0;                   // the GPU's fused AdamW
};

struct MomentReplayResult {
  bool replayed = false;   // false: the inputs cannot be replayed (a group larger than the window)
  double step = 0;         // steady state: one forward start to the next
  double update_wait = 0;  // the compute stream waiting for moments to arrive
  double room_wait = 0;    // the uploads waiting for window room
};

MomentReplayResult replay_optimizer_step(const MomentReplayInputs& in);

}  // namespace primecfg::train::plan::detail
