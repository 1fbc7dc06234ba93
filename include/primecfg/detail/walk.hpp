// One pass over a loaded config value that records what the rules need: the
// address, type and dotted path of every field (parents first), and the
// validate() of every struct that has one (children first), and the share()
// of every struct that has one (parents first).
//
// One plain function over the type descriptions of detail/type_ops.hpp, not
// a template per field type (see there why).
#pragma once

#include <primecfg/describe.hpp>
#include <primecfg/detail/field_names.hpp>
#include <primecfg/detail/header_only.hpp>
#include <primecfg/detail/struct_shape.hpp>
#include <primecfg/detail/type_ops.hpp>
#include <primecfg/validate.hpp>

#include <string>
#include <string_view>
#include <typeindex>
#include <utility>
#include <vector>

// Only where the loader is compiled (detail/header_only.hpp).
#if PRIMECFG_DEFINES_LOADER

namespace primecfg::detail {

struct value_index {
  struct field_entry {
    const void* address;
    std::type_index type;
    std::string path;
    const field_doc* doc;  // null for values that are not a struct's field (list items, optional contents)
  };
  using rule_fn = void (*)(void* object, validation& v);

  std::vector<field_entry> fields;                // parents first
  std::vector<std::pair<void*, rule_fn>> rules;   // children first
  std::vector<std::pair<void*, rule_fn>> shares;  // parents first
};

inline std::string child_path(const std::string& parent, std::string_view name) {
  std::string out;
  out.reserve(parent.size() + name.size() + 1);
  if (!parent.empty()) out.append(parent).push_back('.');
  out.append(name);
  return out;
}

struct map_index_context {
  const type_ops* element;
  const std::string* path;
  value_index* out;
};

inline void index_value(void* value, const type_ops& type, const std::string& path, const field_doc* doc,
                        value_index& out) {
  out.fields.push_back({value, std::type_index(*type.type), path, doc});
  switch (type.kind) {
    case value_kind::optional:
      if (void* contents = type.optional->get(value))
        index_value(contents, *type.element, path, nullptr, out);
      break;
    case value_kind::list:
      for (std::size_t i = 0, n = type.list->size(value); i < n; ++i)
        index_value(type.list->at(value, i), *type.element, path + "[" + std::to_string(i) + "]", nullptr,
                    out);
      break;
    case value_kind::string_map: {
      map_index_context context{type.element, &path, &out};
      type.map->for_each(
          value,
          [](void* c, const std::string& key, void* item) {
            auto& m = *static_cast<map_index_context*>(c);
            index_value(item, *m.element, child_path(*m.path, key), nullptr, *m.out);
          },
          &context);
      break;
    }
    case value_kind::tagged_union: {
      const union_ops& u = *type.alternatives;
      index_value(u.active(value), *u.alternatives[u.index(value)], path, nullptr, out);
      break;
    }
    case value_kind::record: {
      const struct_shape& shape = *type.record->shape;
      if (type.record->share) out.shares.emplace_back(value, type.record->share);  // before its fields'
      for (std::size_t i = 0; i < shape.names.size(); ++i)
        index_value(shape.field(value, i), *type.record->fields[i], child_path(path, shape.names[i]),
                    &shape.docs[i], out);
      if (type.record->validate) out.rules.emplace_back(value, type.record->validate);  // after its fields'
      break;
    }
    default:
      break;
  }
}

}  // namespace primecfg::detail

#endif  // PRIMECFG_DEFINES_LOADER
