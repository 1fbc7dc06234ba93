// Compile-time field names of an aggregate.
//
// Boost >= 1.84 ships boost::pfr::names_as_array (BOOST_PFR_CORE_NAME_ENABLED).
// Older Boost (Debian 12 has 1.81, Ubuntu 24.04 has 1.83) does not, so we use
// the same trick PFR 1.84 uses: take the address of each member of an object
// that is declared but never defined, pass it as a template argument, and read
// the member's name back out of __PRETTY_FUNCTION__.
#pragma once

#include <primecfg/detail/fields.hpp>
#include <primecfg/detail/signature_list.hpp>

#include <boost/pfr/core.hpp>

#include <array>
#include <cstddef>
#include <string_view>
#include <utility>

#if defined(BOOST_PFR_CORE_NAME_ENABLED) && BOOST_PFR_CORE_NAME_ENABLED && \
    !defined(PRIMECFG_FORCE_NAME_FALLBACK)
#include <boost/pfr/core_name.hpp>
#define PRIMECFG_NATIVE_PFR_NAMES 1
#else
#define PRIMECFG_NATIVE_PFR_NAMES 0
#endif

namespace primecfg::detail {

// Never defined: only the addresses of its members are used, in constant
// expressions, so no object is ever created (which also works for structs
// holding std::string or std::map, that are not literal types).
template <class T>
struct fake_holder {
  const T value;
};
template <class T>
extern const fake_holder<T> fake_object_holder;

#if defined(__clang__)
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wundefined-var-template"  // never defined, on purpose
#endif
template <class T>
constexpr const T& fake_object() noexcept {
  return fake_object_holder<T>.value;
}
#if defined(__clang__)
#pragma clang diagnostic pop
#endif

// All members of the fake object, as a tuple of references.
template <class T>
constexpr auto fake_tie() noexcept {
  return tie_fields(fake_object<T>());
}

// One signature lists every member of T: a single instantiation per struct.
// (One instantiation per field cost g++ about 5 ms each, seconds for the
// shipped config tree.)
template <auto... Ptrs>
constexpr std::string_view signature_of() noexcept {
  return __PRETTY_FUNCTION__;
}

// clang (14 at least) refuses a pointer to a subobject as a template argument
// but takes one held in a class-type argument, printed as "{&...}".
template <class P>
struct pointer_holder {
  P pointer;
};
template <class P>
constexpr pointer_holder<P> hold_pointer(P p) noexcept {
  return {p};
}

// "field" from one member expression: "(& holder<T>.fake_holder<T>::value.T::field)"
// (g++) or "{&fake_object_holder.value.field}" (clang).
constexpr std::string_view member_name_from_expression(std::string_view expr) noexcept {
  while (!expr.empty() && (expr.back() == ')' || expr.back() == '}' || expr.back() == ' '))
    expr.remove_suffix(1);
  std::size_t cut = expr.find_last_of(".:>");
  return cut == std::string_view::npos ? expr : expr.substr(cut + 1);
}

// The N member names in "... Ptrs = {(&...a), (&...b)}; ..." (g++) or
// "... [Ptrs = <{&...a}, {&...b}>]" (clang); empty when the signature has
// another shape.
template <std::size_t N>
constexpr std::array<std::string_view, N> member_names_from_signature(std::string_view sig) noexcept {
  return signature_list<N>(
      sig, "Ptrs = ", [](std::string_view item) { return member_name_from_expression(item); });
}

template <std::size_t N>
constexpr bool all_named(const std::array<std::string_view, N>& names) noexcept {
  for (std::string_view name : names)
    if (name.empty()) return false;
  return true;
}

template <class T, std::size_t... I>
constexpr std::array<std::string_view, sizeof...(I)> fallback_names(std::index_sequence<I...>) noexcept {
  [[maybe_unused]] constexpr auto members = fake_tie<T>();
  constexpr std::array<std::string_view, sizeof...(I)> names = member_names_from_signature<sizeof...(I)>(
#if defined(__clang__)
      signature_of<hold_pointer(&boost::pfr::detail::sequence_tuple::get<I>(members))...>()
#else
      signature_of<&boost::pfr::detail::sequence_tuple::get<I>(members)...>()
#endif
  );
  static_assert(all_named(names), "primecfg: could not read the field names from __PRETTY_FUNCTION__");
  return names;
}

// consteval: a call in ordinary code (a test comparing names at -O0) must
// not emit code that takes the address of the undefined fake object.
template <class T>
consteval auto field_names_fallback() noexcept {
  return fallback_names<T>(std::make_index_sequence<detail::field_count_v<T>>{});
}

template <class T>
consteval auto field_names() noexcept {
#if PRIMECFG_NATIVE_PFR_NAMES
  return boost::pfr::names_as_array<T>();
#else
  return field_names_fallback<T>();
#endif
}

// The address of every member of the fake object, computed once per type
// (a constant; never needed at run time, so the undefined object is never
// referenced by generated code).
template <class T, std::size_t... I>
constexpr std::array<const void*, sizeof...(I)> collect_member_addresses(std::index_sequence<I...>) noexcept {
  auto members = fake_tie<T>();
  return {&boost::pfr::detail::sequence_tuple::get<I>(members)...};
}

template <class T>
inline constexpr auto fake_member_addresses =
    collect_member_addresses<T>(std::make_index_sequence<detail::field_count_v<T>>{});

// Index of the data member `member` points to, computed at compile time by
// comparing addresses inside the fake object; the field count when not found.
template <class T, class M>
constexpr std::size_t field_index_of(M T::*member) noexcept {
  const void* target = &(fake_object<T>().*member);
  std::size_t i = 0;
  while (i < fake_member_addresses<T>.size() && fake_member_addresses<T>[i] != target) ++i;
  return i;
}

}  // namespace primecfg::detail
