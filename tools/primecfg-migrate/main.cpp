// primecfg-migrate: rewrites configs that still use retired keys.
//
//   primecfg-migrate [options] FILE...
//
// Default: print a unified diff per file that needs migrating. --in-place:
// rewrite the files (atomically, keeping owner, mode and extended attributes;
// files.hpp). --check: exit 1 when any file needs it. Exit 2 on any error or
// bad usage; a file with an error is never written.

#include "diff.hpp"
#include "files.hpp"
#include "migrate.hpp"
#include "steps.hpp"

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

using namespace primecfg::migrate;

namespace {

constexpr const char* usage_text =
    "usage: primecfg-migrate [options] FILE...\n"
    "\n"
    "Rewrites configs that use retired keys (see docs/migration.md). Only the\n"
    "edited lines change; comments and formatting stay as they are.\n"
    "\n"
    "modes (default: print a unified diff of what would change):\n"
    "  -i, --in-place     rewrite the files (temporary file + rename; owner, mode,\n"
    "                     ACLs and extended attributes kept; a read-only or\n"
    "                     hard-linked file is refused)\n"
    "  --check            change nothing; exit 1 when a file needs migrating\n"
    "options:\n"
    "  --as=sft|trainer|rl  validate the result as this config type (default: inferred)\n"
    "  --no-validate      skip validating the migrated text with primecfg\n"
    "  --force            treat a migrated file that fails validation as a warning (and write it)\n"
    "  --fsdp-as=full     migrate fsdp_cpu_offload = true to offload = \"full\" (default: error)\n"
    "  --list-steps       print the migration steps and exit\n"
    "  -h, --help         print this help\n"
    "\n"
    "exit status: 0 nothing to do or done; 1 (--check) a file needs migrating; 2 an error\n";

enum class mode { diff, in_place, check };

struct cli {
  mode m = mode::diff;
  options opts;
  std::optional<root_type> as;
  bool validate = true;
  bool force = false;
  std::vector<std::string> files;
};

[[noreturn]] void usage_error(const std::string& msg) {
  std::cerr << "primecfg-migrate: error: " << msg << "\n(run primecfg-migrate --help for usage)\n";
  std::exit(2);
}

cli parse_args(int argc, char** argv) {
  cli c;
  bool saw_in_place = false, saw_check = false, only_files = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (only_files || a.empty() || a[0] != '-' || a == "-") {
      c.files.push_back(a);
      continue;
    }
    auto value_of = [&](const std::string& name) -> std::optional<std::string> {
      if (a == name) {
        if (i + 1 >= argc) usage_error(name + " needs a value");
        return std::string(argv[++i]);
      }
      if (a.rfind(name + "=", 0) == 0) return a.substr(name.size() + 1);
      return std::nullopt;
    };
    if (a == "--") {
      only_files = true;
    } else if (a == "-h" || a == "--help") {
      std::cout << usage_text;
      std::exit(0);
    } else if (a == "--list-steps") {
      for (const auto& s : all_steps()) std::cout << s.name << ": " << s.summary << "\n";
      std::exit(0);
    } else if (a == "-i" || a == "--in-place") {
      saw_in_place = true;
      c.m = mode::in_place;
    } else if (a == "--check") {
      saw_check = true;
      c.m = mode::check;
    } else if (a == "--force") {
      c.force = true;
    } else if (a == "--no-validate") {
      c.validate = false;
    } else if (auto v = value_of("--as")) {
      c.as = parse_root_type(*v);
      if (!c.as) usage_error("--as must be sft, trainer or rl, not '" + *v + "'");
    } else if (auto v = value_of("--fsdp-as")) {
      if (*v != "full")
        usage_error("--fsdp-as only accepts 'full' (the one mode that replaces FSDP CPU offload)");
      c.opts.fsdp_as_full = true;
    } else {
      usage_error("unknown option '" + a + "'");
    }
  }
  if (saw_in_place && saw_check) usage_error("--in-place and --check cannot be combined");
  if (c.files.empty()) usage_error("no input files");
  return c;
}

void print(const std::string& file, const std::vector<finding>& ds) {
  for (const auto& d : ds) std::cerr << format(file, d) << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  // Past a file size limit (ulimit -f), write() then fails with EFBIG and the
  // tool says so, instead of being killed by SIGXFSZ halfway through.
  std::signal(SIGXFSZ, SIG_IGN);
  cli c = parse_args(argc, argv);
  bool any_error = false, any_needs = false;
  const std::uintmax_t max_bytes = loader_max_bytes();

  for (const std::string& path : c.files) {
    if (c.m == mode::in_place)
      for (const std::string& stale : remove_stale_temporaries(path))
        std::cerr << path << ": note: removed " << stale
                  << ", a temporary file left by an earlier run that was interrupted\n";
    read_result in;
    std::string err;
    if (!read_config(path, max_bytes, in, err)) {
      std::cerr << path << ": error: cannot read the file: " << err << "\n";
      any_error = true;
      continue;
    }
    file_result r = migrate_text(std::move(in.text), c.opts);
    print(path, r.findings);
    if (r.failed()) {
      std::cerr << path << ": error: not migrated, see the errors above\n";
      any_error = true;
      continue;
    }
    if (!r.changed()) continue;
    any_needs = true;

    bool invalid = false;
    if (c.validate) {
      root_type root = c.as ? *c.as : infer_root_type(toml::parse(r.migrated));
      check_result v = validate(path, r.migrated, root);
      if (!v.ok) {
        std::cerr << path << ": " << (c.force ? "warning" : "error")
                  << ": the migrated config is not a valid " << to_string(root) << " config (" << v.errors
                  << " error" << (v.errors == 1 ? "" : "s")
                  << "; line numbers below refer to the migrated text"
                  << (c.as ? "" : "; the type was inferred, --as sets it") << ")\n"
                  << v.report;
        if (!v.report.empty() && v.report.back() != '\n') std::cerr << "\n";
        invalid = !c.force;
        any_error = any_error || invalid;
      }
    }

    switch (c.m) {
      case mode::diff:
        std::cout << unified_diff(path, path, r.original, r.migrated);
        break;
      case mode::check:
        std::cout << path << ": needs migration\n";
        break;
      case mode::in_place:
        if (invalid) {
          std::cerr << path << ": error: not written; --force writes it anyway\n";
        } else if (!write_in_place(path, in.st, r.migrated, err)) {
          std::cerr << path << ": error: not written (the original is unchanged): " << err << "\n";
          any_error = true;
        } else {
          if (!err.empty()) std::cerr << path << ": warning: " << err << "\n";
          std::cerr << path << ": note: migrated in place\n";
        }
        break;
    }
  }
  std::cout.flush();
  if (!std::cout) {
    std::cerr << "primecfg-migrate: error: cannot write to standard output\n";
    return 2;
  }
  if (any_error) return 2;
  if (c.m == mode::check && any_needs) return 1;
  return 0;
}
