// Visiting every field of a config value with its dotted path.
#pragma once

#include <primecfg/describe.hpp>
#include <primecfg/detail/field_names.hpp>
#include <primecfg/detail/type_traits.hpp>

#include <fmt/format.h>

#include <string>
#include <utility>
#include <variant>

namespace primecfg::detail {

// Calls pre(value, path) for `value` and everything inside it, parents first,
// and post(value, path) on the way back up (children first). Only the active
// alternative of a union and engaged optionals are visited.
template <class T, class Pre, class Post>
void walk(T& value, const std::string& path, Pre&& pre, Post&& post) {
  pre(value, path);
  if constexpr (is_optional_v<std::remove_const_t<T>>) {
    if (value) walk(*value, path, pre, post);
  } else if constexpr (is_vector_v<std::remove_const_t<T>>) {
    for (std::size_t i = 0; i < value.size(); ++i) walk(value[i], fmt::format("{}[{}]", path, i), pre, post);
  } else if constexpr (is_string_map_v<std::remove_const_t<T>>) {
    for (auto& [key, item] : value) walk(item, path.empty() ? key : path + "." + key, pre, post);
  } else if constexpr (is_variant_v<std::remove_const_t<T>>) {
    std::visit([&](auto& alternative) { walk(alternative, path, pre, post); }, value);
  } else if constexpr (is_struct_v<std::remove_const_t<T>>) {
    constexpr auto names = field_names<std::remove_const_t<T>>();
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (walk(boost::pfr::get<I>(value),
            path.empty() ? std::string(names[I]) : path + "." + std::string(names[I]), pre, post),
       ...);
    }
    (std::make_index_sequence<names.size()>{});
  }
  post(value, path);
}

// The same, over the described fields of struct T only, with each field's doc.
template <class T, class F>
void for_each_field(T& value, F&& f) {
  using S = std::remove_const_t<T>;
  constexpr auto names = field_names<S>();
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (f(boost::pfr::get<I>(value), names[I], doc_of<S>.fields[I]), ...);
  }
  (std::make_index_sequence<names.size()>{});
}

}  // namespace primecfg::detail
