// Fuzz target: a TOML document loaded as SFTConfig and as RLConfig, with a few
// command-line arguments taken from the same input.
//
// Input layout: the document, then optionally a NUL byte and up to eight
// NUL-separated command-line arguments ("--model.offload=full", "--no-clean",
// ...). A plain TOML file is a valid input with no arguments, so the seed
// corpus is simply config files.
//
// Properties checked, beyond "no crash, no sanitizer report":
//  - every diagnostic has a message, and both report formats can be produced;
//  - a config that loads without errors dumps to TOML that loads again,
//    without errors, to an equal config (SPEC 1.2), and dumps to JSON.
#include "fuzz_check.hpp"

#include <primecfg/cli.hpp>
#include <primecfg/detail/equal.hpp>
#include <primecfg/dump.hpp>
#include <primecfg/load.hpp>
#include <primecfg/report.hpp>
#include <primecfg/rl.hpp>
#include <primecfg/sft.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr std::size_t max_arguments = 8;

struct fuzz_input {
  std::string document;
  std::vector<std::string> arguments;
};

fuzz_input split(std::string_view data) {
  fuzz_input in;
  std::size_t nul = data.find('\0');
  in.document = std::string(data.substr(0, nul));
  if (nul == std::string_view::npos) return in;
  std::string_view rest = data.substr(nul + 1);
  while (in.arguments.size() < max_arguments) {
    std::size_t end = rest.find('\0');
    std::string arg(rest.substr(0, end));
    // `@ FILE` would read whatever path the fuzzer makes up (/dev/zero...):
    // every file argument names one missing file instead, which still runs
    // the missing-file path.
    if (!arg.empty() && arg[0] == '@') arg = "@/nonexistent-primecfg-fuzz/missing.toml";
    in.arguments.push_back(std::move(arg));
    if (end == std::string_view::npos) break;
    rest = rest.substr(end + 1);
  }
  return in;
}

template <class T>
void check_reports(const primecfg::loaded<T>& cfg, std::string_view root_name) {
  for (const primecfg::diagnostic& d : cfg.diagnostics)
    primecfg::fuzz::check(!d.message.empty(), "a diagnostic without a message",
                          primecfg::format_diagnostic(d));
  std::string text = primecfg::format_text(cfg.diagnostics, root_name);
  std::string json = primecfg::format_json(cfg.diagnostics);
  primecfg::fuzz::check(cfg.ok() || !text.empty(), "errors but an empty text report");
  primecfg::fuzz::check(!json.empty() && json[0] == '[', "the JSON report is not an array", json);
}

template <class T>
void load_as(const fuzz_input& in, std::string_view root_name) {
  primecfg::sources base;
  base.add_text("fuzz.toml", in.document);
  primecfg::loaded<T> cfg = primecfg::load_command_line<T>(in.arguments, base);
  check_reports(cfg, root_name);
  if (!cfg.ok()) return;

  std::string dumped = primecfg::dump_toml(cfg.value, cfg.provenance);
  primecfg::sources again;
  again.add_text("dump.toml", dumped);
  primecfg::loaded<T> reread = primecfg::load<T>(again);
  if (!reread.ok())
    primecfg::fuzz::fail("the dump of a valid config does not load",
                         dumped + "\n--- errors:\n" + primecfg::format_text(reread.diagnostics, root_name));
  primecfg::fuzz::check(primecfg::detail::deep_equal(cfg.value, reread.value),
                        "the dump of a valid config loads to a different config", dumped);
  std::string json = primecfg::dump_json(cfg.value);
  primecfg::fuzz::check(!json.empty() && json[0] == '{', "the JSON dump is not an object", json);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz_input in = split(std::string_view(reinterpret_cast<const char*>(data), size));
  load_as<primecfg::SFTConfig>(in, "SFTConfig");
  load_as<primecfg::RLConfig>(in, "RLConfig");
  return 0;
}
