// What a migration step is, and the building blocks steps are written with.
//
// A step looks at one document (its text map and its parsed toml++ tree),
// reports what it finds, and records edits in a plan. Steps never see files;
// the driver runs them in version order, each on the text the previous one
// produced, so a step only has to handle configs that are current up to the
// step before it.
#pragma once

#include "document.hpp"
#include "plan.hpp"

#include <primecfg/detail/toml.hpp>

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace primecfg::migrate {

enum class level { error, warning, note };

// What a step (or the driver) found in a file: an error, a warning or a note at
// a line. (The library's own report is primecfg::diagnostic; this is not that.)
struct finding {
  level lvl = level::note;
  std::size_t line = 0;  // 1-based; 0 when the message is about the whole file
  std::string message;
  std::size_t column = 0;  // 1-based, in characters; 0 when not known
};

std::string_view to_string(level l);

struct options {
  bool fsdp_as_full = false;  // --fsdp-as=full
};

struct context {
  const document& doc;
  const toml::table& root;
  const options& opts;
  plan& edits;
  std::vector<finding>& findings;

  // `line0` is 0-based, as everywhere in document.
  void error(std::size_t line0, std::string msg) {
    findings.push_back({level::error, line0 + 1, std::move(msg)});
  }
  void warning(std::size_t line0, std::string msg) {
    findings.push_back({level::warning, line0 + 1, std::move(msg)});
  }
  void note(std::size_t line0, std::string msg) {
    findings.push_back({level::note, line0 + 1, std::move(msg)});
  }
};

struct step {
  int version = 0;
  std::string_view name;     // file name stem under migrations/, e.g. "0001_offload_to_single_field"
  std::string_view summary;  // one line, shown by --list-steps
  std::function<void(context&)> run;
};

// ---------------------------------------------------------------------------
// Building blocks.

// Where prime-rl configs keep a ModelConfig: [model] (SFTConfig, TrainerConfig)
// and [trainer.model] (RLConfig).
const std::vector<path_t>& model_tables();

// The toml++ node at `path`, or nullptr.
const toml::node* node_at(const toml::table& root, const path_t& path);

// One place in the text that writes something at or below a path.
struct occurrence {
  enum class kind { header, key_value, inline_entry };
  kind what = kind::key_value;
  int header_index = -1;          // kind::header
  const key_value* kv = nullptr;  // kind::key_value and kind::inline_entry
  std::size_t begin = 0;          // source order
  std::size_t line = 0;           // 0-based
  const path_t& path(const document& d) const {
    return what == kind::header ? d.headers()[header_index].path : kv->path;
  }
};

// Everything written at or below `p`: table headers ([p], [p.x]), key/value
// pairs (`k = ...`, dotted `p.k = ...`, `k.sub = ...`) and entries of inline
// tables, in source order. Pairs inside a table whose header is itself listed
// are not listed again (they go with their header).
std::vector<occurrence> find_under(const document& d, const path_t& p);

// Lines [first, last] that a table header owns: the header, its pairs and the
// comments among them; not the blank lines and comments that lead into the
// next header.
std::pair<std::size_t, std::size_t> header_region(const document& d, int header_index);

// Removes an occurrence from the text: a header with its whole region, a pair
// with its line(s), an inline entry with its separator.
void remove(const document& d, plan& edits, const occurrence& o);

// Replaces a pair or inline entry found below table `table` by
// `<same key prefix><key> = <value_text>`, keeping its indentation, the
// spacing around '=', and a trailing comment.
void replace_with_key(const document& d, plan& edits, const occurrence& o, const path_t& table,
                      std::string_view key, std::string_view value_text);

// Adds `key = value_text` to table `table` when no pair can be replaced in
// place: at the end of the table's own pairs when it has a [table] header or
// is written with dotted keys, else in place of `subtable_header` (an
// occurrence being removed), which then becomes the [table] header. Returns
// true in that last case: the caller must not remove `subtable_header` then.
bool add_key(const document& d, plan& edits, const path_t& table, std::string_view key,
             std::string_view value_text, const occurrence& subtable_header);

// A declarative rename of `from` to `to` inside each of `tables` (every
// spelling: headers, dotted keys, inline tables). Reports an error when both
// are present.
struct key_rename {
  std::vector<path_t> tables;
  std::string from;
  std::string to;
  std::string why;  // appended to the note, e.g. "see docs/migration.md"
};
void apply_rename(context& ctx, const key_rename& r);

// A step made only of renames: what the next simple migration looks like.
step rename_step(int version, std::string_view name, std::string_view summary,
                 std::vector<key_rename> renames);

}  // namespace primecfg::migrate
