// Compile-time enumerator names, read from __PRETTY_FUNCTION__ (the technique
// magic_enum uses), so that the TOML spelling of an enum value is simply the
// enumerator's name and nothing has to be registered.
#pragma once

#include <primecfg/detail/signature_list.hpp>

#include <array>
#include <cstddef>
#include <string_view>
#include <type_traits>
#include <utility>

namespace primecfg::detail {

inline constexpr int max_enum_value = 64;

// One signature lists all candidate values of E: a single instantiation per
// enum type (one per value made 64 per enum, over a second of compile time for
// the shipped tree). g++ prints "[with auto ...V = {Offload::none, ...,
// (Offload)7, ...}]", clang "[V = <Offload::none, ..., (Offload)7, ...>]".
template <auto... V>
constexpr std::string_view enum_signature() noexcept {
  return __PRETTY_FUNCTION__;
}

// "none" from "Offload::none"; empty for "(Offload)7", a value that has no
// enumerator.
constexpr std::string_view enumerator_from_expression(std::string_view expr) noexcept {
  while (!expr.empty() && expr.front() == ' ') expr.remove_prefix(1);
  if (expr.empty() || expr.front() == '(') return {};  // a cast: no enumerator
  std::size_t cut = expr.find_last_of(':');
  std::string_view name = cut == std::string_view::npos ? expr : expr.substr(cut + 1);
  if (name.empty() || (name.front() >= '0' && name.front() <= '9') || name.front() == '-') return {};
  // A trailing underscore lets a keyword be a spelling: `auto_` reads "auto".
  if (name.size() > 1 && name.back() == '_') name.remove_suffix(1);
  return name;
}

// The name of every value in [0, max_enum_value), empty where no enumerator
// has that value.
template <class E, int... V>
constexpr std::array<std::string_view, sizeof...(V)> read_enumerator_names(
    std::integer_sequence<int, V...>) noexcept {
  return signature_list<sizeof...(V)>(enum_signature<static_cast<E>(V)...>(), "V = ",
                                      [](std::string_view item) { return enumerator_from_expression(item); });
}

template <class E>
inline constexpr auto names_by_value =
    read_enumerator_names<E>(std::make_integer_sequence<int, max_enum_value>{});

template <class E>
constexpr std::size_t count_enumerators() noexcept {
  std::size_t n = 0;
  for (std::string_view name : names_by_value<E>) n += name.empty() ? 0 : 1;
  return n;
}

template <class E>
struct enum_entry {
  E value;
  std::string_view name;
};

template <class E>
constexpr auto collect_enumerators() noexcept {
  std::array<enum_entry<E>, count_enumerators<E>()> out{};
  std::size_t i = 0;
  for (int v = 0; v < max_enum_value; ++v)
    if (!names_by_value<E>[v].empty()) out[i++] = {static_cast<E>(v), names_by_value<E>[v]};
  return out;
}

// Every enumerator with a value in [0, max_enum_value), in value order.
template <class E>
inline constexpr auto enum_entries = collect_enumerators<E>();

// Just the names of enum_entries<E>, in the same order.
template <class E>
inline constexpr auto enum_name_list = [] {
  std::array<std::string_view, enum_entries<E>.size()> out{};
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = enum_entries<E>[i].name;
  return out;
}();

}  // namespace primecfg::detail
