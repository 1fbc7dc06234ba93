// What the reference trainer implements. A config value it would otherwise
// ignore is an error naming the field (or, for launcher-only sections and
// defaults it cannot honour, a note), never silently dropped.
#pragma once

#include <primecfg/error.hpp>
#include <primecfg/sft.hpp>
#include <primecfg/validate.hpp>

#include <vector>

namespace primecfg::train {

// Problems with a loaded config, with provenance from the loader so an error
// points at the line that set the value. Errors mean: do not start.
std::vector<diagnostic> check_support(const SFTConfig& cfg, const provenance_map& where);

}  // namespace primecfg::train
