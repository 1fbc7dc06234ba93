// The translation unit the compile-time figure is about: the whole config
// tree, loading from files and the command line, and the error report.
#include <primecfg/cli.hpp>
#include <primecfg/report.hpp>
#include <primecfg/sft.hpp>

#include <cstdio>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  auto cfg = primecfg::load_command_line<primecfg::SFTConfig>(args);
  std::fputs(primecfg::format_text(cfg.diagnostics, "SFTConfig").c_str(), stderr);
  return cfg.ok() ? 0 : 1;
}
