// Field metadata: a one-line description per field, value bounds, and keys
// that a migration retired. A config struct lists them in a static member
// function next to its fields:
//
//   struct AdamWConfig {
//     double lr = 1e-6;
//     static constexpr auto fields() {
//       return primecfg::describe(
//           primecfg::field(&AdamWConfig::lr, "Peak learning rate.", primecfg::ge(0)));
//     }
//   };
//
// Fields are named by member pointer, so a description of a field that does
// not exist does not compile; a field without a description, or with two,
// is a static_assert in doc_of<T>.
//
// The definitions are in detail/describe.inl.
#pragma once

#include <primecfg/detail/cxx_version.hpp>  // first: C++20 or later

#include <primecfg/detail/field_names.hpp>
#include <primecfg/detail/fields.hpp>
#include <primecfg/detail/type_traits.hpp>

#include <array>
#include <cstddef>
#include <string_view>
#include <type_traits>
#include <utility>

namespace primecfg {

// A bound on a numeric value (on the value inside an optional, on every element
// of a vector). Doubles hold every bound we need exactly (integers < 2^53).
struct bound {
  enum kind_t : unsigned char { ge, gt, le, lt } kind;
  double value;
};
constexpr bound ge(double v) { return {bound::ge, v}; }
constexpr bound gt(double v) { return {bound::gt, v}; }
constexpr bound le(double v) { return {bound::le, v}; }
constexpr bound lt(double v) { return {bound::lt, v}; }

// The field must be set by some source (a file or the command line).
struct required_t {};
inline constexpr required_t required{};

// What the library reads at run time: the metadata of field I of T.
struct field_doc {
  std::string_view description;
  std::array<bound, 4> bounds{};
  std::size_t bound_count = 0;
  bool required = false;
};

// A key this struct no longer has: which key replaced it (empty when none did)
// and which migration tool rewrites old files.
struct retired_key {
  std::string_view key;
  std::string_view replacement;
  std::string_view fix;
};
constexpr retired_key retired(std::string_view key, std::string_view replacement,
                              std::string_view fix = "primecfg-migrate") {
  return {key, replacement, fix};
}

namespace detail {

template <class S>
struct description_entry;  // one entry of fields(): a field's index and metadata, or a retired key
template <class T>
struct struct_doc;  // what doc_of<T> holds

// T has a fields() description.
template <class T>
concept described = requires {
  T::fields();
};

template <class T>
constexpr struct_doc<T> build_doc();

template <class T>
inline constexpr struct_doc<T> built_doc = build_doc<T>();

// A field's name as a template argument, so that the compiler prints it.
template <std::size_t N>
struct name_literal {
  char text[N + 1]{};
  constexpr name_literal(std::string_view s) {
    for (std::size_t i = 0; i < N; ++i) text[i] = s[i];
  }
};

// Instantiated only for a field that fields() describes no times or several:
// the compiler's "In instantiation of" line names it (Field, its index and
// type, and how many entries it has).
template <class Struct, name_literal Field, class FieldType, std::size_t Index, int Entries>
constexpr void every_field_needs_exactly_one_entry() {
  static_assert(
      Entries == 1,
      "primecfg: every field needs exactly one primecfg::field(...) entry in fields(); the field is "
      "Field in the 'In instantiation of' line above (Index, FieldType, and its Entries)");
}

template <class T, std::size_t I>
constexpr void check_description() {
  constexpr int entries = built_doc<T>.times_described[I];
  if constexpr (entries != 1) {
    constexpr std::string_view name = field_names<T>()[I];
    every_field_needs_exactly_one_entry<T, name_literal<name.size()>(name),
                                        std::remove_cvref_t<decltype(get_field<I>(std::declval<T&>()))>, I,
                                        entries>();
  }
}

template <class T, std::size_t... I>
constexpr bool check_descriptions(std::index_sequence<I...>) {
  (check_description<T, I>(), ...);
  return true;
}

}  // namespace detail

// One entry of fields(): the member, its one-line description, and any bounds
// (ge, gt, le, lt; at most four) and primecfg::required.
template <class S, class M, class... Extra>
constexpr detail::description_entry<S> field(M S::*member, std::string_view description, Extra... extra);

// What fields() returns: one entry per field (and per retired key), of struct S.
template <class S, std::size_t N>
struct description {
  std::array<detail::description_entry<S>, N> entries;
};

// The description of a struct: its field(...) entries and retired(...) keys, in any order.
template <class... Entries>
constexpr auto describe(Entries... entries);

// The metadata of every field of T, indexed like its members. A struct
// without fields() has empty descriptions (handy in tests; the shipped config
// tree describes everything).
template <class T>
inline constexpr detail::struct_doc<T> doc_of = [] {
  if constexpr (detail::described<T>) {
    static_assert(!detail::built_doc<T>.foreign_entry,
                  "primecfg: fields() describes a member that is not a field of this struct");
    detail::check_descriptions<T>(std::make_index_sequence<detail::struct_doc<T>::size>{});
  }
  return detail::built_doc<T>;
}();

}  // namespace primecfg

#include <primecfg/detail/describe.inl>
