// JSON in primecfg-train is nlohmann/json. This header adds what the trainer needs
// on top of it: a parser that refuses what nlohmann accepts or resolves silently,
// the trainer's notion of an integer, and one way to write JSON text.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace primecfg::train::strict_json {

// What is read: objects keep their keys sorted (a lookup is a map lookup).
using value = nlohmann::json;
// What is written: keys in the order they are set, so files are deterministic
// and read in the order a person expects.
using ordered = nlohmann::ordered_json;

struct error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Containers nested deeper than this are refused (nothing the trainer reads nests
// more than three levels; nlohmann's writer recurses).
inline constexpr std::size_t max_depth = 256;

// Parses one JSON document (RFC 8259). nlohmann refuses invalid UTF-8, lone
// UTF-16 surrogates in \u escapes, control characters in strings, comments, NaN
// and Infinity, leading zeros and text after the value; this parser also refuses
// what nlohmann would take silently:
//  - a key twice in one object (nlohmann keeps the last value),
//  - a number beyond the range of a double (1e400: nlohmann reads infinity, which
//    JSON cannot write back) and an integer literal beyond 64 bits (nlohmann reads
//    a rounded double),
//  - a UTF-8 byte order mark (nlohmann skips it; Python's json refuses it),
//  - nesting deeper than max_depth.
// Throws error "JSON: <what> at line L, column C" (columns count bytes from 1).
value parse(std::string_view text);

// v as an integer: an integer literal within int64, or a number with an integral
// value below 2^53 (2.0, 1e3); nullopt for anything else (1.5, 2^63, "1", true).
std::optional<std::int64_t> integer(const value& v);

// The member key of object v; nullptr when v is not an object or lacks it.
const value* find(const value& v, std::string_view key);

// v as JSON text: one line when indent < 0, else indented by that many spaces.
// Non-finite numbers are written as null. A string that is not valid UTF-8 is an
// error (never replaced or dropped).
std::string dump(const ordered& v, int indent = -1);
std::string dump(const value& v, int indent = -1);

}  // namespace primecfg::train::strict_json
