// What the reference trainer implements. A config value it would otherwise
// ignore is an error naming the field (or, for launcher-only sections and
// defaults it cannot honour, a note), never silently dropped.
#pragma once

#include <primecfg/error.hpp>
#include <primecfg/sft.hpp>
#include <primecfg/trainer.hpp>
#include <primecfg/validate.hpp>

#include <span>
#include <string_view>
#include <vector>

namespace primecfg::train {

// What primecfg-train does with a field of the config.
enum class Decision {
  used,           // it changes what trains
  refused,        // an error where set to what the trainer does not implement
  no_effect,      // accepted (prime-rl's configs load) and noted where set
  launcher_only,  // a section for the launcher; noted where present
};

struct FieldDecision {
  // A dotted path as the config spells it; a section covers everything under it.
  std::string_view path;
  Decision decision;
  // used: where; refused: what is missing; no_effect: the note's reason.
  std::string_view why;
  // The alternative (`type`) of the tagged union the path is in that this decision is
  // for, where the alternatives differ; empty: every alternative.
  std::string_view alternative = {};
  // The note instead in a run of one process, where a field does nothing there.
  std::string_view one_process = {};
};

// The decision on every field of SFTConfig, each written once: check_support refuses
// what is `refused` and takes its notes from here. The fields of a TrainerConfig's
// [data.fake] are spelled as SFTConfig's data.* (alternative "fake").
std::span<const FieldDecision> field_decisions();

// The fields of TrainerConfig that SFTConfig has not (the RL trainer's own): what
// check_rl_only refuses or notes. The rest go through from_trainer_config.
std::span<const FieldDecision> rl_only_decisions();

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
