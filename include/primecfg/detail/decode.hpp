// Decoding one source (a parsed TOML document, or one command-line override)
// onto a config object that already holds the lower-precedence values.
//
// Layering falls out of this: a struct only touches the keys a source names
// (tables deep-merge), a scalar or an array is replaced whole. Every problem
// is appended to the context and decoding goes on, so one pass reports all.
#pragma once

#include <primecfg/describe.hpp>
#include <primecfg/detail/did_you_mean.hpp>
#include <primecfg/detail/enum_names.hpp>
#include <primecfg/detail/field_names.hpp>
#include <primecfg/detail/header_only.hpp>
#include <primecfg/detail/key_depth.hpp>
#include <primecfg/detail/merge.hpp>
#include <primecfg/detail/struct_shape.hpp>
#include <primecfg/detail/type_ops.hpp>
#include <primecfg/detail/value_text.hpp>
#include <primecfg/error.hpp>
#include <primecfg/opaque.hpp>
#include <primecfg/validate.hpp>

#include <fmt/format.h>
#include <primecfg/detail/toml.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// Only where the loader is compiled (detail/header_only.hpp).
#if PRIMECFG_DEFINES_LOADER

namespace primecfg::detail {

inline std::string join_path(std::string_view parent, std::string_view key) {
  if (parent.empty()) return std::string(key);
  return fmt::format("{}.{}", parent, key);
}

inline std::string_view type_name_of(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    default:
      return "nothing";
  }
}

struct decode_context {
  std::vector<diagnostic>* out = nullptr;
  provenance_map* sources = nullptr;
  std::string file;  // the file being decoded (for messages), empty on the command line
  std::string flag;  // the command-line flag being decoded, empty for files

  bool from_command_line() const { return !flag.empty(); }

  provenance where(const toml::node& n) const {
    if (from_command_line()) return provenance::on_command_line(flag);
    const auto& src = n.source();
    std::string path = src.path ? std::string(*src.path) : file;
    return provenance::in_file(std::move(path), src.begin.line, src.begin.column);
  }

  provenance where(const toml::key& k) const {
    if (from_command_line()) return provenance::on_command_line(flag);
    const auto& src = k.source();
    std::string path = src.path ? std::string(*src.path) : file;
    return provenance::in_file(std::move(path), src.begin.line, src.begin.column);
  }

  void error(error_kind kind, std::string path, const toml::node& n, std::string message,
             bool show_input = true) {
    diagnostic d;
    d.kind = kind;
    d.path = std::move(path);
    d.where = where(n);
    d.message = std::move(message);
    if (show_input)
      d.input = from_command_line() && n.is_string() ? std::string(*n.as_string()) : node_text(n);
    out->push_back(std::move(d));
  }

  void record(const std::string& path, const toml::node& n) { (*sources)[path] = where(n); }

  // The fields that earlier sources set in each tagged union (by the union's
  // path), in order, with the flag that set each (empty for a file). When a
  // later source switches the union's `type`, they are decoded again onto
  // the new alternative: nothing a user wrote is dropped silently. A file's
  // key and value are its own nodes (the loader keeps every document until
  // the end, and a copied node loses its line and column); a flag's are
  // copied, as the table built for it is gone when the next one is read.
  struct union_field {
    std::shared_ptr<toml::table> copy;  // holds key and value for a flag
    const toml::key* key = nullptr;
    const toml::node* value = nullptr;
    std::string file, flag;
  };
  std::map<std::string, std::vector<union_field>, std::less<>> union_fields;

  void remember_union_field(const std::string& union_path, const toml::key& key, const toml::node& value) {
    union_field f{nullptr, &key, &value, file, flag};
    if (from_command_line()) {
      f.copy = std::make_shared<toml::table>();
      f.copy->insert(key, value);
      f.key = &f.copy->begin()->first;
      f.value = &f.copy->begin()->second;
    }
    union_fields[union_path].push_back(std::move(f));
  }

  // Drops the provenance of everything below `path` (its value was replaced whole).
  void forget_below(const std::string& path) {
    std::string prefix = path + ".";
    auto it = sources->lower_bound(prefix);
    while (it != sources->end() && it->first.compare(0, prefix.size(), prefix) == 0) it = sources->erase(it);
    forget_unions_from(path);
  }

