// primecfg-train's command line holds two things: its own options (options.hpp:
// `--device=cuda`, `--plan`, `--offload.cpu-threads=8`, `--options=FILE`) and the
// training config (`@ cfg.toml`, `--model.offload=full`). A flag belongs to the
// options when its first name is one of TrainerOptions' fields; the two sets of
// names are disjoint (tests/trainer/test_command_line.cpp checks it). Each part is
// then read by primecfg on its own.
#pragma once

#include <primecfg/error.hpp>

#include <string>
#include <vector>

namespace primecfg::train {

struct CommandLine {
  std::vector<std::string> options;  // for load_command_line<TrainerOptions> (`--options=F` as `@ F`)
  std::vector<std::string> config;   // for load_command_line<SFTConfig>
};

CommandLine split_command_line(const std::vector<std::string>& args);

// A flag that names no config field may be a mistyped option (`--offlod.cpu-threads`,
// `--plan-gpu-memroy`): each such error of the config's loader that has no suggestion of
// its own gets the closest primecfg-train option, when one is close.
void suggest_options(std::vector<diagnostic>& config_diagnostics);

}  // namespace primecfg::train
