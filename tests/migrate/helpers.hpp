// Shared helpers of the primecfg-migrate tests.
#pragma once

#include "migrate.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

#include <unistd.h>

namespace mt {

using namespace primecfg::migrate;
namespace fs = std::filesystem;

inline file_result run(std::string text, bool fsdp_as_full = false) {
  options o;
  o.fsdp_as_full = fsdp_as_full;
  return migrate_text(std::move(text), o);
}

// The migrated text; the test fails when the migration reported an error.
inline std::string migrated(std::string text) {
  file_result r = run(std::move(text));
  for (const auto& d : r.diagnostics) INFO(format("input.toml", d));
  REQUIRE_FALSE(r.failed());
  return r.migrated;
}

inline bool has(const file_result& r, level l, std::string_view needle, std::size_t line = 0) {
  return std::any_of(r.diagnostics.begin(), r.diagnostics.end(), [&](const diagnostic& d) {
    return d.lvl == l && d.message.find(needle) != std::string::npos && (line == 0 || d.line == line);
  });
}

inline std::size_t count(const file_result& r, level l) {
  return static_cast<std::size_t>(std::count_if(r.diagnostics.begin(), r.diagnostics.end(),
                                                [&](const diagnostic& d) { return d.lvl == l; }));
}

inline std::string all_diagnostics(const file_result& r) {
  std::string s;
  for (const auto& d : r.diagnostics) s += format("input.toml", d) + "\n";
  return s;
}

inline std::string env(const char* name) {
  const char* v = std::getenv(name);
  REQUIRE_MESSAGE(v != nullptr,
                  "environment variable " << name << " is not set (run the tests through meson)");
  return v;
}

inline std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot read " << p);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write(const fs::path& p, const std::string& data) {
  fs::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << data;
  REQUIRE(out.good());
}

// A fresh, empty folder under the system temporary folder.
inline fs::path scratch(const std::string& name) {
  fs::path p =
      fs::temp_directory_path() / ("primecfg-migrate-test-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

}  // namespace mt
