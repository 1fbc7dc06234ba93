// A field's type as data: what kind of value it is, and the few operations the
// loaders cannot do without knowing the C++ type (engage an optional, append
// to a vector, switch a variant's alternative, set an enum by index).
//
// Decoding, the field index the rules use and command-line flag lookup are
// plain functions over this description, compiled once however many types a
// config tree has. Per type only the description and a handful of one-line
// functions are instantiated. With one template body per field type for each
// of the three walks, that code was most of the compile time of a translation
// unit that loads the shipped tree (docs/performance.md).
#pragma once

#include <primecfg/describe.hpp>
#include <primecfg/detail/enum_names.hpp>
#include <primecfg/detail/struct_shape.hpp>
#include <primecfg/detail/type_traits.hpp>
#include <primecfg/int_or.hpp>
#include <primecfg/opaque.hpp>
#include <primecfg/validate.hpp>

#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <typeinfo>
#include <utility>
#include <variant>

namespace primecfg::detail {

enum class value_kind : unsigned char {
  boolean,
  integer,
  floating,
  string,
  path,
  enumeration,
  optional,
  list,
  string_map,
  tagged_union,
  opaque,
  record,
  int_or,  // primecfg::int_or<E>: element (the integer), optional (its storage), enumeration (the keywords)
};

struct type_ops;

struct enum_ops {
  std::span<const std::string_view> names;
  void (*set)(void* value, std::size_t index);  // value = the enumerator names[index] spells
};

struct optional_ops {
  void* (*get)(void* value);     // the contents, or null when empty
  void* (*engage)(void* value);  // the contents, default-constructed first when empty
  void (*reset)(void* value);
};

struct list_ops {
  std::size_t (*size)(const void* list);
  void* (*at)(void* list, std::size_t i);
  void* (*make)();                        // a new empty list, owned by the caller
  void* (*append)(void* list);            // a default element at the end
  void (*adopt)(void* list, void* made);  // list = what make() returned, which is freed
  void (*discard)(void* made);            // frees what make() returned
};

struct map_ops {
  using visitor = void (*)(void* context, const std::string& key, void* value);
  void* (*entry)(void* map, std::string_view key);  // inserted with a default value when absent
  void (*for_each)(void* map, visitor visit, void* context);
};

struct union_ops {
  std::span<const std::string_view> tags;  // each alternative's `type`
  std::span<const type_ops* const> alternatives;
  std::size_t (*index)(const void* value);
  void (*emplace)(void* value, std::size_t index);  // a default-constructed alternative
  void* (*active)(void* value);
};

struct record_ops {
  const struct_shape* shape;
  std::span<const type_ops* const> fields;        // in the order of shape->names
  void (*validate)(void* object, validation& v);  // null when the struct has no validate()
  void (*share)(void* object, validation& v);     // null when the struct has no share()
};

struct type_ops {
  value_kind kind;
  const std::type_info* type;
  unsigned char bytes = 0;            // integer, floating: sizeof the value
  bool is_signed = false;             // integer
  const type_ops* element = nullptr;  // optional, list, string_map: the contained type
  const enum_ops* enumeration = nullptr;
  const optional_ops* optional = nullptr;
  const list_ops* list = nullptr;
  const map_ops* map = nullptr;
  const union_ops* alternatives = nullptr;
  const record_ops* record = nullptr;
};

template <class T>
constexpr type_ops make_type_ops();

// The description of T; its address identifies the type to the loaders.
template <class T>
inline constexpr type_ops ops_of = make_type_ops<T>();

// ----------------------------------------------- per-type operations ---

template <class E>
struct enum_access {
  static void set(void* value, std::size_t index) { *static_cast<E*>(value) = enum_entries<E>[index].value; }
};
template <class E>
inline constexpr enum_ops enum_ops_of{enum_name_list<E>, &enum_access<E>::set};

template <class O>
struct optional_access {
  static void* get(void* value) {
    auto& o = *static_cast<O*>(value);
    return o ? &*o : nullptr;
  }
  static void* engage(void* value) {
    auto& o = *static_cast<O*>(value);
    if (!o) o.emplace();
    return &*o;
  }
  static void reset(void* value) { static_cast<O*>(value)->reset(); }
};
template <class O>
inline constexpr optional_ops optional_ops_of{&optional_access<O>::get, &optional_access<O>::engage,
                                              &optional_access<O>::reset};

template <class L>
struct list_access {
  static std::size_t size(const void* list) { return static_cast<const L*>(list)->size(); }
  static void* at(void* list, std::size_t i) { return &(*static_cast<L*>(list))[i]; }
  static void* make() { return new L(); }
  static void* append(void* list) { return &static_cast<L*>(list)->emplace_back(); }
  static void adopt(void* list, void* made) {
    *static_cast<L*>(list) = std::move(*static_cast<L*>(made));
    delete static_cast<L*>(made);
  }
  static void discard(void* made) { delete static_cast<L*>(made); }
};
template <class L>
inline constexpr list_ops list_ops_of{&list_access<L>::size,  &list_access<L>::at,
                                      &list_access<L>::make,  &list_access<L>::append,
                                      &list_access<L>::adopt, &list_access<L>::discard};

template <class M>
struct map_access {
  static void* entry(void* map, std::string_view key) { return &(*static_cast<M*>(map))[std::string(key)]; }
  static void for_each(void* map, map_ops::visitor visit, void* context) {
    for (auto& [key, value] : *static_cast<M*>(map)) visit(context, key, &value);
  }
};
template <class M>
inline constexpr map_ops map_ops_of{&map_access<M>::entry, &map_access<M>::for_each};

template <class V>
struct union_access;
template <class... A>
struct union_access<std::variant<A...>> {
  using V = std::variant<A...>;
  static constexpr std::string_view tags[] = {A::type...};
  static constexpr const type_ops* alternatives[] = {&ops_of<A>...};
  static std::size_t index(const void* value) { return static_cast<const V*>(value)->index(); }
  static void emplace(void* value, std::size_t index) {
    V& v = *static_cast<V*>(value);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((I == index ? void(v.template emplace<I>()) : void()), ...);
    }
    (std::index_sequence_for<A...>{});
  }
  static void* active(void* value) {
    return std::visit([](auto& alternative) -> void* { return &alternative; }, *static_cast<V*>(value));
  }
};
template <class V>
inline constexpr union_ops union_ops_of{union_access<V>::tags, union_access<V>::alternatives,
                                        &union_access<V>::index, &union_access<V>::emplace,
                                        &union_access<V>::active};

