// The training entry point, without LibTorch in the interface (main.cpp and the
// plain-C++ tests include only this).
#pragma once

#include "base/run_error.hpp"
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

struct RunResult {
  std::vector<double> losses;   // one per optimizer step run by this call
  std::int64_t first_step = 0;  // step the run started from (after resume)
  std::int64_t last_step = 0;
  std::vector<std::pair<std::string, std::vector<float>>> weights;        // when collect_weights
  std::vector<std::pair<std::string, std::vector<float>>> model_weights;  // forward weights, as FP32
};

// Trains with cfg.model.offload's strategy (dispatched through primecfg::visit_offload).
RunResult run_sft(const SFTConfig& cfg, const RunOptions& opts);

}  // namespace primecfg::train
