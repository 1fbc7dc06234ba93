// The size of the pieces the offload pipelines cut large host <-> device copies into
// (copies.hpp) and the step model counts copies by (offload/optimizer/step_time.cpp):
// one constant, so the two cannot drift. No LibTorch.
#pragma once

#include <cstdint>

namespace primecfg::train {

// A copy engine runs the copies queued on it in order: a small copy the compute stream
// needs would otherwise wait behind a whole 1 GB moment transfer (22 ms at 55 GB/s).
inline constexpr std::int64_t kCopyPieceBytes = std::int64_t{64} << 20;

}  // namespace primecfg::train