  // Forgets the union fields remembered at `path` and below it (fields and
  // list elements: "path.x", "path[0]").
  void forget_unions_from(const std::string& path) {
    union_fields.erase(path);
    for (const char* separator : {".", "["}) {
      std::string prefix = path + separator;
      auto it = union_fields.lower_bound(prefix);
      while (it != union_fields.end() && it->first.compare(0, prefix.size(), prefix) == 0)
        it = union_fields.erase(it);
    }
  }
};

// "expected a table, got an integer".
inline void wrong_type(error_kind kind, std::string_view expected, const std::string& path,
                       const toml::node& node, decode_context& ctx) {
  ctx.error(kind, path, node, fmt::format("expected {}, got {}", expected, type_name_of(node)));
}

inline void decode_value(const toml::node& node, void* out, const type_ops& type, const std::string& path,
                         decode_context& ctx);

// ---------------------------------------------------------------- leaves ---

// On the command line every value arrives as text; fields that are not
// strings read it as a TOML value ("5", "1e-4", "true", "[1, 2]", "{}").
inline bool reads_text_as_toml(value_kind kind) {
  return kind != value_kind::string && kind != value_kind::path && kind != value_kind::enumeration &&
         kind != value_kind::opaque && kind != value_kind::optional;
}

inline std::optional<toml::table> parse_cli_text(std::string_view text) {
  std::string doc = "v = ";
  doc += text;
  if (find_deep_key(doc)) return std::nullopt;
  try {
    toml::table parsed = toml::parse(std::string_view(doc), std::string_view("<command line>"));
    // "5\nother = 1" parses too; text after the value would be silently dropped.
    if (parsed.size() != 1) return std::nullopt;
    return parsed;
  } catch (const toml::parse_error&) {
    return std::nullopt;
  }
}

// The command-line string `node` read as a TOML value, held in a one-key
// table {v = ...}; null when it is not one.
inline std::unique_ptr<toml::table> parse_cli_value(const toml::node& node) {
  std::optional<toml::table> parsed = parse_cli_text(node.as_string()->get());
  if (!parsed || !parsed->get("v")) return nullptr;
  return std::make_unique<toml::table>(std::move(*parsed));
}

// An opaque table from one command-line flag (`--eval.flag=false` arrives as
// {flag = "false"}): the value keeps its TOML type, as in a file: false is a
// boolean, 6 an integer, 1.5 a float, [1, 2] an array. Text that is no TOML
// value (x, hello world) stays a string, and "x" (quoted) is the string x.
inline toml::table typed_cli_table(const toml::table& table) {
  toml::table out;
  for (auto&& [key, value] : table) {
    if (const auto* sub = value.as_table()) {
      out.insert(key, typed_cli_table(*sub));
      continue;
    }
    if (const auto* s = value.as_string()) {
      std::optional<toml::table> parsed = parse_cli_text(s->get());
      if (parsed && parsed->get("v")) {
        out.insert(key, *parsed->get("v"));
        continue;
      }
    }
    out.insert(key, value);
  }
  return out;
}

// Calls f with a null pointer to the C++ type of an integer field: the one
// place that maps (bytes, is_signed) back to a type.
template <class F>
decltype(auto) with_integer_type(const type_ops& type, F&& f) {
  switch (type.bytes) {
    case 1:
      return type.is_signed ? f(static_cast<std::int8_t*>(nullptr)) : f(static_cast<std::uint8_t*>(nullptr));
    case 2:
      return type.is_signed ? f(static_cast<std::int16_t*>(nullptr))
                            : f(static_cast<std::uint16_t*>(nullptr));
    case 4:
      return type.is_signed ? f(static_cast<std::int32_t*>(nullptr))
                            : f(static_cast<std::uint32_t*>(nullptr));
    default:
      return type.is_signed ? f(static_cast<std::int64_t*>(nullptr))
                            : f(static_cast<std::uint64_t*>(nullptr));
  }
}

// A numeric field's value as a double, for its bounds.
inline double numeric_value(const void* value, const type_ops& type) {
  if (type.kind == value_kind::floating)
    return type.bytes == sizeof(float) ? *static_cast<const float*>(value)
                                       : *static_cast<const double*>(value);
  return with_integer_type(type, [&](auto* tag) {
    return static_cast<double>(*static_cast<const std::remove_pointer_t<decltype(tag)>*>(value));
  });
}

