// Definitions of dump.hpp.
#pragma once

#include <primecfg/dump.hpp>

namespace primecfg {

namespace detail {

// The value as a TOML node (tables for structs; "None" for an empty optional).
template <class T>
void encode_into(toml::table& parent, std::string_view key, const T& value);

template <class T>
toml::table encode_struct(const T& value) {
  toml::table out;
  if constexpr (is_variant_v<T>) {
    std::visit(
        [&](const auto& alternative) {
          out = encode_struct(alternative);
          out.insert_or_assign("type", std::string(std::decay_t<decltype(alternative)>::type));
        },
        value);
  } else {
    constexpr auto names = field_names<T>();
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (encode_into(out, names[I], detail::get_field<I>(value)), ...);
    }
    (std::make_index_sequence<names.size()>{});
  }
  return out;
}

template <class T>
toml::array encode_array(const std::vector<T>& values) {
  toml::array out;
  for (const T& v : values) {
    toml::table holder;
    encode_into(holder, "v", v);
    out.push_back(std::move(*holder.get("v")));
  }
  return out;
}

template <class T>
void encode_into(toml::table& parent, std::string_view key, const T& value) {
  if constexpr (std::is_same_v<T, bool>) {
    parent.insert_or_assign(key, value);
  } else if constexpr (is_integer_v<T>) {
    parent.insert_or_assign(key, static_cast<std::int64_t>(value));
  } else if constexpr (std::is_floating_point_v<T>) {
    parent.insert_or_assign(key, static_cast<double>(value));
  } else if constexpr (std::is_same_v<T, std::string>) {
    parent.insert_or_assign(key, value);
  } else if constexpr (std::is_same_v<T, std::filesystem::path>) {
    parent.insert_or_assign(key, value.string());
  } else if constexpr (std::is_enum_v<T>) {
    parent.insert_or_assign(key, std::string(enum_to_name(value)));
  } else if constexpr (is_int_or_v<T>) {
    if (value.is_number())
      parent.insert_or_assign(key, value.number());
    else
      parent.insert_or_assign(key, std::string(enum_to_name(value.keyword())));
  } else if constexpr (is_optional_v<T>) {
    if (value)
      encode_into(parent, key, *value);
    else
      parent.insert_or_assign(key, "None");
  } else if constexpr (is_vector_v<T>) {
    parent.insert_or_assign(key, encode_array(value));
  } else if constexpr (is_string_map_v<T>) {
    toml::table t;
    for (const auto& [k, v] : value) encode_into(t, k, v);
    parent.insert_or_assign(key, std::move(t));
  } else if constexpr (std::is_same_v<T, opaque_table>) {
    parent.insert_or_assign(key, value.value);
  } else {
    parent.insert_or_assign(key, encode_struct(value));
  }
}

inline std::string format_key(std::string_view key) {
  bool bare = !key.empty();
  for (char c : key)
    bare = bare && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '-');
  return bare ? std::string(key) : quote_toml_string(key);
}

// Sections are those that print as [headers]; everything else is a key = value line.
template <class T>
inline constexpr bool is_section_v = is_struct_v<T> || is_variant_v<T> || is_string_map_v<T> ||
                                     std::is_same_v<T, opaque_table> ||
                                     (is_optional_v<T> && !is_scalar_leaf_v<innermost_t<T>>);

class toml_writer {
 public:
  explicit toml_writer(const provenance_map& sources) : sources_(sources) {}

  template <class T>
  void section(const T& value, const std::string& path) {
    if constexpr (is_optional_v<T>) {
      if (value) section(*value, path);  // an empty optional is written as key = "None" by its parent
    } else if constexpr (std::is_same_v<T, opaque_table>) {
      toml::table wrapped;
      toml::table* current = &wrapped;
      std::string last = path;
      for (std::size_t dot; (dot = last.find('.')) != std::string::npos; last = last.substr(dot + 1))
        current = current->insert(last.substr(0, dot), toml::table{}).first->second.as_table();
      current->insert(last, value.value);
      if (value.value.empty()) header(path);  // the formatter writes the header of a non-empty table
      if (!value.value.empty()) {
        std::ostringstream os;
        os << toml::toml_formatter{wrapped};
        out_ += "# kept as written (not interpreted by primecfg)\n" + os.str() + "\n";
      }
    } else if constexpr (is_string_map_v<T>) {
      header(path);
      for (const auto& [k, v] : value) line(format_key(k), value_text(v), path + "." + k);
    } else if constexpr (is_variant_v<T>) {
      std::visit(
          [&](const auto& alternative) {
            header(path);
            line("type", quote_toml_string(std::decay_t<decltype(alternative)>::type), path + ".type");
            fields(alternative, path, false);
          },
          value);
    } else {
      header(path);
      fields(value, path, true);
    }
  }

  std::string take() { return std::move(out_); }

 private:
  template <class S>
  void fields(const S& value, const std::string& path, bool /*plain struct*/) {
    constexpr auto names = field_names<S>();
    auto child = [&](std::string_view name) {
      return path.empty() ? std::string(name) : path + "." + std::string(name);
    };
    // Plain values first: TOML puts a table's keys before its sub-tables.
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            using F = std::remove_cvref_t<decltype(detail::get_field<I>(value))>;
            const F& f = detail::get_field<I>(value);
            if constexpr (!is_section_v<F>) {
              line(names[I], value_text(f), child(names[I]));
            } else if constexpr (is_optional_v<F>) {
              if (!f) line(names[I], "\"None\"", child(names[I]));
            }
          }(),
          ...);
      (
          [&] {
            using F = std::remove_cvref_t<decltype(detail::get_field<I>(value))>;
            if constexpr (is_section_v<F>) section(detail::get_field<I>(value), child(names[I]));
          }(),
          ...);
    }
    (std::make_index_sequence<names.size()>{});
  }

  void header(const std::string& path) {
    if (path.empty()) return;
    out_ += fmt::format("\n[{}]\n", path);
  }

  // A value nobody set is written commented out: it shows what the config
  // holds, and re-reading the dump leaves it unset, so rules that tell user
  // values from defaults decide the same way again.
  void line(std::string_view key, const std::string& text, const std::string& path) {
    std::string where = origin(path);
    out_ +=
        fmt::format("{}{} = {}  # {}\n", where == "default" ? "# " : "", key, text, toml_comment_text(where));
  }

  std::string origin(const std::string& path) const {
    auto it = sources_.find(path);
    return it == sources_.end() ? std::string("default") : it->second.to_string();
  }

  const provenance_map& sources_;
  std::string out_;
};

}  // namespace detail

// TOML text of the resolved config; every value carries a comment saying
// where it came from ("# a.toml:3:11", "# command line --x"); defaults are
// listed commented out.
template <class T>
std::string dump_toml(const T& value, const provenance_map& sources) {
  detail::toml_writer writer(sources);
  writer.section(value, "");
  return fmt::format("# Resolved {} written by primecfg; comments give each value's source.\n{}",
                     detail::type_name<T>(), writer.take());
}

// The resolved config as a TOML table (empty optionals as "None").
template <class T>
toml::table to_toml_table(const T& value) {
  return detail::encode_struct(value);
}

template <class T>
std::string dump_json(const T& value) {
  std::ostringstream os;
  os << toml::json_formatter{to_toml_table(value)};
  return os.str() + "\n";
}

}  // namespace primecfg
