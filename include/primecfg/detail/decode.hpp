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
#include <primecfg/detail/key_depth.hpp>
#include <primecfg/detail/merge.hpp>
#include <primecfg/detail/struct_shape.hpp>
#include <primecfg/detail/type_traits.hpp>
#include <primecfg/detail/value_text.hpp>
#include <primecfg/error.hpp>
#include <primecfg/opaque.hpp>
#include <primecfg/validate.hpp>

#include <fmt/format.h>
#include <primecfg/detail/toml.hpp>

#include <cmath>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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

  // Drops the provenance of everything below `path` (its value was replaced whole).
  void forget_below(const std::string& path) {
    std::string prefix = path + ".";
    auto it = sources->lower_bound(prefix);
    while (it != sources->end() && it->first.compare(0, prefix.size(), prefix) == 0) it = sources->erase(it);
  }
};

// "expected a table, got an integer": one out-of-line function for every
// type check, so the per-type decoders stay small.
[[gnu::noinline]] inline void wrong_type(error_kind kind, std::string_view expected, const std::string& path,
                                         const toml::node& node, decode_context& ctx) {
  ctx.error(kind, path, node, fmt::format("expected {}, got {}", expected, type_name_of(node)));
}

template <class T>
[[gnu::noinline]] void decode_value(const toml::node& node, T& out, const std::string& path,
                                    decode_context& ctx);

// ---------------------------------------------------------------- leaves ---

// On the command line every value arrives as text; fields that are not
// strings read it as a TOML value ("5", "1e-4", "true", "[1, 2]", "{}").
template <class T>
inline constexpr bool reads_text_as_toml =
    !std::is_same_v<T, std::string> && !std::is_same_v<T, std::filesystem::path> && !std::is_enum_v<T> &&
    !std::is_same_v<T, opaque_table> && !is_optional_v<T>;

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
[[gnu::noinline]] inline std::unique_ptr<toml::table> parse_cli_value(const toml::node& node) {
  std::optional<toml::table> parsed = parse_cli_text(node.as_string()->get());
  if (!parsed || !parsed->get("v")) return nullptr;
  return std::make_unique<toml::table>(std::move(*parsed));
}

template <class T>
void decode_integer(const toml::node& node, T& out, const std::string& path, decode_context& ctx) {
  const auto* v = node.as_integer();
  if (!v) {
    wrong_type(error_kind::int_type, "an integer", path, node, ctx);
    return;
  }
  std::int64_t value = v->get();
  bool fits;
  if constexpr (std::is_signed_v<T>) {
    fits = value >= static_cast<std::int64_t>(std::numeric_limits<T>::min()) &&
           value <= static_cast<std::int64_t>(std::numeric_limits<T>::max());
  } else {
    fits = value >= 0 && static_cast<std::uint64_t>(value) <= std::numeric_limits<T>::max();
  }
  if (!fits) {
    ctx.error(error_kind::int_overflow, path, node,
              fmt::format("integer out of range: this field holds {} to {}", +std::numeric_limits<T>::min(),
                          +std::numeric_limits<T>::max()));
    return;
  }
  out = static_cast<T>(value);
}

template <class T>
void decode_float(const toml::node& node, T& out, const std::string& path, decode_context& ctx) {
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
  // Converting a double beyond the range of a narrower type is undefined.
  if (std::fabs(value) > static_cast<double>(std::numeric_limits<T>::max())) {
    ctx.error(
        error_kind::finite_number, path, node,
        fmt::format("expected a finite number; this field holds at most {}", std::numeric_limits<T>::max()));
    return;
  }
  out = static_cast<T>(value);
}