inline void decode_integer(const toml::node& node, void* out, const type_ops& type, const std::string& path,
                           decode_context& ctx) {
  const auto* v = node.as_integer();
  if (!v) {
    wrong_type(error_kind::int_type, "an integer", path, node, ctx);
    return;
  }
  std::int64_t value = v->get();
  with_integer_type(type, [&](auto* tag) {
    using I = std::remove_pointer_t<decltype(tag)>;
    bool fits;
    if constexpr (std::is_signed_v<I>)
      fits = value >= std::numeric_limits<I>::min() && value <= std::numeric_limits<I>::max();
    else
      fits = value >= 0 && static_cast<std::uint64_t>(value) <= std::numeric_limits<I>::max();
    if (fits) {
      *static_cast<I*>(out) = static_cast<I>(value);
      return;
    }
    ctx.error(error_kind::int_overflow, path, node,
              fmt::format("integer out of range: this field holds {} to {}", +std::numeric_limits<I>::min(),
                          +std::numeric_limits<I>::max()));
  });
}

inline void decode_float(const toml::node& node, void* out, const type_ops& type, const std::string& path,
                         decode_context& ctx) {
  double value;
  if (const auto* f = node.as_floating_point()) {
    value = f->get();
  } else if (const auto* i = node.as_integer()) {
    value = static_cast<double>(i->get());
  } else {
    wrong_type(error_kind::float_type, "a number", path, node, ctx);
    return;
  }
  if (!std::isfinite(value)) {
    ctx.error(error_kind::finite_number, path, node, "expected a finite number");
    return;
  }
  if (type.bytes == sizeof(double)) {
    *static_cast<double*>(out) = value;
    return;
  }
  // Converting a double beyond the range of a float is undefined.
  if (std::fabs(value) > static_cast<double>(std::numeric_limits<float>::max())) {
    ctx.error(error_kind::finite_number, path, node,
              fmt::format("expected a finite number; this field holds at most {}",
                          std::numeric_limits<float>::max()));
    return;
  }
  *static_cast<float*>(out) = static_cast<float>(value);
}

// Finds a string among `names`, or reports the allowed values; the index
// found, or names.size(). Shared by every enum type.
inline std::size_t decode_name(const toml::node& node, std::span<const std::string_view> names,
                               const std::string& path, decode_context& ctx) {
  std::string allowed;
  for (std::string_view name : names) {
    if (!allowed.empty()) allowed += ", ";
    allowed.append("'").append(name).append("'");
  }
  const auto* s = node.as_string();
  if (!s) {
    ctx.error(error_kind::literal_error, path, node,
              fmt::format("expected one of {}, got {}", allowed, type_name_of(node)));
    return names.size();
  }
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == s->get()) return i;
  std::string hint = closest_match(s->get(), names);
  ctx.error(error_kind::literal_error, path, node,
            fmt::format("expected one of {}{}", allowed,
                        hint.empty() ? "" : fmt::format("; did you mean '{}'?", hint)));
  return names.size();
}

// ---------------------------------------------------------------- structs ---

// The tagged union whose active alternative a table is decoded onto (its
// `type` names the alternative); null for a plain struct.
struct union_in_use {
  const union_ops* ops;
  std::size_t active;
};

// A key that names no field of the active alternative but a field of another:
// which `type` has it. Empty when none does.
inline std::string foreign_union_key(const toml::key& key, const std::string& parent, const union_in_use& u,
                                     decode_context& ctx) {
  std::vector<std::string_view> owners;
  for (std::size_t k = 0; k < u.ops->tags.size(); ++k) {
    if (k == u.active) continue;
    std::span<const std::string_view> names = u.ops->alternatives[k]->record->shape->names;
    if (std::find(names.begin(), names.end(), key.str()) != names.end()) owners.push_back(u.ops->tags[k]);
  }
  if (owners.empty()) return {};
  std::string type_path = join_path(parent, "type");
  std::string tags;
  for (std::size_t k = 0; k < owners.size(); ++k)
    tags += fmt::format("{}\"{}\"", k == 0 ? "" : k + 1 == owners.size() ? " or " : ", ", owners[k]);
  auto set = ctx.sources->find(type_path);
  std::string active_where = set == ctx.sources->end() ? std::string("its default")
                                                       : fmt::format("set at {}", set->second.to_string());
  return fmt::format("'{}' belongs to {} = {}, not {} = \"{}\" ({}); set {} = \"{}\" or remove '{}'",
                     key.str(), type_path, tags, type_path, u.ops->tags[u.active], active_where, type_path,
                     owners[0], key.str());
}

