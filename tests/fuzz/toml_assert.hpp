// Force-included (-include) into the fuzz builds, before toml++.
//
// toml++ checks internal preconditions with TOML_ASSERT; in a build without
// NDEBUG they abort. Two of them are wrong in toml++ 3.3.0 (Debian 12), in the
// same way: a precondition its callers do not keep, after which the parser reports
// an ordinary syntax error.
//  - parse_key() asserts that a table header starts with a key character, while
//    its callers let `[=`, `[[[` and the like through (fixed upstream,
//    marzer/tomlplusplus#301);
//  - parse_value() asserts it does not stand on a value terminator, which
//    `a = []odecow\x01` reaches (found by fuzz_load on 2026-12-01; the release
//    build reports "expected a comment or whitespace, saw 'o'" at 1:21).
// Release builds compile both checks away under g++ (TOML_ASSUME is empty
// without __builtin_assume; what primecfg ships); here they are skipped so the
// fuzzer goes on looking for real faults, and every other toml++ assertion still
// aborts.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace primecfg::fuzz {

inline void toml_assertion_failed(const char* expr, const char* file, int line) {
  if (std::strstr(expr, "is_bare_key_character(*cp) || is_string_delimiter(*cp)") != nullptr) return;
  if (std::strcmp(expr, "!is_value_terminator(*cp)") == 0) return;
  std::fprintf(stderr, "%s:%d: toml++ assertion failed: %s\n", file, line, expr);
  std::abort();
}

}  // namespace primecfg::fuzz

#define TOML_ASSERT(expr) \
  ((expr) ? static_cast<void>(0) : ::primecfg::fuzz::toml_assertion_failed(#expr, __FILE__, __LINE__))
