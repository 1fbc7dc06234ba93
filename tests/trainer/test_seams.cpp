// The tests' side of reference_trainer/offload/shared/test_seams.hpp: switches a test case
// sets for the runs it makes (TestSeams below) and puts back when it ends.
#include "test_seams.hpp"

namespace primecfg::train::test_seams {

FullOffload full_offload_for_tests;

FullOffload full_offload() { return full_offload_for_tests; }

}  // namespace primecfg::train::test_seams
