// What the reference trainer implements. A config value it would otherwise
// ignore is an error naming the field (or, for launcher-only sections and
// defaults it cannot honour, a note), never silently dropped.
#pragma once

#include <primecfg/error.hpp>
#include <primecfg/sft.hpp>
#include <primecfg/trainer.hpp>
#include <primecfg/validate.hpp>

#include <vector>

namespace primecfg::train {

// Problems with a loaded config, with provenance from the loader so an error
// points at the line that set the value. Errors mean: do not start. `world`: the
// ranks of the run (the launcher's WORLD_SIZE).
std::vector<diagnostic> check_support(const SFTConfig& cfg, const provenance_map& where, int world = 1);

// A TrainerConfig (the RL trainer's) trains here on its [data.fake] only: the settings
// that only the RL trainer has (loss, weight broadcast, ...) are errors where they are
// set. The rest is checked by check_support after from_trainer_config.
std::vector<diagnostic> check_rl_only(const provenance_map& where);

// The SFTConfig a TrainerConfig with [data.fake] trains as: every field both have.
SFTConfig from_trainer_config(const TrainerConfig& t);

}  // namespace primecfg::train
