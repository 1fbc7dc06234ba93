// Field-by-field equality of config values (config structs need no operator==).
#pragma once

#include <primecfg/detail/type_traits.hpp>
#include <primecfg/opaque.hpp>

#include <primecfg/detail/fields.hpp>

#include <boost/pfr/core.hpp>

#include <variant>

namespace primecfg::detail {

template <class T>
bool deep_equal(const T& a, const T& b) {
  if constexpr (is_optional_v<T>) {
    if (a.has_value() != b.has_value()) return false;
    return !a || deep_equal(*a, *b);
  } else if constexpr (is_vector_v<T>) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (!deep_equal(a[i], b[i])) return false;
    return true;
  } else if constexpr (is_string_map_v<T>) {
    if (a.size() != b.size()) return false;
    for (auto ia = a.begin(), ib = b.begin(); ia != a.end(); ++ia, ++ib)
      if (ia->first != ib->first || !deep_equal(ia->second, ib->second)) return false;
    return true;
  } else if constexpr (is_variant_v<T>) {
    if (a.index() != b.index()) return false;
    return std::visit([&](const auto& x) { return deep_equal(x, std::get<std::decay_t<decltype(x)>>(b)); },
                      a);
  } else if constexpr (is_struct_v<T>) {
    bool equal = true;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((equal = equal && deep_equal(detail::get_field<I>(a), detail::get_field<I>(b))), ...);
    }
    (std::make_index_sequence<detail::field_count_v<T>>{});
    return equal;
  } else {
    return a == b;
  }
}

}  // namespace primecfg::detail
