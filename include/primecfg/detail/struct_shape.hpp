// A config struct as data: its field names, where each field sits inside an
// object, each field's documentation, and the keys a migration retired.
//
// The loaders (decoding, the field index the rules use, command-line flag
// lookup) walk this table, and the field types' descriptions of
// detail/type_ops.hpp, in plain functions. A template per struct, with the
// per-field code unrolled into it, made a translation unit that loads the
// shipped config tree take half a minute to compile (docs/performance.md).
#pragma once

#include <primecfg/describe.hpp>
#include <primecfg/detail/field_names.hpp>
#include <primecfg/detail/fields.hpp>

#include <array>
#include <cstddef>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>

namespace primecfg::detail {

struct struct_shape {
  std::span<const std::string_view> names;
  std::span<const std::size_t> offsets;  // byte offset of each field in an object
  std::span<const field_doc> docs;
  std::span<const retired_key> retired;

  void* field(void* object, std::size_t i) const { return static_cast<char*>(object) + offsets[i]; }
};

// The type of field I of T.
template <class T, std::size_t I>
using field_type_t = std::remove_cvref_t<decltype(detail::get_field<I>(std::declval<T&>()))>;

template <class T>
inline constexpr auto field_names_of = field_names<T>();

// 0, 1, ..., N-1 for the N fields of T; tables per field are built from it.
template <class T>
inline constexpr std::make_index_sequence<field_names_of<T>.size()> field_indices{};

// Offsets cannot be computed in a constant expression (subtracting pointers
// to different members is not one), so they are measured once on a
// default-constructed object; every config struct is default-constructible.
template <class T, std::size_t... I>
std::array<std::size_t, sizeof...(I)> measure_offsets(std::index_sequence<I...>) {
  const T probe{};
  const char* base = reinterpret_cast<const char*>(&probe);
  return {static_cast<std::size_t>(reinterpret_cast<const char*>(&detail::get_field<I>(probe)) - base)...};
}

template <class T>
[[gnu::noinline]] const struct_shape& shape_of() {
  static const auto offsets = measure_offsets<T>(field_indices<T>);
  static const struct_shape shape{
      field_names_of<T>, offsets, doc_of<T>.fields,
      std::span<const retired_key>(doc_of<T>.retired.data(), doc_of<T>.retired_count)};
  return shape;
}

}  // namespace primecfg::detail
