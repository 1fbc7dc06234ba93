// A small JSON reader and writer, enough for safetensors headers, HF config.json,
// JSONL records and the trainer's own state files. Not a general library: numbers
// are kept as double plus (when integral) an exact int64.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace primecfg::train::json {

struct value;
using array = std::vector<value>;
using object = std::map<std::string, value, std::less<>>;

struct number {
  double d = 0;
  std::int64_t i = 0;
  bool integral = false;
};

struct value {
  std::variant<std::monostate, bool, number, std::string, array, object> v;

  bool is_null() const { return v.index() == 0; }
  bool is_bool() const { return v.index() == 1; }
  bool is_number() const { return v.index() == 2; }
  bool is_string() const { return v.index() == 3; }
  bool is_array() const { return v.index() == 4; }
  bool is_object() const { return v.index() == 5; }

  // Accessors throw json::error naming what was expected.
  bool as_bool() const;
  double as_double() const;
  std::int64_t as_int() const;
  const std::string& as_string() const;
  const array& as_array() const;
  const object& as_object() const;

  // Member lookup on an object; nullptr when absent (or not an object).
  const value* find(std::string_view key) const;
};

struct error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Parses one JSON document; throws json::error with the byte offset on bad input.
value parse(std::string_view text);

// Quotes and escapes a string for JSON output.
std::string quote(std::string_view s);

}  // namespace primecfg::train::json
