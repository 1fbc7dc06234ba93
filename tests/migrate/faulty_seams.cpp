// The tests' side of tools/primecfg-migrate/test_seams.hpp, linked only into
// primecfg-migrate-faulty (meson.build here), a build of the tool for the tests that
// is never installed or shipped. The tests run it as a subprocess, so the failure
// comes in its environment: PRIMECFG_MIGRATE_INJECT_FAILURE=write|change-original|rename|no-tmpfile|kill
// (several: comma-separated)
// (helpers.hpp, faulty_tool). An environment variable is acceptable here only because
// this binary is not the product; primecfg-migrate itself reads none.
#include "test_seams.hpp"

#include <cstdlib>
#include <string_view>

namespace primecfg::migrate::test_seams {

bool inject_failure(std::string_view where) {
  const char* inject = std::getenv("PRIMECFG_MIGRATE_INJECT_FAILURE");
  if (inject == nullptr) return false;
  std::string_view list = inject;  // one name, or several separated by commas
  while (!list.empty()) {
    std::size_t comma = list.find(',');
    if (list.substr(0, comma) == where) return true;
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
  }
  return false;
}

}  // namespace primecfg::migrate::test_seams
