// primecfg: validate, dump and describe configs without a trainer.
//
//   primecfg validate [--as sft|trainer|rl] FILE... [--model.offload=full ...] [--errors=json]
//   primecfg dump     [--as ...] FILE... [--format=toml|json]
//   primecfg schema   [--as ...] [--out-dir DIR]
//   primecfg help     [--as ...]
#include <primecfg/cli.hpp>
#include <primecfg/dump.hpp>
#include <primecfg/help.hpp>
#include <primecfg/report.hpp>
#include <primecfg/rl.hpp>
#include <primecfg/schema.hpp>
#include <primecfg/sft.hpp>
#include <primecfg/trainer.hpp>

#include <fmt/format.h>
#include <primecfg/detail/toml.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

namespace {

constexpr int exit_ok = 0;
constexpr int exit_invalid = 1;
constexpr int exit_usage = 2;

constexpr const char* usage = R"(usage: primecfg COMMAND [options] [FILE...] [--section.key=value ...]

commands:
  validate   check configs; exit 0 valid, 1 invalid, 2 usage, unreadable file or failed write
  dump       print the resolved config as TOML (with each value's source) or JSON
  schema     print the JSON Schema, or write all of them with --out-dir DIR
  help       list every field of a config type with its description and default
  reference  print the Markdown reference of every config type (docs/config-reference.md)

options:
  --as sft|trainer|rl   root type (default: inferred; [trainer] or [orchestrator] means rl,
                        [data.fake] or model.seq_len means trainer, otherwise sft)
  --errors=text|json    how validate and dump report problems (default: text)
  --format=toml|json    what dump prints (default: toml)
  --out-dir DIR         where schema writes sft/trainer/rl.schema.json

Files are read in order (later files override earlier ones; tables merge), then the
--section.key overrides; `@ FILE` works too.
)";

enum class root_type { sft, trainer, rl };

struct options {
  std::string command;
  std::optional<root_type> as;
  bool json_errors = false;
  bool json_output = false;
  std::string out_dir;
  std::vector<std::string> config_args;  // files, @ files and overrides, in order
};

std::optional<root_type> parse_root(std::string_view s) {
  if (s == "sft") return root_type::sft;
  if (s == "trainer") return root_type::trainer;
  if (s == "rl") return root_type::rl;
  return std::nullopt;
}

// Tool options are taken out; everything else is config input.
bool parse_options(int argc, char** argv, options& opt, std::string& error) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    error = "missing COMMAND";
    return false;
  }
  opt.command = args[0];
  if (opt.command == "--help" || opt.command == "-h") opt.command = "usage";
  for (std::size_t i = 1; i < args.size(); ++i) {
    std::string a = args[i];
    auto value_of = [&](std::string_view name) -> std::optional<std::string> {
      if (a == name) {
        if (i + 1 < args.size()) return args[++i];
        error = fmt::format("{} needs a value", name);
        return std::nullopt;
      }
      if (a.rfind(std::string(name) + "=", 0) == 0) return a.substr(name.size() + 1);
      return std::nullopt;
    };
    if (a == "--as" || a.rfind("--as=", 0) == 0) {
      auto v = value_of("--as");
      if (!v) return false;
      opt.as = parse_root(*v);
      if (!opt.as) {
        error = fmt::format("--as takes sft, trainer or rl, not '{}'", *v);
        return false;
      }
    } else if (a == "--errors" || a.rfind("--errors=", 0) == 0) {
      auto v = value_of("--errors");
      if (!v) return false;
      if (*v != "json" && *v != "text") {
        error = fmt::format("--errors takes text or json, not '{}'", *v);
        return false;
      }
      opt.json_errors = *v == "json";
    } else if (a == "--format" || a.rfind("--format=", 0) == 0) {
      auto v = value_of("--format");
      if (!v) return false;
      if (*v != "json" && *v != "toml") {
        error = fmt::format("--format takes toml or json, not '{}'", *v);
        return false;
      }
      opt.json_output = *v == "json";
    } else if (a == "--out-dir" || a.rfind("--out-dir=", 0) == 0) {
      auto v = value_of("--out-dir");
      if (!v) return false;
      opt.out_dir = *v;
    } else if (a == "--help" || a == "-h") {
      opt.command = "help";
    } else {
      opt.config_args.push_back(a);
    }
  }
  return true;
}

