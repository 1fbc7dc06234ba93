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
#pragma once

#include <primecfg/detail/field_names.hpp>
#include <primecfg/detail/type_traits.hpp>

#include <array>
#include <cstddef>
#include <string_view>
#include <tuple>
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

template <class S, class M, std::size_t NBounds>
struct field_spec {
  M S::*member;
  std::string_view description;
  std::array<bound, NBounds> bounds;
  bool required;
};

template <class S, class M, class... Extra>
constexpr auto field(M S::*member, std::string_view description, Extra... extra) {
  static_assert(((std::is_same_v<Extra, bound> || std::is_same_v<Extra, required_t>)&&...),
                "primecfg::field takes bounds (ge, gt, le, lt) and primecfg::required");
  constexpr std::size_t nbounds = (std::size_t{0} + ... + (std::is_same_v<Extra, bound> ? 1u : 0u));
  if constexpr (nbounds > 0) {
    static_assert(detail::is_numeric_v<detail::innermost_t<M>>,
                  "primecfg: bounds apply to numbers (or optionals / vectors of numbers)");
  }
  field_spec<S, M, nbounds> spec{member, description, {}, false};
  [[maybe_unused]] std::size_t i = 0;
  (
      [&](auto e) {
        if constexpr (std::is_same_v<decltype(e), bound>)
          spec.bounds[i++] = e;
        else
          spec.required = true;
      }(extra),
      ...);
  return spec;
}

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

template <class... Entries>
constexpr auto describe(Entries... entries) {
  return std::tuple<Entries...>{entries...};
}

// What the library reads at run time: the metadata of field I of T.
struct field_doc {
  std::string_view description;
  std::array<bound, 4> bounds{};
  std::size_t bound_count = 0;
  bool required = false;
};

namespace detail {

template <class T>
concept described = requires {
  T::fields();
};

template <class T>
struct struct_doc {
  static constexpr std::size_t size = boost::pfr::tuple_size_v<T>;
  std::array<field_doc, size> fields{};
  std::array<int, size> times_described{};
  std::array<retired_key, 16> retired{};
  std::size_t retired_count = 0;
};

template <class T>
constexpr struct_doc<T> build_doc() {
  struct_doc<T> out;
  if constexpr (described<T>) {
    std::apply(
        [&](auto... entry) {
          (
              [&](auto e) {
                if constexpr (std::is_same_v<decltype(e), retired_key>) {
                  out.retired[out.retired_count++] = e;
                } else {
                  std::size_t i = field_index_of(e.member);
                  out.times_described[i] += 1;
                  out.fields[i].description = e.description;
                  out.fields[i].required = e.required;
                  for (const bound& b : e.bounds) out.fields[i].bounds[out.fields[i].bound_count++] = b;
                }
              }(entry),
              ...);
        },
        T::fields());
  }
  return out;
}

template <class T>
constexpr bool fully_described(const struct_doc<T>& doc) {
  for (int t : doc.times_described)
    if (t != 1) return false;
  return true;
}

}  // namespace detail

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
