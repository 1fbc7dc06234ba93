// toml++'s parse errors as primecfg reports them.
//
// toml++ 3.3 (Debian 12's) garbles the key in its "cannot redefine existing
// ..." error when the key is quoted: `name = "a"` then `"name" = "b"` gives
// `cannot redefine existing string '"naname" '` (marzer/tomlplusplus#300: the
// text it records for diagnostics takes the key's characters twice), and
// places it at the value, not at the key. The key as written is taken from the
// text instead: from the error's position back over the whitespace, the '='
// and the key (bare, quoted or dotted), which then gives the position too.
// Used by the loader (detail/load.inl) and primecfg-migrate.
#pragma once

#include <primecfg/detail/toml.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace primecfg::detail {

struct toml_error_report {
  std::string message;  // toml++'s description, repaired where it is known to be wrong
  std::uint32_t line = 0, column = 0;
};

// The byte offset of 1-based `line` and code-point `column` in `text`, or npos.
inline std::size_t offset_of(std::string_view text, std::uint32_t line, std::uint32_t column) {
  std::size_t at = 0;
  for (std::uint32_t l = 1; l < line; ++l) {
    at = text.find('\n', at);
    if (at == std::string_view::npos) return at;
    ++at;
  }
  for (std::uint32_t c = 1; c < column; ++c) {
    if (at >= text.size() || text[at] == '\n') return std::string_view::npos;
    ++at;
    while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) ++at;
  }
  return at;
}

// The key of the `key = value` whose value starts at byte `value_at`: its
// first byte and its text as written ("name", "\"name\"", "a . 'b'"); false
// when the text there has another shape.
inline bool key_before_value(std::string_view text, std::size_t value_at, std::size_t& key_at,
                             std::string_view& key) {
  auto blank = [](char c) { return c == ' ' || c == '\t'; };
  auto bare = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  };
  std::size_t i = value_at;
  while (i > 0 && blank(text[i - 1])) --i;
  if (i == 0 || text[i - 1] != '=') return false;
  --i;
  while (i > 0 && blank(text[i - 1])) --i;
  const std::size_t end = i;
  while (i > 0) {
    char c = text[i - 1];
    if (bare(c) || c == '.' || blank(c)) {
      --i;
    } else if (c == '\'') {  // a literal key: no escapes, no ' inside
      if (i < 2) return false;
      std::size_t open = text.rfind('\'', i - 2);
      if (open == std::string_view::npos || text.substr(open, i - open).find('\n') != std::string_view::npos)
        return false;
      i = open;
    } else if (c == '"') {  // a basic key: the opening quote is the first one not escaped
      std::size_t j = i - 1;
      while (true) {
        if (j == 0) return false;
        std::size_t q = text.rfind('"', j - 1);
        if (q == std::string_view::npos || text.substr(q, j - q).find('\n') != std::string_view::npos)
          return false;
        std::size_t backslashes = 0;
        while (q > backslashes && text[q - 1 - backslashes] == '\\') ++backslashes;
        j = q;
        if (backslashes % 2 == 0) break;
      }
      i = j;
    } else {
      break;
    }
  }
  while (i < end && blank(text[i])) ++i;
  if (i == end || text[i] == '.') return false;
  key_at = i;
  key = text.substr(i, end - i);
  return true;
}

// The key of the table header `[key]` or `[[key]]` that starts at byte `at`,
// as written; false when the text there has another shape.
inline bool header_key(std::string_view text, std::size_t at, std::string_view& key) {
  if (at >= text.size() || text[at] != '[') return false;
  std::size_t i = at + 1;
  if (i < text.size() && text[i] == '[') ++i;
  std::size_t start = i;
  while (i < text.size() && text[i] != ']' && text[i] != '\n') {
    if (text[i] == '"' || text[i] == '\'') {
      char q = text[i++];
      while (i < text.size() && text[i] != q && text[i] != '\n') i += (q == '"' && text[i] == '\\') ? 2 : 1;
    }
    ++i;
  }
  if (i >= text.size() || text[i] != ']') return false;
  auto blank = [](char c) { return c == ' ' || c == '\t'; };
  std::size_t end = i;
  while (start < end && blank(text[start])) ++start;
  while (end > start && blank(text[end - 1])) --end;
  if (start == end) return false;
  key = text.substr(start, end - start);
  return true;
}

// toml++'s error about `text`, with its redefinition message repaired: the key
// as written (of a `key = value` or a `[table]` header), at the key's line and
// column.
inline toml_error_report describe_parse_error(std::string_view text, const toml::parse_error& e) {
  toml_error_report r{std::string(e.description()), e.source().begin.line, e.source().begin.column};
  std::string_view d = r.message;
  std::size_t redefine = d.find("cannot redefine existing ");
  std::size_t quote = redefine == std::string_view::npos ? redefine : d.find(" '", redefine);
  if (quote == std::string_view::npos || d.back() != '\'') return r;
  std::size_t at = offset_of(text, r.line, r.column);
  if (at == std::string_view::npos) return r;
  std::string_view key;
  if (header_key(text, at, key)) {
    r.message = std::string(d.substr(0, quote)) + " '" + std::string(key) + "'";
    return r;
  }
  std::size_t key_at = 0;
  if (!key_before_value(text, at, key_at, key)) return r;
  std::size_t line_start = key_at == 0 ? std::string_view::npos : text.rfind('\n', key_at - 1);
  line_start = line_start == std::string_view::npos ? 0 : line_start + 1;
  std::uint32_t column = 1;
  for (std::size_t i = line_start; i < key_at; ++i)
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) ++column;
  r.message = std::string(d.substr(0, quote)) + " '" + std::string(key) + "'";
  r.column = column;
  return r;
}

}  // namespace primecfg::detail