// The root type a file is written for, judged by its top-level tables.
root_type infer_root(const std::vector<std::string>& files) {
  for (const std::string& f : files) {
    // Through the loader's reader and depth guard: a file the loader refuses
    // (too big, endless, nested too deep) is not parsed here either.
    std::string text, why;
    if (!primecfg::detail::read_config_file(f, text, why) || primecfg::detail::find_deep_key(text)) continue;
    try {
      toml::table doc = toml::parse(text, f);
      if (doc.contains("trainer") || doc.contains("orchestrator")) return root_type::rl;
      if (doc["data"]["fake"].is_table() || doc["model"]["seq_len"]) return root_type::trainer;
    } catch (const std::exception&) {
      // Unreadable or invalid: the loader reports it properly.
    }
  }
  return root_type::sft;
}

template <class T>
int run_command(const options& opt, std::string_view root_name) {
  if (opt.command == "help") {
    fmt::print("{}\nfields of {}:\n{}", usage, root_name, primecfg::help_text<T>());
    return exit_ok;
  }
  if (opt.command == "schema") {
    fmt::print("{}", primecfg::json_schema<T>());
    return exit_ok;
  }
  primecfg::sources src;
  std::vector<primecfg::diagnostic> flag_errors;
  primecfg::parse_command_line<T>(opt.config_args, src, flag_errors, /*bare_arguments_are_files=*/true);
  primecfg::loaded<T> cfg = primecfg::load<T>(src);
  cfg.diagnostics.insert(cfg.diagnostics.begin(), flag_errors.begin(), flag_errors.end());

  bool unreadable = false;
  for (const auto& d : cfg.diagnostics) unreadable = unreadable || d.kind == primecfg::error_kind::file_error;
  // Machine output goes to stdout (`primecfg validate f --errors=json | jq`):
  // the JSON report of validate, and of a dump that fails (then it is all
  // stdout holds). A dump that succeeds owns stdout, so its notes and
  // warnings go to stderr. Text reports are diagnostics: stderr.
  bool report_on_stdout = opt.json_errors && (opt.command == "validate" || unreadable || !cfg.ok());
  if (opt.json_errors) {
    fmt::print(report_on_stdout ? stdout : stderr, "{}", primecfg::format_json(cfg.diagnostics));
    // A failure still says so where people look.
    if (report_on_stdout && cfg.error_count() > 0)
      fmt::print(stderr, "{} error{} in {} (the JSON report is on standard output)\n", cfg.error_count(),
                 cfg.error_count() == 1 ? "" : "s", root_name);
  } else
    fmt::print(stderr, "{}", primecfg::format_text(cfg.diagnostics, root_name));
  if (unreadable) return exit_usage;
  if (!cfg.ok()) return exit_invalid;

  if (opt.command == "validate") {
    if (!opt.json_errors) fmt::print("ok: valid {}\n", root_name);
  } else {
    fmt::print("{}", opt.json_output ? primecfg::dump_json(cfg.value)
                                     : primecfg::dump_toml(cfg.value, cfg.provenance));
  }
  return exit_ok;
}

// Each schema goes to a temporary beside it, renamed over it once written.
// A failure names the folder and the schema, not the temporary.
int write_schemas(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    fmt::print(stderr, "primecfg: error: --out-dir {}: {}\n", dir, ec ? ec.message() : "not a directory");
    return exit_usage;
  }
  auto write = [&](const std::string& name, const std::string& text) {
    std::filesystem::path target = std::filesystem::path(dir) / name;
    std::filesystem::path tmp = target;
    tmp += ".tmp";
    errno = 0;
    std::ofstream out(tmp, std::ios::binary);
    out << text;
    out.close();  // a full disk shows up here, not before
    if (!out) {
      fmt::print(stderr, "primecfg: error: cannot write {} in {}: {}\n", name, dir,
                 errno ? std::strerror(errno) : "write failed");
      std::filesystem::remove(tmp, ec);
      return false;
    }
    std::filesystem::rename(tmp, target, ec);
    if (ec) {
      fmt::print(stderr, "primecfg: error: cannot write {} in {}: {}\n", name, dir, ec.message());
      std::filesystem::remove(tmp, ec);
      return false;
    }
    return true;
  };
  bool ok = write("sft.schema.json", primecfg::json_schema<primecfg::SFTConfig>()) &&
            write("trainer.schema.json", primecfg::json_schema<primecfg::TrainerConfig>()) &&
            write("rl.schema.json", primecfg::json_schema<primecfg::RLConfig>());
  return ok ? exit_ok : exit_usage;
}

