// The error that stops a run with a message the user can act on (a bad checkpoint, a
// bad data file, a rank that failed). Every folder below the loop throws it; main.cpp
// prints it and exits 1.
#pragma once

#include <stdexcept>

namespace primecfg::train {

struct run_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Host memory that could not be had, said by the part that asked for it (what, how
// much): main.cpp adds the planner's host estimate and what the machine offers.
struct host_memory_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace primecfg::train
