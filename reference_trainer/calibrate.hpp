// `primecfg-train --calibrate=FILE`: measures on this machine what the planner's
// step-time model needs (planner/profile.hpp) and writes it as a TOML profile.
//
// The transformer blocks and heads are timed by running the trainer itself, each run
// a process of its own (offload "none", random weights, fake data), on 1 and 3 blocks of each model, with and
// without checkpointing: a block's time is the difference, its forward what
// checkpointing adds. Everything else is a microbenchmark: SDPA by length, device
// memory, the GPU and CPU optimizer updates, pinned copies alone and both ways at
// once. Collectives are not measured (one GPU): their stated figures are carried over
// from `base` when given.
#pragma once

#include "options.hpp"
#include "planner/profile.hpp"

#include <primecfg/sft.hpp>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace primecfg::train {

struct CalibrateRequest {
  SFTConfig config;                 // the model, seq_len and optimizer of the block runs
  std::vector<std::string> models;  // model names whose blocks to time (config.model.name first)
  RunOptions run;                   // device, compute dtype, CPU threads
  std::filesystem::path trainer;    // the primecfg-train that runs the blocks
  std::string command;              // for the provenance
  std::function<void(const std::string&)> progress;  // one line per measurement (may be empty)
};

plan::MachineProfile calibrate(const CalibrateRequest& req);

// What a user reads once the profile is written to `file`: what was measured (blocks,
// lengths, the host), how the presets' blocks will be planned from it (measured,
// interpolated or beyond the measured ones) and how to use it.
std::string calibration_summary(const plan::MachineProfile& p, const std::string& file);

// The fingerprint of this build's fused kernels' sources (tools/source_fingerprint.py), which
// a profile records (ProfileProvenance::kernel_sources) and a plan compares.
std::string build_kernel_sources();

}  // namespace primecfg::train
