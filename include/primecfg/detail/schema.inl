// Definitions of schema.hpp.
#pragma once

#include <primecfg/schema.hpp>

namespace primecfg {

namespace detail {

inline void add_bounds(toml::table& schema, const field_doc& doc) {
  static constexpr const char* keywords[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
  for (std::size_t i = 0; i < doc.bound_count; ++i) {
    const bound& b = doc.bounds[i];
    if (b.value == static_cast<double>(static_cast<std::int64_t>(b.value)))
      schema.insert_or_assign(keywords[b.kind], static_cast<std::int64_t>(b.value));
    else
      schema.insert_or_assign(keywords[b.kind], b.value);
  }
}

template <class T>
toml::table schema_of_type(const field_doc* doc);

template <class S>
toml::table schema_of_struct(std::string_view tag = {}) {
  toml::table properties;
  constexpr auto names = field_names<S>();
  S defaults{};
  toml::table default_values = encode_struct(defaults);
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (
        [&] {
          using F = std::remove_cvref_t<decltype(detail::get_field<I>(defaults))>;
          const field_doc& doc = doc_of<S>.fields[I];
          toml::table property = schema_of_type<F>(&doc);
          if (!doc.description.empty())
            property.insert_or_assign("description", std::string(doc.description));
          if (!doc.required)
            if (const toml::node* d = default_values.get(names[I])) property.insert_or_assign("default", *d);
          properties.insert_or_assign(names[I], std::move(property));
        }(),
        ...);
  }
  (std::make_index_sequence<names.size()>{});
  toml::array required;
  for (std::size_t i = 0; i < names.size(); ++i)
    if (doc_of<S>.fields[i].required) required.push_back(std::string(names[i]));
  if (!tag.empty()) {
    properties.insert_or_assign("type", toml::table{{"const", std::string(tag)}});
  }
  toml::table schema{
      {"type", "object"}, {"properties", std::move(properties)}, {"additionalProperties", false}};
  if (!required.empty()) schema.insert("required", std::move(required));
  if constexpr (requires(toml::table & t) { S::extend_schema(t); }) S::extend_schema(schema);
  return schema;
}

template <class... A>
toml::table schema_of_union(const std::variant<A...>*) {
  toml::array tags{std::string(A::type)...};
  toml::array branches;
  (branches.push_back(toml::table{
       {"if", toml::table{{"properties", toml::table{{"type", toml::table{{"const", std::string(A::type)}}}}},
                          {"required", toml::array{"type"}}}},
       {"then", schema_of_struct<A>(A::type)}}),
   ...);
  // No `type` key: the first alternative, as the loader does.
  using First = std::variant_alternative_t<0, std::variant<A...>>;
  branches.push_back(toml::table{{"if", toml::table{{"not", toml::table{{"required", toml::array{"type"}}}}}},
                                 {"then", schema_of_struct<First>(First::type)}});
  return toml::table{{"type", "object"},
                     {"properties", toml::table{{"type", toml::table{{"enum", std::move(tags)}}}}},
                     {"allOf", std::move(branches)}};
}

template <class T>
toml::table schema_of_type(const field_doc* doc) {
  toml::table schema;
  if constexpr (std::is_same_v<T, bool>) {
    schema.insert("type", "boolean");
  } else if constexpr (is_integer_v<T>) {
    schema.insert("type", "integer");
    if (doc) add_bounds(schema, *doc);
  } else if constexpr (std::is_floating_point_v<T>) {
    schema.insert("type", "number");
    if (doc) add_bounds(schema, *doc);
  } else if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, std::filesystem::path>) {
    schema.insert("type", "string");
  } else if constexpr (std::is_enum_v<T>) {
    toml::array values;
    for (const auto& e : enum_entries<T>) values.push_back(std::string(e.name));
    schema.insert("type", "string");
    schema.insert("enum", std::move(values));
  } else if constexpr (is_int_or_v<T>) {
    schema.insert("anyOf", toml::array{schema_of_type<std::int64_t>(doc),
                                       schema_of_type<typename T::keyword_type>(nullptr)});
  } else if constexpr (is_optional_v<T>) {
    // TOML has no null: the string "None" stands for it.
    schema.insert("anyOf",
                  toml::array{schema_of_type<typename T::value_type>(doc), toml::table{{"const", "None"}}});
  } else if constexpr (is_vector_v<T>) {
    schema.insert("type", "array");
    schema.insert("items", schema_of_type<typename T::value_type>(doc));
  } else if constexpr (is_string_map_v<T>) {
    schema.insert("type", "object");
    schema.insert("additionalProperties", schema_of_type<typename T::mapped_type>(nullptr));
  } else if constexpr (is_variant_v<T>) {
    schema = schema_of_union(static_cast<const T*>(nullptr));
  } else if constexpr (std::is_same_v<T, opaque_table>) {
    schema.insert("type", "object");
  } else {
    schema = schema_of_struct<T>();
  }
  return schema;
}

}  // namespace detail

template <class T>
toml::table json_schema_table() {
  toml::table schema = detail::schema_of_struct<T>();
  schema.insert_or_assign("$schema", "http://json-schema.org/draft-07/schema#");
  schema.insert_or_assign("title", std::string(detail::type_name<T>()));
  return schema;
}

// The JSON Schema text of T (stable: keys sorted, two-space indent).
template <class T>
std::string json_schema() {
  std::ostringstream os;
  os << toml::json_formatter{json_schema_table<T>()};
  return os.str() + "\n";
}

}  // namespace primecfg
