// The planner's step-time model, private to the planner (the API is planner.hpp's
// StepTime): one rank's step in one mode from a measured machine profile
// (profile.hpp). docs/memory-planner.md ("Step time") derives every term.
#pragma once

#include "planner/memory.hpp"
#include "planner/profile.hpp"

namespace primecfg::train::plan::detail {

// What the model knows of one block and the head on this machine at the workload's
// length: seconds per micro-batch, and how sure it is.
struct ComputeTimes {
  double block_forward = 0, block_backward = 0;  // one block
  double head_forward = 0, head_backward = 0;    // embedding, final norm, LM head, loss
  std::vector<std::string> unsure;
};
ComputeTimes compute_times(const Workload& w, const MachineProfile& p);

// The step of `mode` (with model.ac = `ac`) on one rank.
StepTime step_time(const Workload& w, Offload mode, bool ac, const MachineProfile& p);

// Causal attention FLOPs of one block's forward over B sequences of T tokens (the
// backward counts 2.5 times these), and the profile's throughput at length T
// (log-linear between measured lengths, the nearest one outside them).
double attention_forward_flops(const ModelShape& s, std::int64_t B, std::int64_t T);
double attention_rate(const MachineProfile& p, std::int64_t T, std::int64_t head_dim, bool backward,
                      std::vector<std::string>* unsure = nullptr);

// offload = "full"'s CPU update while the pipeline's copies run beside it, seconds.
// Its time per parameter grows linearly with the host-memory traffic of those copies,
// from `alone_s` (no copies) to `busy_s` (copies both ways at the link's full rate,
// `link_bytes_per_s` in all, as calibrated): the `copy_bytes` spread over the update
// load the host by copy_bytes / t of link_bytes_per_s, so t solves
// t = alone + (busy - alone) * copy_bytes / (t * link_bytes_per_s).
double cpu_update_under_copies(double alone_s, double busy_s, double copy_bytes, double link_bytes_per_s);

}  // namespace primecfg::train::plan::detail
