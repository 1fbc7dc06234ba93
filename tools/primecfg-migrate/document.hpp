// A byte-exact map of a TOML document's statements: where every table header
// and every key/value pair starts and ends, where each segment of a dotted key
// lies, and what each line is (blank, comment, code, or the continuation of a
// multi-line value). Migrations edit the original text through these spans and
// never re-serialize the document.
//
// The scanner assumes the text already parsed with toml++ (the driver parses
// first), so it only needs to find boundaries, not to diagnose bad input.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace primecfg::migrate {

using path_t = std::vector<std::string>;

// Renders a path as a dotted key, quoting segments that are not bare keys.
std::string dotted(const path_t& path);

// True when `prefix` is a (not necessarily proper) prefix of `path`.
bool starts_with(const path_t& path, const path_t& prefix);

struct key_segment {
  std::string name;     // decoded
  std::size_t begin{};  // first byte of the segment as written (a quote for quoted keys)
  std::size_t end{};    // one past its last byte
};

struct key_value {
  std::vector<key_segment> key;  // as written, relative to its container
  path_t path;                   // absolute: container path + key
  std::size_t key_begin{}, key_end{};
  std::size_t value_begin{}, value_end{};
  bool inline_table = false;        // the value is `{ ... }`
  std::vector<key_value> entries;   // the inline table's pairs, in order
  int header = -1;                  // index of the owning header (-1: the root table)
  bool in_array_of_tables = false;  // somewhere below a [[...]] header
};

struct header {
  std::vector<key_segment> key;
  path_t path;
  bool array = false;               // [[...]]
  bool in_array_of_tables = false;  // itself [[...]] or below one
  std::size_t begin{}, end{};       // from '[' to one past the closing ']'
  std::size_t line{};
};

enum class line_kind { blank, comment, code, continuation };

struct line_info {
  std::size_t begin{};        // first byte
  std::size_t content_end{};  // the end-of-line sequence starts here
  std::size_t end{};          // one past the end-of-line sequence (== content_end on a last line without one)
  line_kind kind = line_kind::code;
};

class document {
 public:
  explicit document(std::string text);

  const std::string& text() const { return text_; }
  const std::vector<line_info>& lines() const { return lines_; }
  const std::vector<header>& headers() const { return headers_; }
  const std::vector<key_value>& key_values() const { return key_values_; }

  // 0-based line holding byte `offset`.
  std::size_t line_of(std::size_t offset) const;
  std::string_view line_text(std::size_t line) const;  // without its end-of-line sequence
  std::string_view eol_of(std::size_t line) const;     // "\n", "\r\n" or ""
  // The end-of-line sequence the file uses ("\n" when it has none).
  std::string_view preferred_eol() const;
  bool has_final_newline() const;
  std::string_view slice(std::size_t begin, std::size_t end) const {
    return std::string_view(text_).substr(begin, end - begin);
  }

  // The first line of the next header after header `h` (or the line count).
  std::size_t section_end_line(int h) const;

 private:
  std::string text_;
  std::vector<line_info> lines_;
  std::vector<header> headers_;
  std::vector<key_value> key_values_;
};

}  // namespace primecfg::migrate
