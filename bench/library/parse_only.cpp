// The baseline: a bare toml++ parse of the same file, no primecfg.
#include <toml++/toml.h>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  try {
    toml::table t = toml::parse_file(argv[1]);
    return t.empty() ? 1 : 0;
  } catch (const toml::parse_error& e) {
    std::fputs(e.what(), stderr);
    return 1;
  }
}
