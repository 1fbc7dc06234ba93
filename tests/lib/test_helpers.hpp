// Helpers shared by the library tests.
#pragma once

#include <primecfg/cli.hpp>
#include <primecfg/load.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace testing {

// Loads TOML text (named "test.toml" in messages) into T.
template <class T>
primecfg::loaded<T> load_text(const std::string& text, std::vector<std::string> args = {}) {
  primecfg::sources src;
  src.add_text("test.toml", text);
  return primecfg::load_command_line<T>(args, src);
}

// The diagnostics of one kind.
template <class T>
std::vector<primecfg::diagnostic> of_kind(const primecfg::loaded<T>& r, primecfg::error_kind kind) {
  std::vector<primecfg::diagnostic> out;
  std::copy_if(
      r.diagnostics.begin(), r.diagnostics.end(), std::back_inserter(out),
      [&](const primecfg::diagnostic& d) { return d.kind == kind && d.level == primecfg::severity::error; });
  return out;
}

// The one error at `path`; fails the test when there is not exactly one.
template <class T>
primecfg::diagnostic error_at(const primecfg::loaded<T>& r, const std::string& path) {
  std::vector<primecfg::diagnostic> found;
  for (const auto& d : r.diagnostics)
    if (d.path == path && d.level == primecfg::severity::error) found.push_back(d);
  INFO("errors at ", path);
  REQUIRE(found.size() == 1);
  return found.front();
}

inline std::string at(const primecfg::diagnostic& d) { return d.where.to_string(); }

}  // namespace testing
