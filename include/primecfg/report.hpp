// Printing diagnostics: compiler-style text for people, JSON for tools.
//
// Both are compiled once where PRIMECFG_HEADER_ONLY=0 (detail/header_only.hpp);
// the definitions are in detail/report.inl.
#pragma once

#include <primecfg/detail/cxx_version.hpp>  // first: C++20 or later

#include <primecfg/detail/header_only.hpp>
#include <primecfg/error.hpp>

#include <fmt/format.h>
#include <primecfg/detail/toml.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace primecfg {

// One line per diagnostic, then "3 errors in SFTConfig" when there are errors.
PRIMECFG_LOADER_API std::string format_text(const std::vector<diagnostic>& diagnostics,
                                            std::string_view root_name);

// A JSON array with one object per diagnostic:
// {"severity", "kind", "path", "origin", "file", "line", "column", "message", "input"}.
PRIMECFG_LOADER_API std::string format_json(const std::vector<diagnostic>& diagnostics);

}  // namespace primecfg

#include <primecfg/detail/report.inl>
