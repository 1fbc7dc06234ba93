// Prints a libFuzzer dictionary for the config tree: every field name, table
// header and command-line flag of SFTConfig and RLConfig, the enum spellings
// and union tags, the keys that migrations retired, and TOML punctuation.
// The build runs it, so the dictionary follows the structs.
//
//   make_dictionary load      dictionary for fuzz_load (flags included)
//   make_dictionary migrate   dictionary for fuzz_migrate (legacy keys first)
#include <primecfg/detail/enum_names.hpp>
#include <primecfg/detail/field_names.hpp>
#include <primecfg/detail/type_traits.hpp>
#include <primecfg/rl.hpp>
#include <primecfg/sft.hpp>

#include <cstdio>
#include <set>
#include <string>
#include <string_view>
#include <variant>

namespace {

struct dictionary {
  std::set<std::string> entries;
  bool flags = false;

  void add(std::string_view token) {
    std::string escaped;
    for (unsigned char c : token) {
      if (c == '"' || c == '\\')
        escaped += std::string("\\") + static_cast<char>(c);
      else if (c < 0x20 || c >= 0x7f) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\x%02X", c);
        escaped += buf;
      } else {
        escaped += static_cast<char>(c);
      }
    }
    entries.insert("\"" + escaped + "\"");
  }
};

std::string join(const std::string& parent, std::string_view name) {
  return parent.empty() ? std::string(name) : parent + "." + std::string(name);
}

template <class T>
void add_type(dictionary& d, const std::string& path);

template <class... A>
void add_union(dictionary& d, const std::variant<A...>*, const std::string& path) {
  d.add("type");
  ((d.add(std::string("\"") + std::string(A::type) + "\""), add_type<A>(d, path)), ...);
}

template <class T>
void add_type(dictionary& d, const std::string& path) {
  using namespace primecfg::detail;
  if constexpr (is_optional_v<T>) {
    d.add("\"None\"");
    add_type<typename T::value_type>(d, path);
  } else if constexpr (is_vector_v<T>) {
    add_type<typename T::value_type>(d, path);
  } else if constexpr (is_string_map_v<T>) {
    add_type<typename T::mapped_type>(d, path + ".key");
  } else if constexpr (is_variant_v<T>) {
    add_union(d, static_cast<const T*>(nullptr), path);
  } else if constexpr (std::is_enum_v<T>) {
    for (const auto& e : enum_entries<T>) d.add(std::string("\"") + std::string(e.name) + "\"");
  } else if constexpr (is_struct_v<T>) {
    if (!path.empty()) {
      d.add("[" + path + "]");
      if (d.flags) d.add(std::string(1, '\0') + "--" + path + ".");
    }
    constexpr auto names = field_names<T>();
    for (std::string_view name : names) {
      d.add(std::string(name));
      d.add(std::string(name) + " = ");
      if (d.flags) {
        d.add(std::string(1, '\0') + "--" + join(path, name) + "=");
        d.add(std::string(1, '\0') + "--no-" + join(path, name));
      }
    }
    for (std::size_t i = 0; i < primecfg::doc_of<T>.retired_count; ++i)
      d.add(primecfg::doc_of<T>.retired[i].key);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (add_type<std::remove_cvref_t<decltype(boost::pfr::get<I>(std::declval<T&>()))>>(d,
                                                                                       join(path, names[I])),
       ...);
    }
    (std::make_index_sequence<names.size()>{});
  }
}

void add_toml_syntax(dictionary& d) {
  for (std::string_view t : {"[",
                             "]",
                             "[[",
                             "]]",
                             "{",
                             "}",
                             "=",
                             " = ",
                             ",",
                             ".",
                             "\"",
                             "'",
                             "\"\"\"",
                             "'''",
                             "#",
                             "\n",
                             "\r\n",
                             "\\u",
                             "\\U",
                             "true",
                             "false",
                             "inf",
                             "nan",
                             "-inf",
                             "+inf",
                             "0x",
                             "0o",
                             "0b",
                             "1e",
                             "E+",
                             "_",
                             "9223372036854775807",
                             "9223372036854775808",
                             "-9223372036854775808",
                             "1979-05-27T07:32:00Z",
                             "07:32:00",
                             "{}",
                             "[]",
                             "\"\""})
    d.add(t);
}

}  // namespace

int main(int argc, char** argv) {
  std::string_view which = argc > 1 ? argv[1] : "load";
  dictionary d;
  d.flags = which == "load";
  add_toml_syntax(d);
  add_type<primecfg::SFTConfig>(d, "");
  add_type<primecfg::RLConfig>(d, "");
  if (which == "migrate") {
    for (std::string_view k :
         {"fsdp_cpu_offload", "optim_cpu_offload", "full_offload", "numa_bind", "cpu_optimizer_backend",
          "[model.optim_cpu_offload]", "[model.full_offload]", "[trainer.model]",
          "model.optim_cpu_offload = ", "model.full_offload = ", "full = true", "gradients",
          "transfer_buffer_count", "\"torch\"", "\"native\"", "[[", "]]"})
      d.add(k);
  } else {
    d.add(std::string(1, '\0'));
    d.add(std::string(1, '\0') + "@");
  }
  for (const std::string& e : d.entries) std::printf("%s\n", e.c_str());
  return 0;
}
