// TOML spelling of a leaf value, for error messages and the TOML dump.
#pragma once

#include <primecfg/detail/enum_names.hpp>
#include <primecfg/detail/quote.hpp>
#include <primecfg/detail/type_traits.hpp>
#include <primecfg/int_or.hpp>

#include <fmt/format.h>
#include <primecfg/detail/toml.hpp>

#include <sstream>
#include <string>

namespace primecfg::detail {

template <class E>
std::string_view enum_to_name(E value) {
  for (const auto& e : enum_entries<E>)
    if (e.value == value) return e.name;
  return "?";
}

template <class T>
std::string value_text(const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (is_integer_v<T>) {
    return fmt::format("{}", v);
  } else if constexpr (std::is_floating_point_v<T>) {
    // Shortest text that reads back to the same double; TOML needs a '.' or
    // an exponent to keep it a float.
    std::string s = fmt::format("{}", static_cast<double>(v));
    if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
    return s;
  } else if constexpr (std::is_same_v<T, std::string>) {
    return quote_toml_string(v);
  } else if constexpr (std::is_same_v<T, std::filesystem::path>) {
    return quote_toml_string(v.string());
  } else if constexpr (std::is_enum_v<T>) {
    return quote_toml_string(enum_to_name(v));
  } else if constexpr (is_int_or_v<T>) {
    return v.is_number() ? fmt::format("{}", v.number()) : quote_toml_string(enum_to_name(v.keyword()));
  } else if constexpr (is_optional_v<T>) {
    return v ? value_text(*v) : std::string("\"None\"");
  } else if constexpr (is_vector_v<T>) {
    std::string out = "[";
    for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + value_text(v[i]);
    return out + "]";
  } else {
    return "{...}";
  }
}

// The text of a TOML node as the user wrote it (strings quoted), one line.
inline std::string node_text(const toml::node& n) {
  if (n.is_table()) return "{...}";
  if (const auto* str = n.as_string()) return quote_toml_string(str->get());
  std::ostringstream os;
  n.visit([&](const auto& v) { os << toml::toml_formatter{v, toml::format_flags::none}; });
  std::string s = os.str();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

}  // namespace primecfg::detail