inline void report_unknown_key(const toml::key& key, const toml::node& value, const std::string& parent,
                               const struct_shape& shape, decode_context& ctx, const union_in_use* in_union) {
  std::string path = join_path(parent, key.str());
  for (const retired_key& r : shape.retired) {
    if (r.key != key.str()) continue;
    std::string fix = ctx.from_command_line() ? std::string("drop the flag")
                                              : fmt::format("run `{} {}`", r.fix, ctx.where(value).file);
    std::string message;
    if (r.replacement.empty()) {
      message = fmt::format("'{}' was removed; {}", path, fix);
    } else {
      std::string replacement = r.replacement.find('.') != std::string_view::npos
                                    ? std::string(r.replacement)
                                    : join_path(parent, r.replacement);
      message = fmt::format("'{}' was replaced by '{}'; {}", path, replacement, fix);
    }
    ctx.error(error_kind::extra_forbidden, path, value, std::move(message), false);
    ctx.out->back().where = ctx.where(key);
    return;
  }
  if (in_union) {
    std::string message = foreign_union_key(key, parent, *in_union, ctx);
    if (!message.empty()) {
      ctx.error(error_kind::extra_forbidden, path, value, std::move(message), false);
      ctx.out->back().where = ctx.where(key);
      return;
    }
  }
  std::vector<std::string_view> candidates(shape.names.begin(), shape.names.end());
  if (in_union) candidates.push_back("type");
  std::string hint = closest_match(key.str(), candidates);
  std::string where = parent.empty() ? std::string("at the top level") : fmt::format("in [{}]", parent);
  ctx.error(error_kind::extra_forbidden, path, value,
            fmt::format("unknown key '{}' {}{}", key.str(), where,
                        hint.empty() ? "" : fmt::format("; did you mean '{}'?", hint)),
            false);
  ctx.out->back().where = ctx.where(key);
}

// A numeric field (or the value in an optional, or each element of a
// vector) against the bounds its description declares.
inline void check_bounds(void* value, const type_ops& type, const field_doc& doc, const std::string& path,
                         const toml::node& node, decode_context& ctx) {
  if (type.kind == value_kind::optional || type.kind == value_kind::int_or) {
    if (void* contents = type.optional->get(value))
      check_bounds(contents, *type.element, doc, path, node, ctx);
  } else if (type.kind == value_kind::list) {
    // Each element is named (sizes[1]) and placed at its own node; a command-line
    // value arrives as text and is read again for its elements.
    const toml::array* array = node.as_array();
    std::unique_ptr<toml::table> parsed;
    if (!array && ctx.from_command_line() && node.is_string() && (parsed = parse_cli_value(node)))
      array = parsed->get("v")->as_array();
    for (std::size_t i = 0, n = type.list->size(value); i < n; ++i) {
      const toml::node* element = array && i < array->size() ? array->get(i) : &node;
      check_bounds(type.list->at(value, i), *type.element, doc, fmt::format("{}[{}]", path, i), *element,
                   ctx);
    }
  } else if (type.kind == value_kind::integer || type.kind == value_kind::floating) {
    double v = numeric_value(value, type);
    for (std::size_t i = 0; i < doc.bound_count; ++i) {
      const bound& b = doc.bounds[i];
      bool ok = b.kind == bound::ge   ? v >= b.value
                : b.kind == bound::gt ? v > b.value
                : b.kind == bound::le ? v <= b.value
                                      : v < b.value;
      if (ok) continue;
      static constexpr std::string_view words[] = {"greater than or equal to", "greater than",
                                                   "less than or equal to", "less than"};
      static constexpr error_kind kinds[] = {error_kind::greater_than_equal, error_kind::greater_than,
                                             error_kind::less_than_equal, error_kind::less_than};
      ctx.error(kinds[b.kind], path, node, fmt::format("must be {} {}", words[b.kind], b.value));
    }
  }
}

