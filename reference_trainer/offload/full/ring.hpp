// The size of FullOffload's staging rings as the planner counts them (memory.cpp) and
// replays them (step_time.cpp): full-size tensors in the compute dtype, sized for the
// largest (offload/shared/ring_size.hpp), as full_offload.cpp allocates them.
#pragma once

#include "offload/shared/ring_size.hpp"
#include "planner/memory.hpp"

namespace primecfg::train::plan::detail {

inline i64 full_ring_bytes(const Workload& w) {
  return ring_capacity(largest_numel(w) * w.dt, model_bytes(w), w.a.ring_bytes);
}

}  // namespace primecfg::train::plan::detail
