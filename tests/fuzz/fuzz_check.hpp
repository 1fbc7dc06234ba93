// A failed property in a fuzz target: print what broke and abort, so that
// libFuzzer records the input as a crash.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace primecfg::fuzz {

[[noreturn]] inline void fail(const char* what, std::string_view detail = {}) {
  std::fprintf(stderr, "fuzz property violated: %s\n", what);
  if (!detail.empty())
    std::fprintf(stderr, "---\n%.*s\n---\n", static_cast<int>(detail.size()), detail.data());
  std::abort();
}

inline void check(bool ok, const char* what, std::string_view detail = {}) {
  if (!ok) fail(what, detail);
}

}  // namespace primecfg::fuzz
