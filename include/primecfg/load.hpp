// Loading a config: defaults, then TOML files in order, then overrides.
//
//   primecfg::sources src;
//   src.add_file("base.toml").add_file("overlay.toml").add_override("model.offload", "full");
//   primecfg::loaded<primecfg::SFTConfig> cfg = primecfg::load<primecfg::SFTConfig>(src);
//   if (!cfg.ok()) { std::cerr << primecfg::format_text(cfg.diagnostics, "SFTConfig"); return 1; }
//
// Every source is decoded even after errors, rules run even when fields
// failed, so one run reports everything that is wrong.
//
// The definitions are in detail/load.inl.
#pragma once

#include <primecfg/detail/cxx_version.hpp>  // first: C++20 or later

#include <primecfg/describe.hpp>
#include <primecfg/detail/decode.hpp>
#include <primecfg/detail/header_only.hpp>
#include <primecfg/detail/key_depth.hpp>
#include <primecfg/detail/parse_error.hpp>
#include <primecfg/detail/utf8.hpp>
#include <primecfg/detail/walk.hpp>
#include <primecfg/error.hpp>
#include <primecfg/validate.hpp>

#include <primecfg/detail/toml.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace primecfg {

// Files larger than this are refused before parsing: a config is a few KiB,
// and parsing hundreds of MiB would look like a hang.
inline constexpr std::uintmax_t max_config_bytes = 16u << 20;

// The inputs of a load, lowest precedence first.
class sources {
 public:
  struct layer {
    enum class kind { file, text, override_value };
    kind what;
    std::string name;     // file path, or the name shown for text; the dotted key of an override
    std::string content;  // text, or the override's raw value
    std::string flag;     // how an override was written ("--model.offload")
  };

  // A TOML file, read when the load runs (regular files only, at most max_config_bytes).
  sources& add_file(const std::filesystem::path& path);
  // A TOML document that is not a file (an embedded default, a test string).
  sources& add_text(std::string name, std::string toml_text);
  // One value by dotted key; raw text, read according to the field's type.
  // `flag` is how it was written, for messages (default "--" + dotted_key).
  sources& add_override(std::string dotted_key, std::string raw_value, std::string flag = {});

  // Every source added, in order.
  const std::vector<layer>& layers() const noexcept { return layers_; }

 private:
  std::vector<layer> layers_;
};

// The result of a load: the config, where each value came from, and every problem found.
template <class T>
struct loaded {
  T value{};
  provenance_map provenance;  // dotted path -> where its value came from (absent: default)
  std::vector<diagnostic> diagnostics;
  // load_command_line: `--help` or `-h` was given (print help_text<T>() and
  // stop; the request is also an error, for programs that do not look here).
  bool help_requested = false;

  // How many of the diagnostics are errors (not warnings or notes).
  std::size_t error_count() const;
  // No errors: the config can be used.
  bool ok() const { return error_count() == 0; }

  // Where the value at a dotted path came from.
  primecfg::provenance source_of(std::string_view path) const;
};

// Defaults, then every source in order; all problems end up in diagnostics.
template <class T>
loaded<T> load(const sources& src);

}  // namespace primecfg

#include <primecfg/detail/load.inl>
