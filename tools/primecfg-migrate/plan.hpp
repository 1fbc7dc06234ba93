// The edits one migration step wants to make to a document, collected first
// and applied together: whole lines removed, byte spans replaced, lines
// inserted, and entries of inline tables removed or replaced. Applying them
// touches nothing else, so every byte outside the edited lines survives.
#pragma once

#include "document.hpp"

#include <cstddef>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace primecfg::migrate {

// A bug in a migration step (overlapping edits, a span it cannot place):
// reported as an error for the file, which is then left alone.
struct internal_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class plan {
 public:
  explicit plan(const document& doc) : doc_(&doc), deleted_(doc.lines().size(), false) {}

  // Removes lines first..last (0-based, inclusive) with their line endings.
  void delete_lines(std::size_t first, std::size_t last);
  // Replaces the bytes [begin, end) by `text`.
  void replace(std::size_t begin, std::size_t end, std::string text);
  // Adds a line after `line`; `content` carries its indentation but no line ending.
  void insert_after(std::size_t line, std::string content);
  // Edits of one entry of an inline table (`entry` points into the document).
  void remove_entry(const key_value& entry) { entry_edits_[&entry] = std::nullopt; }
  void replace_entry(const key_value& entry, std::string text) { entry_edits_[&entry] = std::move(text); }

  bool line_deleted(std::size_t line) const { return deleted_.at(line); }
  bool empty() const;

  // The edited text. Blank lines left doubled by a removal are collapsed, and
  // a file without a final newline keeps lacking one.
  std::string apply() const;

 private:
  struct span {
    std::size_t begin, end;
    std::string text;
  };
  std::string render_inline(const key_value& kv) const;
  bool has_entry_edits(const key_value& kv) const;

  const document* doc_;
  std::vector<bool> deleted_;
  std::vector<span> spans_;
  std::multimap<std::size_t, std::string> inserts_;
  std::map<const key_value*, std::optional<std::string>> entry_edits_;
};

}  // namespace primecfg::migrate
