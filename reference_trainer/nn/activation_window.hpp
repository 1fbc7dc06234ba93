// How many checkpointed block inputs activation offloading (nn/activation_offload.hpp)
// keeps on the device and how many it moves to host memory, for one forward pass of
// `blocks` checkpointed blocks. No LibTorch: the planner reads it too.
#pragma once

#include <algorithm>
#include <cstdint>

namespace primecfg::train {

// The last max_inflight blocks' inputs stay on the device (their backward comes first).
inline std::int64_t block_inputs_kept(std::int64_t blocks, std::int64_t max_inflight) {
  return std::min(blocks, max_inflight);
}
inline std::int64_t block_inputs_offloaded(std::int64_t blocks, std::int64_t max_inflight) {
  return blocks - block_inputs_kept(blocks, max_inflight);
}

}  // namespace primecfg::train
