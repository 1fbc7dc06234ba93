// Shared helpers of the primecfg-migrate tests.
#pragma once

#include "migrate.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>

#include <sys/wait.h>
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
  for (const auto& d : r.findings) INFO(format("input.toml", d));
  REQUIRE_FALSE(r.failed());
  return r.migrated;
}

inline bool has(const file_result& r, level l, std::string_view needle, std::size_t line = 0) {
  return std::any_of(r.findings.begin(), r.findings.end(), [&](const finding& d) {
    return d.lvl == l && d.message.find(needle) != std::string::npos && (line == 0 || d.line == line);
  });
}

inline std::size_t count(const file_result& r, level l) {
  return static_cast<std::size_t>(
      std::count_if(r.findings.begin(), r.findings.end(), [&](const finding& d) { return d.lvl == l; }));
}

inline std::string all_findings(const file_result& r) {
  std::string s;
  for (const auto& d : r.findings) s += format("input.toml", d) + "\n";
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

// What a run of the tool gave.
struct outcome {
  int status = -1;  // the exit status; -1 when a signal ended it
  std::string out, err;
};

inline std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs the executable `exe` in `dir` with `args` (already quoted where needed)
// through the shell; `env_prefix` goes before the executable's name (VAR=value,
// or a command such as `timeout 20`).
inline outcome run_exe(const std::string& exe, const fs::path& dir, const std::string& args,
                       const std::string& env_prefix) {
  static int n = 0;
  fs::path out =
      fs::temp_directory_path() / ("pcm-out-" + std::to_string(::getpid()) + "-" + std::to_string(++n));
  std::string cmd = "cd " + quote(dir.string()) + " && " + env_prefix + " " + quote(exe) + " " + args + " >" +
                    quote(out.string() + ".1") + " 2>" + quote(out.string() + ".2");
  int raw = std::system(cmd.c_str());
  outcome o;
  o.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  o.out = read(out.string() + ".1");
  o.err = read(out.string() + ".2");
  fs::remove(out.string() + ".1");
  fs::remove(out.string() + ".2");
  return o;
}

// Runs the tool ($PRIMECFG_MIGRATE) as run_exe does.
inline outcome tool(const fs::path& dir, const std::string& args, const std::string& env_prefix = "") {
  return run_exe(env("PRIMECFG_MIGRATE"), dir, args, env_prefix);
}

// Runs the tests' build of the tool ($PRIMECFG_MIGRATE_FAULTY, faulty_seams.cpp)
// with its in-place write made to fail at `where` (tools/primecfg-migrate/test_seams.hpp).
inline outcome faulty_tool(const fs::path& dir, const std::string& args, const std::string& where) {
  return run_exe(env("PRIMECFG_MIGRATE_FAULTY"), dir, args,
                 "PRIMECFG_MIGRATE_INJECT_FAILURE=" + quote(where));
}

inline std::size_t entries(const fs::path& dir) {
  return static_cast<std::size_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}

}  // namespace mt
