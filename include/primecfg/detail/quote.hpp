// Quoting a string for TOML and JSON output. Its own header so that code writing JSON
// (primecfg-train's metrics lines) quotes strings the same way without pulling in toml++.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace primecfg::detail {

// Appends the TOML/JSON escape of a control character (below 0x20, or DEL) and
// returns true; returns false, appending nothing, for any other character.
inline bool append_control_escape(std::string& out, char c) {
  switch (c) {
    case '\n':
      out += "\\n";
      return true;
    case '\t':
      out += "\\t";
      return true;
    case '\r':
      out += "\\r";
      return true;
    case '\b':
      out += "\\b";
      return true;
    case '\f':
      out += "\\f";
      return true;
    default:
      if (static_cast<unsigned char>(c) >= 0x20 && c != 0x7f) return false;
      out += fmt::format("\\u{:04X}", static_cast<unsigned char>(c));
      return true;
  }
}

// A TOML basic string (double quotes, escapes), valid in TOML and JSON alike.
inline std::string quote_toml_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"')
      out += "\\\"";
    else if (c == '\\')
      out += "\\\\";
    else if (!append_control_escape(out, c))
      out += c;
  }
  return out + "\"";
}

// Text for a TOML comment. A comment ends at the line break and may hold no other
// control character but a tab, so those are written as escapes: a key or value
// the user wrote with a line break must not end the comment that names its source.
inline std::string toml_comment_text(std::string_view s) {
  std::string out;
  for (char c : s)
    if (c == '\t' || !append_control_escape(out, c)) out += c;
  return out;
}

}  // namespace primecfg::detail
