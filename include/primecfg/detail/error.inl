// Definitions of error.hpp.
#pragma once

#include <primecfg/error.hpp>

namespace primecfg {

constexpr std::string_view to_string(error_kind k) noexcept {
  constexpr std::string_view names[] = {
      "toml_syntax", "file_error",      "extra_forbidden",   "missing",      "literal_error",
      "bool_type",   "int_type",        "float_type",        "string_type",  "table_type",
      "array_type",  "int_overflow",    "finite_number",     "greater_than", "greater_than_equal",
      "less_than",   "less_than_equal", "union_tag_invalid", "value_error"};
  return names[static_cast<int>(k)];
}

inline std::string provenance::to_string() const {
  switch (from) {
    case origin::default_value:
      return "default";
    case origin::command_line:
      return "command line " + file;
    case origin::file:
      break;
  }
  if (line == 0) return file;
  return fmt::format("{}:{}:{}", file, line, column);
}

constexpr std::string_view to_string(severity s) noexcept {
  return s == severity::error ? "error" : s == severity::warning ? "warning" : "note";
}

inline std::string format_diagnostic(const diagnostic& d) {
  std::string where = d.where.is_default() ? std::string("<config>") : d.where.to_string();
  std::string out = fmt::format("{}: {}: ", where, to_string(d.level));
  if (!d.path.empty()) out += d.path + ": ";
  out += d.message;
  if (d.level == severity::error) out += fmt::format(" [{}]", to_string(d.kind));
  if (!d.input.empty()) out += fmt::format(" (input: {})", d.input);
  return out;
}

}  // namespace primecfg
