// The trainer tests' main (CPU and GPU suites): every test writes under one fresh temporary folder
// (TMPDIR points there while they run), removed when they all pass and kept,
// with its path printed, when one fails. A CI disk holds the suite's repeated
// runs (CPU paths, sanitizers) only if each run cleans up after itself.
#define DOCTEST_CONFIG_IMPLEMENT
#include "base/remove_tree.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::string dir = (fs::temp_directory_path() / "primecfg-trainer-tests-XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) {
    std::perror(("mkdtemp " + dir).c_str());
    return 2;
  }
  ::setenv("TMPDIR", dir.c_str(), 1);

  doctest::Context context(argc, argv);
  const int failed = context.run();
  if (context.shouldExit() || failed == 0) {
    std::error_code ec;
    primecfg::train::remove_tree(dir, ec);
  } else {
    std::fprintf(stderr, "the tests' files are kept in %s\n", dir.c_str());
  }
  return failed;
}
