// The training entry point, without LibTorch in the interface (main.cpp and the
// plain-C++ tests include only this).
#pragma once

#include "distributed/launch.hpp"
#include "options.hpp"

#include <primecfg/sft.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace primecfg::train {

// How to run, beyond the config (the command line and tests decide these).
struct RunOptions {
  std::optional<std::string> device;  // "cpu" or "cuda[:i]"; default: cuda when present
  std::optional<bool> bf16;           // compute dtype; default: bf16 on CUDA, FP32 on CPU
  bool print = true;                  // per-step progress on stderr
  bool demo = false;                  // print a few generated reversals at the end
  bool collect_weights = false;       // return the final FP32 masters in RunResult
  std::string resolved_config;        // written to <output_dir>/config.toml when not empty
  std::string resolved_options;       // written to <output_dir>/options.toml when not empty
  // Instead of training: the logits of the first micro-batch of the data, written to this
  // safetensors file with its input_ids, positions and targets (a check against
  // transformers; tests/trainer/hf_parity_test.py).
  std::optional<std::filesystem::path> dump_logits;
  // The offload pipelines (ring sizes, CPU threads, timeouts), profiling, and the
  // device's peak FLOP/s for MFU: primecfg-train's options (options.hpp).
  OffloadOptions offload;
  ProfileOptions profile;
  std::optional<double> peak_tflops;
  // Where this process stands among the launcher's ranks (one process: world 1), and
  // how a sharded run moves gradients and weights.
  Launch launch;
  DistOptions dist;
};

struct RunResult {
  std::vector<double> losses;   // one per optimizer step run by this call
  std::int64_t first_step = 0;  // step the run started from (after resume)
  std::int64_t last_step = 0;
  std::vector<std::pair<std::string, std::vector<float>>> weights;        // when collect_weights
  std::vector<std::pair<std::string, std::vector<float>>> model_weights;  // forward weights, as FP32
};

// Anything that stops a run with a message for the user (bad checkpoint, bad data file, ...).
struct run_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Trains with cfg.model.offload's strategy (dispatched through primecfg::visit_offload).
RunResult run_sft(const SFTConfig& cfg, const RunOptions& opts);

}  // namespace primecfg::train