// Every key of `table` onto the struct at `object`: known keys decoded into
// their field, then checked against its bounds; unknown keys reported.
// One key of a table onto the struct at `object`.
inline void decode_entry(const toml::key& key, const toml::node& value, void* object, const type_ops& type,
                         const std::string& path, decode_context& ctx, const union_in_use* in_union) {
  const struct_shape& shape = *type.record->shape;
  const bool is_union = in_union != nullptr;
  if (is_union && key.str() == "type") return;  // the union consumed it
  std::size_t i = 0;
  while (i < shape.names.size() && shape.names[i] != key.str()) ++i;
  if (i == shape.names.size()) {
    report_unknown_key(key, value, path, shape, ctx, in_union);
    return;
  }
  std::string field_path = join_path(path, key.str());
  void* field = shape.field(object, i);
  const type_ops& field_type = *type.record->fields[i];
  std::size_t errors_before = ctx.out->size();
  decode_value(value, field, field_type, field_path, ctx);
  if (ctx.out->size() == errors_before) {
    check_bounds(field, field_type, shape.docs[i], field_path, value, ctx);
    if (is_union) ctx.remember_union_field(path, key, value);
  }
  ctx.record(field_path, value);
}

inline void decode_fields(const toml::table& table, void* object, const type_ops& type,
                          const std::string& path, decode_context& ctx,
                          const union_in_use* in_union = nullptr) {
  for (auto&& entry : table) decode_entry(entry.first, entry.second, object, type, path, ctx, in_union);
}

// The union at `path` switched from the alternative tagged `old_tag` to
// `alternative` (by the `type` at `tag`): the fields earlier sources set are
// decoded again onto it, each from where it was written. A field the new
// alternative does not have is an error naming both places.
inline void carry_union_fields(void* alternative, const type_ops& alternative_type,
                               const union_in_use& in_union, std::string_view old_tag,
                               const std::string& path, const toml::node& tag, decode_context& ctx) {
  std::string_view new_tag = in_union.ops->tags[in_union.active];
  auto found = ctx.union_fields.find(path);
  if (found == ctx.union_fields.end()) return;
  std::vector<decode_context::union_field> earlier = std::move(found->second);
  ctx.forget_unions_from(path);
  const struct_shape& shape = *alternative_type.record->shape;
  provenance tag_where = ctx.where(tag);
  std::string file = std::move(ctx.file), flag = std::move(ctx.flag);
  for (const decode_context::union_field& f : earlier) {
    ctx.file = f.file;
    ctx.flag = f.flag;
    const toml::key& key = *f.key;
    const toml::node& value = *f.value;
    if (std::find(shape.names.begin(), shape.names.end(), key.str()) != shape.names.end()) {
      decode_entry(key, value, alternative, alternative_type, path, ctx, &in_union);
      continue;
    }
    std::string field_path = join_path(path, key.str());
    ctx.error(error_kind::extra_forbidden, field_path, value,
              fmt::format("{} was set for {}.type = \"{}\", but {} sets {}.type = \"{}\", which has no "
                          "field '{}'; remove one of the two",
                          field_path, path, old_tag, tag_where.to_string(), path, new_tag, key.str()));
    ctx.out->back().where = ctx.where(key);
  }
  ctx.file = std::move(file);
  ctx.flag = std::move(flag);
}

