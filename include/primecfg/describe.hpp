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
constexpr bool fully_described(const struct_doc<T>& doc);

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
  constexpr detail::struct_doc<T> doc = detail::build_doc<T>();
  static_assert(!detail::described<T> || detail::fully_described(doc),
                "primecfg: every field needs exactly one primecfg::field(...) entry in fields()");
  return doc;
}();

}  // namespace primecfg

#include <primecfg/detail/describe.inl>
