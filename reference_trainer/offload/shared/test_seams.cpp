// The product's side of offload/test_seams.hpp: every switch at its product setting.
#include "offload/shared/test_seams.hpp"

namespace primecfg::train::test_seams {

FullOffload full_offload() { return {}; }

}  // namespace primecfg::train::test_seams
