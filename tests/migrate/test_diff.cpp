// The unified diff printed by default.
#include "diff.hpp"

#include <doctest/doctest.h>

using primecfg::migrate::unified_diff;

TEST_CASE("diff: equal texts give nothing") { CHECK(unified_diff("a", "b", "x\ny\n", "x\ny\n").empty()); }

TEST_CASE("diff: one changed line with three lines of context") {
  const std::string a = "1\n2\n3\n4\n5\n6\n7\n8\n9\n";
  const std::string b = "1\n2\n3\n4\nfive\n6\n7\n8\n9\n";
  CHECK(unified_diff("f.toml", "f.toml", a, b) ==
        "--- f.toml\n+++ f.toml\n"
        "@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n");
}

TEST_CASE("diff: distant changes make separate hunks, close ones merge") {
  std::string a, b;
  for (int i = 1; i <= 20; ++i) {
    a += std::to_string(i) + "\n";
    b += (i == 2 || i == 18) ? "x\n" : std::to_string(i) + "\n";
  }
  std::string d = unified_diff("a", "b", a, b);
  CHECK(d.find("@@ -1,5 +1,5 @@\n 1\n-2\n+x\n 3\n 4\n 5\n") != std::string::npos);
  CHECK(d.find("@@ -15,6 +15,6 @@\n 15\n 16\n 17\n-18\n+x\n 19\n 20\n") != std::string::npos);
  std::string c = "1\n2\n3\n4\n5\n6\n7\n8\n";
  std::string e = "1\nx\n3\n4\n5\n6\ny\n8\n";
  CHECK(unified_diff("a", "b", c, e) ==
        "--- a\n+++ b\n@@ -1,8 +1,8 @@\n 1\n-2\n+x\n 3\n 4\n 5\n 6\n-7\n+y\n 8\n");
}

TEST_CASE("diff: pure insertion and deletion ranges") {
  CHECK(unified_diff("a", "b", "1\n", "1\n2\n") == "--- a\n+++ b\n@@ -1 +1,2 @@\n 1\n+2\n");
  CHECK(unified_diff("a", "b", "1\n2\n", "2\n") == "--- a\n+++ b\n@@ -1,2 +1 @@\n-1\n 2\n");
  CHECK(unified_diff("a", "b", "", "x\n") == "--- a\n+++ b\n@@ -0,0 +1 @@\n+x\n");
}

TEST_CASE("diff: a last line without newline is marked") {
  CHECK(unified_diff("a", "b", "k = 1", "k = 2") ==
        "--- a\n+++ b\n@@ -1 +1 @@\n-k = 1\n\\ No newline at end of file\n+k = 2\n\\ No newline at end of "
        "file\n");
}

TEST_CASE("diff: CRLF lines are printed as they are") {
  CHECK(unified_diff("a", "b", "x\r\ny\r\n", "x\r\nz\r\n") ==
        "--- a\n+++ b\n@@ -1,2 +1,2 @@\n x\r\n-y\r\n+z\r\n");
}