// int_or<E>: `optional` reaches the integer (get: null while a keyword is
// held; engage: switches to an integer), `enumeration` sets a keyword.
template <class I>
struct int_or_access {
  using E = typename I::keyword_type;
  static void* get(void* value) {
    auto& v = static_cast<I*>(value)->value;
    return v.index() == 0 ? &std::get<0>(v) : nullptr;
  }
  static void* engage(void* value) {
    auto& v = static_cast<I*>(value)->value;
    if (v.index() != 0) v.template emplace<0>(0);
    return &std::get<0>(v);
  }
  static void reset(void*) {}
  static void set(void* value, std::size_t index) {
    static_cast<I*>(value)->value.template emplace<1>(enum_entries<E>[index].value);
  }
};
template <class I>
inline constexpr optional_ops int_or_number_ops{&int_or_access<I>::get, &int_or_access<I>::engage,
                                                &int_or_access<I>::reset};
template <class I>
inline constexpr enum_ops int_or_keyword_ops{enum_name_list<typename I::keyword_type>,
                                             &int_or_access<I>::set};

template <class T, std::size_t... I>
constexpr std::array<const type_ops*, sizeof...(I)> field_ops_array(std::index_sequence<I...>) {
  return {&ops_of<field_type_t<T, I>>...};
}
template <class T>
inline constexpr auto field_ops_of = field_ops_array<T>(field_indices<T>);

