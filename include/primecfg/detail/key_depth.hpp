// A guard run on TOML text before toml++ sees it: how deeply its keys nest.
//
// toml++ limits nested values (arrays, inline tables) to 256 levels but not
// dotted keys: `[a.a.a.(...)]` or `a.a.a.(...) = 1` with a few hundred
// thousand segments, which fits in a 16 MiB file, overflows the stack inside
// toml++ (update_region_ends recurses once per level) and in anything that
// walks the tree afterwards. Such a document is refused before it is parsed.
//
// The scan needs no parse. Outside strings and comments, a dotted key is a
// run of key characters, blanks, quoted segments and dots that ends at '='
// (a key) or at ']' (a table header). A value never puts more than one dot in
// a run (1.5, 07:32:00.5), so runs ending elsewhere are ignored, and so are
// runs with a single dot ending at ']' (`[1.5]` inside an array), which
// undercounts a two-part header by one level. A key's depth is the depth of
// its table (the last header, or the inline table it is written in) plus its
// own parts. Arrays add levels that toml++ already limits.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>
#include <vector>

namespace primecfg::detail {

inline constexpr std::size_t max_key_depth = 256;

struct deep_key {
  std::size_t line = 0;   // 1-based line of the key that passes the limit
  std::size_t depth = 0;  // its depth, in tables
};

// The first key that nests deeper than `limit` tables, if any.
inline std::optional<deep_key> find_deep_key(std::string_view text, std::size_t limit = max_key_depth) {
  std::size_t line = 1;
  std::size_t run_dots = 0;      // dots in the current run
  std::size_t header_depth = 0;  // depth of the table the last header opened
  std::size_t base = 0;          // depth of the table keys are being written into
  std::size_t value_depth = 0;   // depth of the table an inline table after the last '=' would open
  std::vector<std::size_t> inline_bases;
  bool line_start = true;  // only blanks so far on this line
  auto is_run_char = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == ' ' || c == '\t';
  };
  // From an opening quote to one past the closing one; stops at the end of
  // the line for an unterminated one-line string (the parser reports it).
  auto skip_string = [&](std::size_t i) {
    char q = text[i];
    std::string_view triple = q == '"' ? "\"\"\"" : "'''";
    bool multi = text.substr(i, 3) == triple;
    std::size_t j = i + (multi ? 3 : 1);
    while (j < text.size()) {
      char c = text[j];
      if (c == '\\' && q == '"') {
        if (j + 1 < text.size() && text[j + 1] == '\n') ++line;
        j += 2;
        continue;
      }
      if (c == '\n') {
        if (!multi) return j;
        ++line;
      }
      if (c == q && (!multi || text.substr(j, 3) == triple)) return j + (multi ? 3 : 1);
      ++j;
    }
    return j;
  };
  for (std::size_t i = 0; i < text.size();) {
    char c = text[i];
    if (c == '"' || c == '\'') {
      line_start = false;
      i = skip_string(i);
      continue;
    }
    if (c == '.') {
      line_start = false;
      ++run_dots;
      ++i;
      continue;
    }
    if (is_run_char(c)) {
      line_start = line_start && (c == ' ' || c == '\t');
      ++i;
      continue;
    }
    if (c == '=') {
      // `a.b.c = v` puts v in table base + 2 (a and a.b are tables).
      value_depth = base + run_dots + 1;
      if (value_depth > limit) return deep_key{line, value_depth};
    } else if (c == ']' && run_dots > 1 && inline_bases.empty()) {
      header_depth = run_dots + 1;
      if (header_depth > limit) return deep_key{line, header_depth};
      base = header_depth;
    } else if (c == '{') {
      inline_bases.push_back(base);
      base = value_depth;
    } else if (c == '}' && !inline_bases.empty()) {
      base = inline_bases.back();
      inline_bases.pop_back();
    } else if (c == '[' && line_start && inline_bases.empty()) {
      base = 0;  // a header at the start of a line: its own dots decide, at ']'
    }
    run_dots = 0;
    line_start = c == '\n';
    if (c == '#') {
      while (i < text.size() && text[i] != '\n') ++i;
      continue;
    }
    if (c == '\n') {
      ++line;
      if (!inline_bases.empty()) {  // inline tables end on their line; an unclosed one is a syntax error
        base = inline_bases.front();
        inline_bases.clear();
      }
    }
    ++i;
  }
  return std::nullopt;
}

}  // namespace primecfg::detail