// A table onto a std::variant of tagged structs: `type` picks the
// alternative (switching to it resets its fields), the rest goes to it.
inline void decode_union(const toml::table& table, void* out, const type_ops& type, const std::string& path,
                         decode_context& ctx) {
  const union_ops& u = *type.alternatives;
  if (const toml::node* tag = table.get("type")) {
    std::string allowed;
    for (std::string_view t : u.tags) allowed += fmt::format("{}'{}'", allowed.empty() ? "" : ", ", t);
    const auto* s = tag->as_string();
    std::size_t index = u.tags.size();
    if (s)
      for (std::size_t i = 0; i < u.tags.size(); ++i)
        if (u.tags[i] == s->get()) index = i;
    std::string tag_path = join_path(path, "type");
    if (index == u.tags.size()) {
      std::string hint = s ? closest_match(s->get(), u.tags) : std::string();
      ctx.error(error_kind::union_tag_invalid, tag_path, *tag,
                fmt::format("'type' must be one of {}{}", allowed,
                            hint.empty() ? "" : fmt::format("; did you mean '{}'?", hint)));
      return;  // the other keys belong to an alternative we cannot know
    }
    if (std::size_t previous = u.index(out); previous != index) {
      // Switching resets the fields to the new alternative's defaults; what
      // earlier sources set is carried over (or refused) below.
      std::vector<decode_context::union_field> earlier;
      if (auto it = ctx.union_fields.find(path); it != ctx.union_fields.end())
        earlier = std::move(it->second);
      ctx.forget_below(path);
      if (!earlier.empty()) ctx.union_fields[path] = std::move(earlier);
      u.emplace(out, index);
      ctx.record(tag_path, *tag);
      carry_union_fields(u.active(out), *u.alternatives[index], union_in_use{&u, index}, u.tags[previous],
                         path, *tag, ctx);
    }
    ctx.record(tag_path, *tag);
  }
  union_in_use in_use{&u, u.index(out)};
  decode_fields(table, u.active(out), *u.alternatives[in_use.active], path, ctx, &in_use);
}

// `--sizes='[64, 128]'` for `--sizes 64,128`: the flag's text as a TOML array,
// its items quoted where the elements are strings.
inline std::string cli_array_example(const toml::node& node, const type_ops& element, std::string_view flag) {
  std::string text = node.is_string() ? std::string(node.as_string()->get()) : node_text(node);
  bool quoted = element.kind == value_kind::string || element.kind == value_kind::path ||
                element.kind == value_kind::enumeration;
  std::string items;
  for (std::size_t start = 0; start <= text.size();) {
    std::size_t comma = std::min(text.find(',', start), text.size());
    std::string item = text.substr(start, comma - start);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) {
      if (quoted && item.front() != '"' && item.front() != '\'') item = quote_toml_string(item);
      items += (items.empty() ? "" : ", ") + item;
    }
    start = comma + 1;
  }
  return fmt::format("{}='[{}]'", flag, items);
}

// ------------------------------------------------------------ dispatcher ---

// The kind of error "None" is for a field of this kind that is not optional.
inline error_kind none_error_kind(value_kind kind) {
  switch (kind) {
    case value_kind::boolean:
      return error_kind::bool_type;
    case value_kind::integer:
    case value_kind::int_or:
      return error_kind::int_type;
    case value_kind::floating:
      return error_kind::float_type;
    case value_kind::string:
    case value_kind::path:
      return error_kind::string_type;
    case value_kind::enumeration:
      return error_kind::literal_error;
    case value_kind::list:
      return error_kind::array_type;
    default:
      return error_kind::table_type;
  }
}

