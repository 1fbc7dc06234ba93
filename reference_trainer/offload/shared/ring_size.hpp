// How large a staging ring or a GPU moment window is. The offload pipelines allocate
// them and the memory planner counts them; both call this, so the two cannot drift.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>

namespace primecfg::train {

// Capacity of a ring for tensors of at most `largest` bytes, `total` bytes in all:
// room for two of the largest (so one fills while the other drains), at least 2 GiB
// when the model has that much (so backward rarely waits for the consumer), never
// less than the largest. `requested` (offload.ring_mib) replaces the automatic size
// but is never below the largest tensor.
inline std::int64_t ring_capacity(std::int64_t largest, std::int64_t total,
                                  std::optional<std::int64_t> requested) {
  const std::int64_t slack = 4096;
  if (requested && *requested > 0) return std::max(*requested, largest + slack);
  const std::int64_t want = std::max<std::int64_t>(2 * largest, std::int64_t{2} << 30);
  return std::max(largest, std::min(want, total)) + slack;
}

}  // namespace primecfg::train
