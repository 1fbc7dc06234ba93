// The ordered list of migration steps. primecfg-migrate runs each of them, in
// this order, on every file; a step that finds nothing to do changes nothing.
// To add a step, see migrations/README.md.
#pragma once

#include "0001_offload_to_single_field.hpp"
#include "step.hpp"

#include <vector>

namespace primecfg::migrate {

inline const std::vector<step>& all_steps() {
  static const std::vector<step> steps = {
      m0001::make(),
  };
  return steps;
}

}  // namespace primecfg::migrate