template <class T>
void validate_record(void* object, validation& v) {
  static_cast<T*>(object)->validate(v);
}
template <class T>
constexpr auto validator_of() -> void (*)(void*, validation&) {
  if constexpr (requires(T & value, validation & v) { value.validate(v); })
    return &validate_record<T>;
  else
    return nullptr;
}
template <class T>
void share_record(void* object, validation& v) {
  static_cast<T*>(object)->share(v);
}
template <class T>
constexpr auto sharer_of() -> void (*)(void*, validation&) {
  if constexpr (requires(T & value, validation & v) { value.share(v); })
    return &share_record<T>;
  else
    return nullptr;
}
template <class T>
inline constexpr record_ops record_ops_of{&shape_of<T>, field_ops_of<T>, validator_of<T>(), sharer_of<T>()};

template <class T>
constexpr type_ops make_type_ops() {
  type_ops t{value_kind::record, &typeid(T)};
  if constexpr (std::is_same_v<T, bool>) {
    t.kind = value_kind::boolean;
  } else if constexpr (is_integer_v<T>) {
    t.kind = value_kind::integer;
    t.bytes = sizeof(T);
    t.is_signed = std::is_signed_v<T>;
    static_assert(sizeof(T) <= 8, "primecfg: integers of more than 64 bits are not supported");
  } else if constexpr (std::is_floating_point_v<T>) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                  "primecfg: floating-point fields are float or double");
    t.kind = value_kind::floating;
    t.bytes = sizeof(T);
  } else if constexpr (std::is_same_v<T, std::string>) {
    t.kind = value_kind::string;
  } else if constexpr (std::is_same_v<T, std::filesystem::path>) {
    t.kind = value_kind::path;
  } else if constexpr (std::is_enum_v<T>) {
    t.kind = value_kind::enumeration;
    t.enumeration = &enum_ops_of<T>;
  } else if constexpr (is_optional_v<T>) {
    t.kind = value_kind::optional;
    t.element = &ops_of<typename T::value_type>;
    t.optional = &optional_ops_of<T>;
  } else if constexpr (is_vector_v<T>) {
    t.kind = value_kind::list;
    t.element = &ops_of<typename T::value_type>;
    t.list = &list_ops_of<T>;
  } else if constexpr (is_string_map_v<T>) {
    t.kind = value_kind::string_map;
    t.element = &ops_of<typename T::mapped_type>;
    t.map = &map_ops_of<T>;
  } else if constexpr (is_variant_v<T>) {
    t.kind = value_kind::tagged_union;
    t.alternatives = &union_ops_of<T>;
  } else if constexpr (is_int_or_v<T>) {
    t.kind = value_kind::int_or;
    // A dependent name: a non-dependent ops_of<std::int64_t> would be instantiated
    // where this template is defined, before its body is complete (g++ 13 refuses).
    t.element = &ops_of<typename T::number_type>;
    t.optional = &int_or_number_ops<T>;
    t.enumeration = &int_or_keyword_ops<T>;
  } else if constexpr (std::is_same_v<T, opaque_table>) {
    t.kind = value_kind::opaque;
  } else if constexpr (is_struct_v<T>) {
    t.kind = value_kind::record;
    t.record = &record_ops_of<T>;
  } else if constexpr (std::is_class_v<T> && !std::is_aggregate_v<T>) {
    static_assert(
        sizeof(T) == 0,
        "primecfg: a config struct must be an aggregate (T in the 'In instantiation of' line above): "
        "no user-declared constructor, no private or protected field, no virtual function or base");
  } else {
    static_assert(sizeof(T) == 0,
                  "primecfg: unsupported field type (T in the 'In instantiation of' line above)");
  }
  return t;
}

}  // namespace primecfg::detail