inline void decode_value(const toml::node& node, void* out, const type_ops& type, const std::string& path,
                         decode_context& ctx) {
  if (reads_text_as_toml(type.kind) && ctx.from_command_line() && node.is_string()) {
    std::unique_ptr<toml::table> parsed = parse_cli_value(node);
    if (parsed) {
      decode_value(*parsed->get("v"), out, type, path, ctx);
      return;
    }
    // Not a TOML value: go on and report it against the string.
  }

  // "None" clears an optional (below); a field that always has a value
  // refuses it, as prime-rl does, instead of reading the text "None".
  if (type.kind != value_kind::optional && type.kind != value_kind::opaque)
    if (const auto* s = node.as_string(); s && s->get() == "None") {
      ctx.error(none_error_kind(type.kind), path, node,
                "\"None\" clears only optional fields; this field always has a value");
      return;
    }

  switch (type.kind) {
    case value_kind::boolean:
      if (const auto* b = node.as_boolean())
        *static_cast<bool*>(out) = b->get();
      else
        wrong_type(error_kind::bool_type, "true or false", path, node, ctx);
      return;
    case value_kind::integer:
      decode_integer(node, out, type, path, ctx);
      return;
    case value_kind::floating:
      decode_float(node, out, type, path, ctx);
      return;
    case value_kind::string:
    case value_kind::path:
      if (const auto* s = node.as_string()) {
        if (type.kind == value_kind::string)
          *static_cast<std::string*>(out) = s->get();
        else
          *static_cast<std::filesystem::path*>(out) = std::filesystem::path(s->get());
      } else {
        wrong_type(error_kind::string_type, "a string", path, node, ctx);
      }
      return;
    case value_kind::enumeration: {
      std::size_t i = decode_name(node, type.enumeration->names, path, ctx);
      if (i < type.enumeration->names.size()) type.enumeration->set(out, i);
      return;
    }
    case value_kind::int_or: {
      // An integer, or one of the keywords (prime-rl's `int | Literal["auto"]`).
      if (node.is_integer()) {
        decode_integer(node, type.optional->engage(out), *type.element, path, ctx);
        return;
      }
      std::span<const std::string_view> names = type.enumeration->names;
      std::string allowed;
      for (std::string_view name : names) allowed += fmt::format(", '{}'", name);
      const auto* s = node.as_string();
      for (std::size_t i = 0; s && i < names.size(); ++i)
        if (names[i] == s->get()) return type.enumeration->set(out, i);
      std::string hint = s ? closest_match(s->get(), names) : std::string();
      ctx.error(s ? error_kind::literal_error : error_kind::int_type, path, node,
                fmt::format("expected an integer or one of {}{}{}", allowed.substr(2),
                            s ? "" : fmt::format(", got {}", type_name_of(node)),
                            hint.empty() ? "" : fmt::format("; did you mean '{}'?", hint)));
      return;
    }
    case value_kind::optional:
      // TOML has no null: the string "None" clears an optional (as in prime-rl).
      if (const auto* s = node.as_string(); s && s->get() == "None") {
        type.optional->reset(out);
        ctx.forget_below(path);
        return;
      }
      // An empty table turns an optional section on with its defaults.
      decode_value(node, type.optional->engage(out), *type.element, path, ctx);
      return;
    case value_kind::list: {
      const auto* array = node.as_array();
      if (!array) {
        wrong_type(error_kind::array_type, "an array", path, node, ctx);
        if (ctx.from_command_line())
          ctx.out->back().message += fmt::format("; on the command line an array is TOML: {}",
                                                 cli_array_example(node, *type.element, ctx.flag));
        return;
      }
      // Replaced whole: unions in the old elements are forgotten.
      ctx.forget_unions_from(path);
      // Decoded aside: a list with a bad element keeps its old value.
      std::unique_ptr<void, void (*)(void*)> result(type.list->make(), type.list->discard);
      std::size_t errors_before = ctx.out->size();
      for (std::size_t i = 0; i < array->size(); ++i)
        decode_value(*array->get(i), type.list->append(result.get()), *type.element,
                     fmt::format("{}[{}]", path, i), ctx);
      if (ctx.out->size() == errors_before) type.list->adopt(out, result.release());
      return;
    }
    case value_kind::string_map: {
      const auto* table = node.as_table();
      if (!table) {
        wrong_type(error_kind::table_type, "a table", path, node, ctx);
        return;
      }
      for (auto&& [key, value] : *table) {
        std::string entry_path = join_path(path, key.str());
        decode_value(value, type.map->entry(out, key.str()), *type.element, entry_path, ctx);
        ctx.record(entry_path, value);
      }
      return;
    }
    case value_kind::opaque: {
      const toml::table* table = node.as_table();
      std::optional<toml::table> parsed;
      if (!table && ctx.from_command_line() && node.is_string()) {
        parsed = parse_cli_text(node.as_string()->get());
        if (parsed) table = parsed->get("v") ? parsed->get("v")->as_table() : nullptr;
      }
      if (!table) {
        wrong_type(error_kind::table_type, "a table", path, node, ctx);
        return;
      }
      if (ctx.from_command_line() && !parsed) {
        merge_tables(static_cast<opaque_table*>(out)->value, typed_cli_table(*table));
        return;
      }
      merge_tables(static_cast<opaque_table*>(out)->value, *table);
      return;
    }
    case value_kind::tagged_union:
    case value_kind::record: {
      const auto* table = node.as_table();
      if (!table) {
        wrong_type(error_kind::table_type, "a table", path, node, ctx);
        return;
      }
      if (type.kind == value_kind::tagged_union)
        decode_union(*table, out, type, path, ctx);
      else
        decode_fields(*table, out, type, path, ctx);
      return;
    }
  }
}

}  // namespace primecfg::detail

#endif  // PRIMECFG_DEFINES_LOADER