int run(int argc, char** argv) {
  options opt;
  std::string error;
  if (!parse_options(argc, argv, opt, error)) {
    fmt::print(stderr, "primecfg: error: {}\n\n{}", error, usage);
    return exit_usage;
  }
  if (opt.command == "usage") {  // primecfg --help, primecfg -h
    fmt::print("{}", usage);
    return exit_ok;
  }
  if (opt.command == "reference") {
    fmt::print(
        "# Config reference\n\nGenerated by `primecfg reference` from the descriptions in "
        "`include/primecfg/` "
        "(`ninja -C build docs` rewrites it; a test fails when it is stale). TOML has no null: the string "
        "`\"None\"` clears an optional value.\n\n## SFTConfig (`primecfg-train`, `--as sft`)\n{}\n"
        "## TrainerConfig (`--as trainer`)\n{}\n## RLConfig (`--as rl`)\n{}",
        primecfg::markdown_reference<primecfg::SFTConfig>(),
        primecfg::markdown_reference<primecfg::TrainerConfig>(),
        primecfg::markdown_reference<primecfg::RLConfig>());
    return exit_ok;
  }
  if (opt.command != "validate" && opt.command != "dump" && opt.command != "schema" &&
      opt.command != "help") {
    fmt::print(stderr, "primecfg: error: unknown command '{}'\n\n{}", opt.command, usage);
    return exit_usage;
  }
  if (opt.command == "schema" && !opt.out_dir.empty()) return write_schemas(opt.out_dir);
  if ((opt.command == "validate" || opt.command == "dump") && opt.config_args.empty()) {
    fmt::print(stderr, "primecfg: error: {} needs at least one FILE\n", opt.command);
    return exit_usage;
  }

  root_type root = opt.as ? *opt.as : root_type::sft;
  if (!opt.as && (opt.command == "validate" || opt.command == "dump")) {
    std::vector<std::string> files;
    for (const std::string& a : opt.config_args)
      if (a.rfind("--", 0) != 0 && a != "@") files.push_back(a[0] == '@' ? a.substr(1) : a);
    root = infer_root(files);
  }
  switch (root) {
    case root_type::sft:
      return run_command<primecfg::SFTConfig>(opt, "SFTConfig");
    case root_type::trainer:
      return run_command<primecfg::TrainerConfig>(opt, "TrainerConfig");
    case root_type::rl:
      break;
  }
  return run_command<primecfg::RLConfig>(opt, "RLConfig");
}

}  // namespace

// Whatever primecfg prints must arrive: a write error on standard output
// (a full disk, a closed pipe, /dev/full) is an error and exit 2, never an
// abort (fmt throws on a failed write) and never a silent 0 (stdio keeps
// output in its buffer until exit, when a failure can no longer be seen).
int main(int argc, char** argv) {
  int code = exit_usage;
  std::string failure;
  try {
    code = run(argc, argv);
  } catch (const std::system_error& e) {  // fmt's failed writes
    failure = e.what();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "primecfg: error: %s\n", e.what());
    return exit_usage;
  }
  if (failure.empty() && (std::fflush(stdout) != 0 || std::ferror(stdout)))
    failure = std::strerror(errno ? errno : EIO);
  if (failure.empty()) return code;
  std::fprintf(stderr, "primecfg: error: cannot write to standard output: %s\n", failure.c_str());
  return exit_usage;
}