// Finds a string among `names`, or reports the allowed values; the index
// found, or names.size(). Shared by every enum type.
[[gnu::noinline]] inline std::size_t decode_name(const toml::node& node,
                                                 std::span<const std::string_view> names,
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

template <class E>
void decode_enum(const toml::node& node, E& out, const std::string& path, decode_context& ctx) {
  std::size_t i = decode_name(node, enum_name_list<E>, path, ctx);
  if (i < enum_entries<E>.size()) out = enum_entries<E>[i].value;
}

// ---------------------------------------------------------------- structs ---

[[gnu::noinline]] inline void report_unknown_key(const toml::key& key, const toml::node& value,
                                                 const std::string& parent, const struct_shape& shape,
                                                 decode_context& ctx, bool is_union) {
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
  std::vector<std::string_view> candidates(shape.names.begin(), shape.names.end());
  if (is_union) candidates.push_back("type");
  std::string hint = closest_match(key.str(), candidates);
  std::string where = parent.empty() ? std::string("at the top level") : fmt::format("in [{}]", parent);
  ctx.error(error_kind::extra_forbidden, path, value,
            fmt::format("unknown key '{}' {}{}", key.str(), where,
                        hint.empty() ? "" : fmt::format("; did you mean '{}'?", hint)),
            false);
  ctx.out->back().where = ctx.where(key);
}

template <class M>
void check_bounds(const M& value, const field_doc& doc, const std::string& path, const toml::node& node,
                  decode_context& ctx) {
  if constexpr (is_optional_v<M>) {
    if (value) check_bounds(*value, doc, path, node, ctx);
  } else if constexpr (is_vector_v<M>) {
    for (const auto& v : value) check_bounds(v, doc, path, node, ctx);
  } else if constexpr (is_numeric_v<M>) {
    for (std::size_t i = 0; i < doc.bound_count; ++i) {
      const bound& b = doc.bounds[i];
      double v = static_cast<double>(value);
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

// Decodes one field of type M that sits at `field`, then checks its bounds.
using field_decoder = void (*)(const toml::node& node, void* field, const std::string& path,
                               const field_doc& doc, decode_context& ctx);

template <class M>
void decode_field(const toml::node& node, void* field, const std::string& path, const field_doc& doc,
                  decode_context& ctx) {
  M& value = *static_cast<M*>(field);
  std::size_t errors_before = ctx.out->size();
  decode_value(node, value, path, ctx);
  if (ctx.out->size() == errors_before) check_bounds(value, doc, path, node, ctx);
}

template <class T, std::size_t... I>
constexpr std::array<field_decoder, sizeof...(I)> decoders_of(std::index_sequence<I...>) {
  return {&decode_field<field_type_t<T, I>>...};
}

template <class T>
inline constexpr auto field_decoders = decoders_of<T>(field_indices<T>);

// Every key of `table` onto the struct at `object`: known keys through the
// field's decoder, unknown ones reported. Compiled once for all structs.
[[gnu::noinline]] inline void decode_fields(const toml::table& table, void* object, const struct_shape& shape,
                                            const field_decoder* decoders, const std::string& path,
                                            decode_context& ctx, bool is_union) {
  for (auto&& entry : table) {
    const toml::key& key = entry.first;
    const toml::node& value = entry.second;
    if (is_union && key.str() == "type") continue;  // the union consumed it
    std::size_t i = 0;
    while (i < shape.names.size() && shape.names[i] != key.str()) ++i;
    if (i == shape.names.size()) {
      report_unknown_key(key, value, path, shape, ctx, is_union);
      continue;
    }
    std::string field_path = join_path(path, key.str());
    decoders[i](value, shape.field(object, i), field_path, shape.docs[i], ctx);
    ctx.record(field_path, value);
  }
}

template <class T>
void decode_struct(const toml::table& table, T& out, const std::string& path, decode_context& ctx,
                   bool is_union = false) {
  decode_fields(table, &out, shape_of<T>(), field_decoders<T>.data(), path, ctx, is_union);
}

template <class... A>
void decode_union(const toml::table& table, std::variant<A...>& out, const std::string& path,
                  decode_context& ctx) {
  static constexpr std::string_view tags[] = {A::type...};
  if (const toml::node* tag = table.get("type")) {
    std::string allowed;
    for (std::string_view t : tags) allowed += fmt::format("{}'{}'", allowed.empty() ? "" : ", ", t);
    const auto* s = tag->as_string();
    std::size_t index = sizeof...(A);
    if (s)
      for (std::size_t i = 0; i < sizeof...(A); ++i)
        if (tags[i] == s->get()) index = i;
    std::string tag_path = join_path(path, "type");
    if (index == sizeof...(A)) {
      std::string hint = s ? closest_match(s->get(), tags) : std::string();
      ctx.error(error_kind::union_tag_invalid, tag_path, *tag,
                fmt::format("'type' must be one of {}{}", allowed,
                            hint.empty() ? "" : fmt::format("; did you mean '{}'?", hint)));
      return;  // the other keys belong to an alternative we cannot know
    }
    if (out.index() != index) {
      ctx.forget_below(path);
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        ((I == index ? void(out.template emplace<I>()) : void()), ...);
      }
      (std::index_sequence_for<A...>{});
    }
    ctx.record(tag_path, *tag);
  }
  std::visit([&](auto& alternative) { decode_struct(table, alternative, path, ctx, true); }, out);
}

// ------------------------------------------------------------ dispatcher ---

template <class T>
[[gnu::noinline]] void decode_value(const toml::node& node, T& out, const std::string& path,
                                    decode_context& ctx) {
  if constexpr (reads_text_as_toml<T>) {
    if (ctx.from_command_line() && node.is_string()) {
      std::unique_ptr<toml::table> parsed = parse_cli_value(node);
      if (parsed) {
        decode_value(*parsed->get("v"), out, path, ctx);
        return;
      }
      // Not a TOML value: fall through and report it against the string.
    }
  }

  if constexpr (std::is_same_v<T, bool>) {
    if (const auto* b = node.as_boolean())
      out = b->get();
    else
      wrong_type(error_kind::bool_type, "true or false", path, node, ctx);
  } else if constexpr (is_integer_v<T>) {
    decode_integer(node, out, path, ctx);
  } else if constexpr (std::is_floating_point_v<T>) {
    decode_float(node, out, path, ctx);
  } else if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, std::filesystem::path>) {
    if (const auto* s = node.as_string())
      out = T(s->get());
    else
      wrong_type(error_kind::string_type, "a string", path, node, ctx);
  } else if constexpr (std::is_enum_v<T>) {
    decode_enum(node, out, path, ctx);
  } else if constexpr (is_optional_v<T>) {
    // TOML has no null: the string "None" clears an optional (as in prime-rl).
    if (const auto* s = node.as_string(); s && s->get() == "None") {
      out.reset();
      ctx.forget_below(path);
      return;
    }
    if (!out) out.emplace();  // an empty table turns an optional section on with its defaults
    decode_value(node, *out, path, ctx);
  } else if constexpr (is_vector_v<T>) {
    const auto* array = node.as_array();
    if (!array) {
      wrong_type(error_kind::array_type, "an array", path, node, ctx);
      return;
    }
    T result;
    std::size_t errors_before = ctx.out->size();
    for (std::size_t i = 0; i < array->size(); ++i) {
      typename T::value_type element{};
      decode_value(*array->get(i), element, fmt::format("{}[{}]", path, i), ctx);
      result.push_back(std::move(element));
    }
    if (ctx.out->size() == errors_before) out = std::move(result);
  } else if constexpr (is_string_map_v<T>) {
    const auto* table = node.as_table();
    if (!table) {
      wrong_type(error_kind::table_type, "a table", path, node, ctx);
      return;
    }
    for (auto&& [key, value] : *table) {
      std::string entry_path = join_path(path, key.str());
      decode_value(value, out[std::string(key.str())], entry_path, ctx);
      ctx.record(entry_path, value);
    }
  } else if constexpr (is_variant_v<T>) {
    const auto* table = node.as_table();
    if (!table) {
      wrong_type(error_kind::table_type, "a table", path, node, ctx);
      return;
    }
    decode_union(*table, out, path, ctx);
  } else if constexpr (std::is_same_v<T, opaque_table>) {
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
    merge_tables(out.value, *table);
  } else if constexpr (is_struct_v<T>) {
    const auto* table = node.as_table();
    if (!table) {
      wrong_type(error_kind::table_type, "a table", path, node, ctx);
      return;
    }
    decode_struct(*table, out, path, ctx);
  } else {
    static_assert(sizeof(T) == 0, "primecfg: unsupported field type");
  }
}

}  // namespace primecfg::detail
