// Quoting a string for TOML and JSON output. Its own header so that code writing JSON
// (primecfg-train's metrics lines) quotes strings the same way without pulling in toml++.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace primecfg::detail {

// A TOML basic string (double quotes, escapes), valid in TOML and JSON alike.
inline std::string quote_toml_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
          out += fmt::format("\\u{:04X}", static_cast<unsigned char>(c));
        else
          out += c;
    }
  }
  return out + "\"";
}

}  // namespace primecfg::detail
