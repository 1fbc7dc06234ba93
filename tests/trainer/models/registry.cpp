// The test architectures (tests/trainer/models/<name>/), added to the product's by one line
// each before any test runs: the test binary links these objects itself.
#include "models/gelu/gelu.hpp"

namespace primecfg::train::test {

namespace {

bool add(const Architecture& a, BlockMaker block) {
  add_architecture(a);
  add_block(a.name(), block);
  return true;
}

const bool added = add(gelu_architecture(), &make_gelu_block);

}  // namespace

}  // namespace primecfg::train::test
