// Classification of the field types primecfg understands.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace primecfg {
struct opaque_table;
template <class E>
struct int_or;
}  // namespace primecfg

namespace primecfg::detail {

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};
template <class T>
inline constexpr bool is_optional_v = is_optional<T>::value;

template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {};
template <class T>
inline constexpr bool is_vector_v = is_vector<T>::value;

template <class T>
struct is_string_map : std::false_type {};
template <class T, class C, class A>
struct is_string_map<std::map<std::string, T, C, A>> : std::true_type {};
template <class T>
inline constexpr bool is_string_map_v = is_string_map<T>::value;

template <class T>
struct is_variant : std::false_type {};
template <class... T>
struct is_variant<std::variant<T...>> : std::true_type {};
template <class T>
inline constexpr bool is_variant_v = is_variant<T>::value;

template <class T>
struct is_int_or : std::false_type {};
template <class E>
struct is_int_or<int_or<E>> : std::true_type {};
template <class T>
inline constexpr bool is_int_or_v = is_int_or<T>::value;

template <class T>
inline constexpr bool is_integer_v =
    std::is_integral_v<T> && !std::is_same_v<T, bool> && !std::is_same_v<T, char>;
template <class T>
inline constexpr bool is_numeric_v = is_integer_v<T> || std::is_floating_point_v<T>;

template <class T>
inline constexpr bool is_scalar_leaf_v =
    std::is_same_v<T, bool> || is_numeric_v<T> || std::is_same_v<T, std::string> ||
    std::is_same_v<T, std::filesystem::path> || std::is_enum_v<T> || is_int_or_v<T>;

// A nested config struct: an aggregate class that is none of the above.
template <class T>
inline constexpr bool is_struct_v =
    std::is_class_v<T>&& std::is_aggregate_v<T> && !is_optional_v<T> && !is_vector_v<T> &&
    !is_string_map_v<T> && !is_variant_v<T> && !std::is_same_v<T, opaque_table> &&
    !std::is_same_v<T, std::string> && !std::is_same_v<T, std::filesystem::path>;

template <class T>
struct is_optional_struct : std::false_type {};
template <class T>
struct is_optional_struct<std::optional<T>> : std::bool_constant<is_struct_v<T>> {};
template <class T>
inline constexpr bool is_optional_struct_v = is_optional_struct<T>::value;

// The element type after peeling optionals, vectors and int_or: what bounds apply to.
template <class T>
struct innermost {
  using type = T;
};
template <class T>
struct innermost<std::optional<T>> : innermost<T> {};
template <class T, class A>
struct innermost<std::vector<T, A>> : innermost<T> {};
template <class E>
struct innermost<int_or<E>> {  // bounds apply to its integer
  using type = std::int64_t;
};
template <class T>
using innermost_t = typename innermost<T>::type;

// Tagged-union alternatives name themselves: static constexpr std::string_view type = "adamw";
template <class T>
concept tagged_alternative = requires {
  { T::type } -> std::convertible_to<std::string_view>;
};

}  // namespace primecfg::detail
