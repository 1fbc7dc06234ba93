// The compiled part of primecfg, for programs built with
// PRIMECFG_HEADER_ONLY=0 (see include/primecfg/detail/header_only.hpp): the
// loader, the command-line parser and the error report, plus toml++'s parser
// (TOML_HEADER_ONLY=0 in those programs too).
#define PRIMECFG_IMPLEMENTATION
#define TOML_IMPLEMENTATION

#include <primecfg/cli.hpp>
#include <primecfg/load.hpp>
#include <primecfg/report.hpp>
