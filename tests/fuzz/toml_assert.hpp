// Force-included (-include) into the fuzz builds, before toml++.
//
// toml++ checks internal preconditions with TOML_ASSERT; in a build without
// NDEBUG they abort. One of them is wrong in toml++ 3.3.0 (Debian 12):
// parse_key() asserts that a table header starts with a key character, while
// its callers let `[=`, `[[[` and the like through and the parser then reports
// an ordinary syntax error (fixed upstream, marzer/tomlplusplus#301). Release
// builds compile the check away under g++ (what primecfg ships); here it is
// skipped so the fuzzer goes on looking for real faults, and every other
// toml++ assertion still aborts.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace primecfg::fuzz {

inline void toml_assertion_failed(const char* expr, const char* file, int line) {
  if (std::strstr(expr, "is_bare_key_character(*cp) || is_string_delimiter(*cp)") != nullptr) return;
  std::fprintf(stderr, "%s:%d: toml++ assertion failed: %s\n", file, line, expr);
  std::abort();
}

}  // namespace primecfg::fuzz

#define TOML_ASSERT(expr) \
  ((expr) ? static_cast<void>(0) : ::primecfg::fuzz::toml_assertion_failed(#expr, __FILE__, __LINE__))
