// The planner's defaults follow the build (plan::kFusedKernels): a build with the fused
// CUDA kernels plans them, CI's CPU build plans ATen's operators. The planner's tests plan
// for ATen's operators whichever build runs them, so the GPU machine's build checks the
// same figures as CI's; a test about a fused kernel turns it on itself.
#pragma once

#include "planner/planner.hpp"

inline primecfg::train::plan::Assumptions unfused_assumptions() {
  primecfg::train::plan::Assumptions a;
  a.fused_swiglu = false;
  a.fused_cross_entropy = false;
  a.fused_adamw = false;  // also: offload = "none" replays no CUDA graph
  return a;
}
