// The fields of an aggregate: how many there are, and references to them.
//
// Boost.PFR counts fields by bisecting over aggregate initialisations from
// sizeof(T) * CHAR_BIT initialisers down: a 1.4 KB config root starts with a
// probe of 5,700 initialisers, and counting the shipped tree's 26 structs
// took about a second of every translation unit that loads a config. Config
// structs have tens of fields, so the count here grows from one (1, 2, 4, ...)
// and bisects only the last step, with PFR's own probe. The references come
// from PFR too, told the count.
#pragma once

#include <boost/pfr/core.hpp>

#include <cstddef>
#include <type_traits>
#include <utility>

namespace primecfg::detail {

// Whether T{x1, ..., xN} compiles for values x that convert to anything: true
// up to T's field count (aggregate initialisation defaults the rest), false
// beyond it.
template <class T, std::size_t N, class = void>
inline constexpr bool takes_initializers = false;
template <class T, std::size_t N>
inline constexpr bool
    takes_initializers<T, N, std::void_t<boost::pfr::detail::enable_if_constructible_helper_t<T, N>>> = true;

// The largest N in [Lo, Hi) that T takes, given that it takes Lo and not Hi.
template <class T, std::size_t Lo, std::size_t Hi>
constexpr std::size_t bisect_field_count() noexcept {
  if constexpr (Hi - Lo <= 1) {
    return Lo;
  } else {
    constexpr std::size_t mid = Lo + (Hi - Lo) / 2;
    if constexpr (takes_initializers<T, mid>)
      return bisect_field_count<T, mid, Hi>();
    else
      return bisect_field_count<T, Lo, mid>();
  }
}

// PFR's tie supports up to 100 fields; doubling stops past that.
inline constexpr std::size_t max_fields = 100;

template <class T, std::size_t N>
constexpr std::size_t grow_field_count() noexcept {
  if constexpr (N > 2 * max_fields || !takes_initializers<T, N>)
    return bisect_field_count<T, N / 2, N>();
  else
    return grow_field_count<T, N * 2>();
}

template <class T>
constexpr std::size_t count_fields() noexcept {
  static_assert(
      std::is_aggregate_v<T>,
      "primecfg: a config struct must be an aggregate (T in the 'In instantiation of' line above): no "
      "user-declared constructor, no private or protected field, no virtual function or base");
  // T{x} also compiles as a copy of T (x converts to T&), so one initialiser
  // says nothing; two tell a one-field struct from a bigger one.
  if constexpr (!takes_initializers<T, 2>) {
    return std::is_empty_v<T> ? 0 : 1;
  } else {
    constexpr std::size_t n = grow_field_count<T, 4>();
    static_assert(n <= max_fields, "primecfg: a config struct has at most 100 fields");
    return n;
  }
}

template <class T>
inline constexpr std::size_t field_count_v = count_fields<std::remove_cv_t<T>>();

// References to every field of `value`, in declaration order (a PFR sequence tuple).
template <class T>
constexpr auto tie_fields(T& value) noexcept {
  return boost::pfr::detail::tie_as_tuple(value, boost::pfr::detail::size_t_<field_count_v<T>>{});
}

// Field I of `value`.
template <std::size_t I, class T>
constexpr decltype(auto) get_field(T& value) noexcept {
  return boost::pfr::detail::sequence_tuple::get<I>(tie_fields(value));
}

}  // namespace primecfg::detail
