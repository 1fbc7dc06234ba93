// The product's side of test_seams.hpp: no failure is ever injected.
#include "test_seams.hpp"

namespace primecfg::migrate::test_seams {

bool inject_failure(std::string_view) { return false; }

}  // namespace primecfg::migrate::test_seams
