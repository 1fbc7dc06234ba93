// Definitions of help.hpp.
#pragma once

#include <primecfg/help.hpp>

namespace primecfg {

namespace detail {

template <class T>
std::string type_hint() {
  if constexpr (std::is_same_v<T, bool>) {
    return "";
  } else if constexpr (is_integer_v<T>) {
    return "INT";
  } else if constexpr (std::is_floating_point_v<T>) {
    return "FLOAT";
  } else if constexpr (std::is_same_v<T, std::filesystem::path>) {
    return "PATH";
  } else if constexpr (std::is_enum_v<T>) {
    std::string out;
    for (const auto& e : enum_entries<T>) out += (out.empty() ? "" : "|") + std::string(e.name);
    return "{" + out + "}";
  } else if constexpr (is_int_or_v<T>) {
    return "INT|" + type_hint<typename T::keyword_type>();
  } else if constexpr (is_optional_v<T>) {
    std::string inner = type_hint<typename T::value_type>();
    return (inner.empty() ? "BOOL" : inner) + "|None";
  } else if constexpr (is_vector_v<T>) {
    return "[" + type_hint<typename T::value_type>() + ", ...]";
  } else {
    return "TEXT";
  }
}

// A field's bounds for --help: "1..65535", ">= 0", "> 0, <= 1"; empty when none.
inline std::string bounds_text(const field_doc& doc) {
  const bound* lower = nullptr;
  const bound* upper = nullptr;
  for (std::size_t i = 0; i < doc.bound_count; ++i)
    (doc.bounds[i].kind == bound::ge || doc.bounds[i].kind == bound::gt ? lower : upper) = &doc.bounds[i];
  if (doc.bound_count == 2 && lower && upper && lower->kind == bound::ge && upper->kind == bound::le)
    return fmt::format("{}..{}", lower->value, upper->value);
  static constexpr std::string_view ops[] = {">=", ">", "<=", "<"};
  std::string out;
  for (std::size_t i = 0; i < doc.bound_count; ++i)
    out += fmt::format("{}{} {}", out.empty() ? "" : ", ", ops[doc.bounds[i].kind], doc.bounds[i].value);
  return out;
}

inline std::string kebab(std::string s) {
  for (char& c : s)
    if (c == '_') c = '-';
  return s;
}

template <class S>
void help_for_struct(std::string& out, const S& defaults, const std::string& prefix);

template <class... A>
void help_for_union(std::string& out, const std::variant<A...>*, const std::string& flag,
                    std::string_view description) {
  std::string tags;
  ((tags += (tags.empty() ? "" : "|") + std::string(A::type)), ...);
  out += fmt::format("  --{}.type {{{}}}\n      {}\n", flag, tags, description);
  ((out += fmt::format("    with {}.type = \"{}\":\n", flag, A::type), help_for_struct(out, A{}, flag + ".")),
   ...);
}

template <class S>
void help_for_struct(std::string& out, const S& defaults, const std::string& prefix) {
  constexpr auto names = field_names<S>();
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (
        [&] {
          using F = std::remove_cvref_t<decltype(detail::get_field<I>(defaults))>;
          const F& value = detail::get_field<I>(defaults);
          const field_doc& doc = doc_of<S>.fields[I];
          std::string flag = prefix + kebab(std::string(names[I]));
          if constexpr (is_variant_v<F>) {
            help_for_union(out, static_cast<const F*>(nullptr), flag, doc.description);
          } else if constexpr (is_struct_v<F>) {
            help_for_struct(out, value, flag + ".");
          } else if constexpr (is_optional_struct_v<F>) {
            out += fmt::format("  --{} / --no-{}\n      {} (default: {})\n", flag, flag, doc.description,
                               value ? "on" : "off");
            help_for_struct(out, value ? *value : typename F::value_type{}, flag + ".");
          } else if constexpr (std::is_same_v<F, bool>) {
            out += fmt::format("  --{} / --no-{}\n      {} (default: {})\n", flag, flag, doc.description,
                               value_text(value));
          } else if constexpr (is_scalar_leaf_v<innermost_t<F>>) {
            std::string bounds = bounds_text(doc);
            out += fmt::format("  --{} {}{}\n      {} (default: {})\n", flag, type_hint<F>(),
                               bounds.empty() ? "" : fmt::format(" ({})", bounds), doc.description,
                               value_text(value));
          } else {
            out += fmt::format("  --{}.<key> ...\n      {}\n", flag, doc.description);
          }
        }(),
        ...);
  }
  (std::make_index_sequence<names.size()>{});
}

// Markdown: one table per section, one row per field.
template <class S>
void reference_for_struct(std::string& out, const S& defaults, const std::string& path,
                          std::string_view note);

template <class... A>
void reference_for_union(std::string& out, const std::variant<A...>*, const std::string& path) {
  ((reference_for_struct(out, A{}, path, fmt::format("with `type = \"{}\"`", A::type))), ...);
}

inline std::string markdown_cell(std::string text) {
  std::string out;
  for (char c : text) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

template <class S>
void reference_for_struct(std::string& out, const S& defaults, const std::string& path,
                          std::string_view note) {
  constexpr auto names = field_names<S>();
  std::string rows;
  std::string nested;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (
        [&] {
          using F = std::remove_cvref_t<decltype(detail::get_field<I>(defaults))>;
          const F& value = detail::get_field<I>(defaults);
          const field_doc& doc = doc_of<S>.fields[I];
          std::string key(names[I]);
          std::string child = path.empty() ? key : path + "." + key;
          std::string bounds;
          for (std::size_t b = 0; b < doc.bound_count; ++b) {
            static constexpr std::string_view ops[] = {">=", ">", "<=", "<"};
            bounds += fmt::format("{}{} {}", bounds.empty() ? "" : ", ", ops[doc.bounds[b].kind],
                                  doc.bounds[b].value);
          }
          if constexpr (is_variant_v<F>) {
            rows += fmt::format("| `{}` | table, tagged union on `type` | | {} |\n", key,
                                markdown_cell(std::string(doc.description)));
            reference_for_union(nested, static_cast<const F*>(nullptr), child);
          } else if constexpr (is_struct_v<F>) {
            rows +=
                fmt::format("| `{}` | table | | {} |\n", key, markdown_cell(std::string(doc.description)));
            reference_for_struct(nested, value, child, "");
          } else if constexpr (is_optional_struct_v<F>) {
            rows += fmt::format("| `{}` | optional table | {} | {} |\n", key, value ? "on" : "off (\"None\")",
                                markdown_cell(std::string(doc.description)));
            reference_for_struct(nested, value ? *value : typename F::value_type{}, child, "");
          } else if constexpr (is_string_map_v<F>) {
            rows += fmt::format("| `{}` | table of strings | `{{}}` | {} |\n", key,
                                markdown_cell(std::string(doc.description)));
          } else if constexpr (std::is_same_v<F, opaque_table> ||
                               std::is_same_v<F, std::optional<opaque_table>>) {
            rows += fmt::format("| `{}` | table, not interpreted | | {} |\n", key,
                                markdown_cell(std::string(doc.description)));
          } else {
            std::string type = type_hint<F>();
            if (type.empty()) type = "bool";
            if (!bounds.empty()) type += ", " + bounds;
            rows +=
                fmt::format("| `{}` | {} | `{}` | {} |\n", key, markdown_cell(type),
                            markdown_cell(value_text(value)), markdown_cell(std::string(doc.description)));
          }
        }(),
        ...);
  }
  (std::make_index_sequence<names.size()>{});
  out +=
      fmt::format("\n### `[{}]`{}\n\n| key | type | default | description |\n| --- | --- | --- | --- |\n{}",
                  path.empty() ? "top level" : path, note.empty() ? "" : fmt::format(" {}", note), rows);
  out += nested;
}

}  // namespace detail

// The Markdown reference of every field of T (docs/config-reference.md).
template <class T>
std::string markdown_reference() {
  std::string out;
  detail::reference_for_struct(out, T{}, "", "");
  return out;
}

// One entry per settable field: flag, accepted values, description, default.
template <class T>
std::string help_text() {
  std::string out;
  detail::help_for_struct(out, T{}, "");
  return out;
}

}  // namespace primecfg
