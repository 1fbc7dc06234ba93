// The tests' side of tools/primecfg-migrate/test_seams.hpp, linked only into
// primecfg-migrate-faulty (meson.build here), a build of the tool for the tests that
// is never installed or shipped. The tests run it as a subprocess, so the failure
// comes in its environment: PRIMECFG_MIGRATE_INJECT_FAILURE=write|change-original|rename
// (helpers.hpp, faulty_tool). An environment variable is acceptable here only because
// this binary is not the product; primecfg-migrate itself reads none.
#include "test_seams.hpp"

#include <cstdlib>

namespace primecfg::migrate::test_seams {

bool inject_failure(std::string_view where) {
  const char* inject = std::getenv("PRIMECFG_MIGRATE_INJECT_FAILURE");
  return inject != nullptr && std::string_view(inject) == where;
}

}  // namespace primecfg::migrate::test_seams
