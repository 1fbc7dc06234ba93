// A section this library does not interpret (an [orchestrator] or [inference]
// table meant for another program). It is declared, so it is not an unknown
// key, and kept as written so it can be dumped back; it is never checked.
#pragma once

#include <primecfg/detail/cxx_version.hpp>  // first: C++20 or later

#include <primecfg/detail/toml.hpp>

namespace primecfg {

struct opaque_table {
  toml::table value;
  friend bool operator==(const opaque_table& a, const opaque_table& b) { return a.value == b.value; }
};

}  // namespace primecfg
