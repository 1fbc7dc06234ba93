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

#include <cstddef>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>

namespace primecfg::detail {

struct struct_shape {
  std::span<const std::string_view> names;
  std::span<const field_doc> docs;
  std::span<const retired_key> retired;
  void* (*field_at)(void* object, std::size_t i);  // the address of field i of the struct at `object`

  void* field(void* object, std::size_t i) const { return field_at(object, i); }
};

// The type of field I of T.
template <class T, std::size_t I>
using field_type_t = std::remove_cvref_t<decltype(detail::get_field<I>(std::declval<T&>()))>;

template <class T>
inline constexpr auto field_names_of = field_names<T>();

// 0, 1, ..., N-1 for the N fields of T; tables per field are built from it.
template <class T>
inline constexpr std::make_index_sequence<field_names_of<T>.size()> field_indices{};

// Field i of the T at `object`, through the references PFR ties to it (no
// object is made up to measure offsets on, so a struct's shape is a constant).
template <class T>
void* field_address(void* object, std::size_t i) {
  return [&]<std::size_t... I>(std::index_sequence<I...>)->void* {
    if constexpr (sizeof...(I) == 0) {
      return nullptr;
    } else {
      auto fields = tie_fields(*static_cast<T*>(object));
      void* addresses[] = {static_cast<void*>(&boost::pfr::detail::sequence_tuple::get<I>(fields))...};
      return addresses[i];
    }
  }
  (field_indices<T>);
}

template <class T>
inline constexpr struct_shape shape_of{
    field_names_of<T>, doc_of<T>.fields,
    std::span<const retired_key>(doc_of<T>.retired.data(), doc_of<T>.retired_count), &field_address<T>};

}  // namespace primecfg::detail
