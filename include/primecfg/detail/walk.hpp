// One pass over a loaded config value that records what the rules need: the
// address, type and dotted path of every field (parents first), and the
// validate() of every struct that has one (children first).
//
// It is a single template walk on purpose: each walk instantiates code for
// every type of the config tree, and that code is most of what a translation
// unit that loads a config costs to compile.
#pragma once

#include <primecfg/describe.hpp>
#include <primecfg/detail/field_names.hpp>
#include <primecfg/detail/struct_shape.hpp>
#include <primecfg/detail/type_traits.hpp>
#include <primecfg/validate.hpp>

#include <array>
#include <string>
#include <string_view>
#include <typeindex>
#include <utility>
#include <variant>
#include <vector>

namespace primecfg::detail {

struct value_index {
  struct field_entry {
    const void* address;
    std::type_index type;
    std::string path;
    const field_doc* doc;  // null for values that are not a struct's field (list items, optional contents)
  };
  using rule_fn = void (*)(void* object, validation& v);

  std::vector<field_entry> fields;               // parents first
  std::vector<std::pair<void*, rule_fn>> rules;  // children first
};

[[gnu::noinline]] inline std::string child_path(const std::string& parent, std::string_view name) {
  std::string out;
  out.reserve(parent.size() + name.size() + 1);
  if (!parent.empty()) out.append(parent).push_back('.');
  out.append(name);
  return out;
}

template <class T>
[[gnu::noinline]] void index_value(T& value, const std::string& path, const field_doc* doc, value_index& out);

using field_indexer = void (*)(void* field, const std::string& path, const field_doc* doc, value_index& out);

template <class M>
void index_field(void* field, const std::string& path, const field_doc* doc, value_index& out) {
  index_value(*static_cast<M*>(field), path, doc, out);
}

template <class T, std::size_t... I>
constexpr std::array<field_indexer, sizeof...(I)> indexers_of(std::index_sequence<I...>) {
  return {&index_field<field_type_t<T, I>>...};
}

template <class T>
inline constexpr auto field_indexers = indexers_of<T>(field_indices<T>);

// The fields of the struct at `object`, through each field's indexer.
[[gnu::noinline]] inline void index_fields(void* object, const struct_shape& shape,
                                           const field_indexer* indexers, const std::string& path,
                                           value_index& out) {
  for (std::size_t i = 0; i < shape.names.size(); ++i)
    indexers[i](shape.field(object, i), child_path(path, shape.names[i]), &shape.docs[i], out);
}

template <class T>
[[gnu::noinline]] void index_value(T& value, const std::string& path, const field_doc* doc,
                                   value_index& out) {
  out.fields.push_back({&value, std::type_index(typeid(T)), path, doc});
  if constexpr (is_optional_v<T>) {
    if (value) index_value(*value, path, nullptr, out);
  } else if constexpr (is_vector_v<T>) {
    for (std::size_t i = 0; i < value.size(); ++i)
      index_value(value[i], path + "[" + std::to_string(i) + "]", nullptr, out);
  } else if constexpr (is_string_map_v<T>) {
    for (auto& [key, item] : value) index_value(item, child_path(path, key), nullptr, out);
  } else if constexpr (is_variant_v<T>) {
    std::visit([&](auto& alternative) { index_value(alternative, path, nullptr, out); }, value);
  } else if constexpr (is_struct_v<T>) {
    index_fields(&value, shape_of<T>(), field_indexers<T>.data(), path, out);
    if constexpr (requires(validation & v) { value.validate(v); })
      out.rules.emplace_back(&value,
                             [](void* object, validation& v) { static_cast<T*>(object)->validate(v); });
  }
}

}  // namespace primecfg::detail
