// Runs the migration steps over one config text. No file access here: the
// command line tool (main.cpp) reads, prints and writes; tests call this.
#pragma once

#include "step.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace primecfg::migrate {

struct file_result {
  std::string original;
  std::string migrated;  // == original when nothing applies or on error
  std::vector<finding> findings;
  std::vector<std::string_view> applied;  // names of the steps that changed something

  bool changed() const { return migrated != original; }
  bool failed() const;
};

// Applies every step of `steps` (default: all of migrations/, in order) to
// `text`. On any error the result keeps the original text; a result larger
// than loader_max_bytes() is an error.
file_result migrate_text(std::string text, const options& opts);
file_result migrate_text(std::string text, const options& opts, const std::vector<step>& steps);

// "file:line: level: message" (or "file: level: message" without a line).
std::string format(std::string_view file, const finding& d);

// --- Validation of the result with the primecfg library -------------------

enum class root_type { sft, trainer, rl };
std::string_view to_string(root_type r);
std::optional<root_type> parse_root_type(std::string_view s);

// [trainer] or [orchestrator] -> rl; a [data] table of type "fake"/"sft" or
// with seq_len -> sft; [data.fake] or model.seq_len -> trainer; else sft.
root_type infer_root_type(const toml::table& root);

// What the library said of a migrated text (not primecfg::validation, the
// object a config's rules are handed).
struct check_result {
  bool ok = true;
  std::size_t errors = 0;
  std::string report;  // the library's compiler-style lines and summary
};

// Loads `text` as `root` with the library.
check_result validate(std::string_view name, const std::string& text, root_type root);

// The largest config file the library loads (primecfg::max_config_bytes).
std::uintmax_t loader_max_bytes();

}  // namespace primecfg::migrate
