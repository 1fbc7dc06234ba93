// Diagnostics are values: every problem found while loading a config, with
// enough context (kind, dotted path, source location, offending input) to be
// acted on by a person or by a tool.
//
// The definitions are in detail/error.inl.
#pragma once

#include <primecfg/detail/cxx_version.hpp>  // first: C++20 or later

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace primecfg {

// What is wrong, as a stable name for tools (docs/errors.md lists them).
enum class error_kind {
  toml_syntax,         // the file is not valid TOML
  file_error,          // the file cannot be read
  extra_forbidden,     // a key that names no field
  missing,             // a required field that no source set
  literal_error,       // a string outside an enum's allowed values
  bool_type,           // expected a boolean
  int_type,            // expected an integer
  float_type,          // expected a number
  string_type,         // expected a string
  table_type,          // expected a table
  array_type,          // expected an array
  int_overflow,        // an integer that does not fit the field's type
  finite_number,       // inf or nan where a finite number is needed
  greater_than,        // bound gt violated
  greater_than_equal,  // bound ge violated
  less_than,           // bound lt violated
  less_than_equal,     // bound le violated
  union_tag_invalid,   // a `type` that names no alternative
  value_error,         // a cross-field rule
};

// The kind's name as in the reports ("extra_forbidden").
constexpr std::string_view to_string(error_kind k) noexcept;

// Where a value came from: its default, a position in a file, or a CLI flag.
struct provenance {
  enum class origin { default_value, file, command_line };
  origin from = origin::default_value;
  std::string file;  // file path, or the flag as written ("--model.offload")
  std::uint32_t line = 0;
  std::uint32_t column = 0;

  static provenance in_file(std::string path, std::uint32_t line, std::uint32_t column) {
    return {origin::file, std::move(path), line, column};
  }
  static provenance on_command_line(std::string flag) {
    return {origin::command_line, std::move(flag), 0, 0};
  }

  bool is_default() const noexcept { return from == origin::default_value; }

  // "a.toml:3:11", "a.toml", "command line --model.offload" or "default".
  std::string to_string() const;
};

// How bad a diagnostic is: only errors make a load fail.
enum class severity { error, warning, note };

// "error", "warning" or "note".
constexpr std::string_view to_string(severity s) noexcept;

// One problem found while loading a config.
struct diagnostic {
  severity level = severity::error;
  error_kind kind = error_kind::value_error;
  std::string path;     // dotted path of the field ("model.offload"); empty for the whole file
  provenance where;     // source of the offending value
  std::string message;  // what is wrong and, where possible, what to do
  std::string input;    // the offending input as written, TOML-quoted; empty when none
};

// Compiler-style: "a.toml:3:11: error: model.offload: Input should be ... [literal_error] (input: "ful")"
inline std::string format_diagnostic(const diagnostic& d);

}  // namespace primecfg

#include <primecfg/detail/error.inl>
