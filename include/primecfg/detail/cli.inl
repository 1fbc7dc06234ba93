// Definitions of cli.hpp: the command-line parser (compiled once where
// PRIMECFG_HEADER_ONLY=0, see detail/header_only.hpp) and the templates over it.
#pragma once

#include <primecfg/cli.hpp>

#include <algorithm>
#include <array>
#include <map>

namespace primecfg {

namespace detail {

// The command-line parser's entry points, for a root struct described by
// `root`. Compiled once where PRIMECFG_HEADER_ONLY=0 (detail/header_only.hpp).
PRIMECFG_LOADER_API std::vector<std::string> parse_command_line(const type_ops& root,
                                                                std::span<const std::string> args,
                                                                sources& src, std::vector<diagnostic>& errors,
                                                                bool bare_arguments_are_files);
// The arguments left over after the files and flags, as errors; true when
// one of them is --help or -h.
PRIMECFG_LOADER_API bool refuse_arguments(const std::vector<std::string>& rest,
                                          std::vector<diagnostic>& errors);

}  // namespace detail

#if PRIMECFG_DEFINES_LOADER

namespace detail {

enum class flag_kind { unknown, boolean, value, section, optional_section, retired };

struct flag_lookup {
  flag_kind kind = flag_kind::unknown;
  std::string path;        // normalised dotted path (snake_case field names)
  std::string suggestion;  // unknown flags: the closest valid path, if any; retired: the replacement
  bool union_tag = false;  // the `type` of a tagged union
};

// A suggested path spelled as the user spelled the flag: `--data.seq-lenn` gets
// `data.seq-len`, `--data.seq_lenn` gets `data.seq_len` (both are accepted).
inline std::string in_flag_style(std::string path, std::string_view flag) {
  if (flag.find('-', 2) != std::string_view::npos && flag.find('_') == std::string_view::npos)
    for (char& c : path)
      if (c == '_') c = '-';
  return path;
}

// The words that `--flag word` reads as the flag's value even where the flag
// needs none (a boolean, an optional section): never a file name.
inline bool is_flag_word(std::string_view s) { return s == "true" || s == "false" || s == "None"; }

inline std::vector<std::string> split_dotted(std::string_view s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    std::size_t dot = s.find('.', start);
    out.emplace_back(s.substr(start, dot == std::string_view::npos ? s.size() - start : dot - start));
    if (dot == std::string_view::npos) return out;
    start = dot + 1;
  }
}

inline flag_lookup resolve_flag(const type_ops& type, const std::vector<std::string>& segments, std::size_t i,
                                const std::string& path);

// segments[i] names a field of a struct: go on in that field's type, or
// suggest the closest field name.
inline flag_lookup resolve_field_flag(const type_ops& type, const std::vector<std::string>& segments,
                                      std::size_t i, const std::string& path) {
  const struct_shape& shape = *type.record->shape;
  std::string name = snake_case(segments[i]);
  for (std::size_t f = 0; f < shape.names.size(); ++f)
    if (shape.names[f] == name)
      return resolve_flag(*type.record->fields[f], segments, i + 1, join_path(path, name));
  for (const retired_key& r : shape.retired) {
    if (r.key != name) continue;
    std::string replacement;
    if (!r.replacement.empty())
      replacement = r.replacement.find('.') != std::string_view::npos ? std::string(r.replacement)
                                                                      : join_path(path, r.replacement);
    return {flag_kind::retired, join_path(path, name), replacement};
  }
  std::string hint = closest_match(name, shape.names);
  if (hint.empty()) return {flag_kind::unknown, {}, {}};
  std::string suggestion = join_path(path, hint);
  for (std::size_t k = i + 1; k < segments.size(); ++k) suggestion = join_path(suggestion, segments[k]);
  return {flag_kind::unknown, {}, suggestion};
}

// What the flag whose dotted name is `segments` sets, from segments[i] on,
// in a value of `type` at `path`.
inline flag_lookup resolve_flag(const type_ops& type, const std::vector<std::string>& segments, std::size_t i,
                                const std::string& path) {
  if (type.kind == value_kind::optional) {
    flag_lookup r = resolve_flag(*type.element, segments, i, path);
    if (i == segments.size() && r.kind == flag_kind::section) r.kind = flag_kind::optional_section;
    return r;
  }
  if (i == segments.size()) {
    switch (type.kind) {
      case value_kind::boolean:
        return {flag_kind::boolean, path, {}};
      case value_kind::record:
      case value_kind::tagged_union:
      case value_kind::string_map:
        return {flag_kind::section, path, {}};
      default:
        return {flag_kind::value, path, {}};
    }
  }
  switch (type.kind) {
    case value_kind::record:
      return resolve_field_flag(type, segments, i, path);
    case value_kind::tagged_union: {
      std::string name = snake_case(segments[i]);
      if (name == "type" && i + 1 == segments.size())
        return {flag_kind::value, join_path(path, "type"), {}, true};
      // Any alternative that has the field will do: the union's `type` decides later.
      flag_lookup result;
      for (const type_ops* alternative : type.alternatives->alternatives) {
        flag_lookup r = resolve_flag(*alternative, segments, i, path);
        if (r.kind != flag_kind::unknown || result.suggestion.empty()) result = r;
        if (result.kind != flag_kind::unknown) break;
      }
      return result;
    }
    case value_kind::string_map:
      return resolve_flag(*type.element, segments, i + 1, join_path(path, segments[i]));
    case value_kind::opaque: {
      std::string rest = path;
      for (std::size_t k = i; k < segments.size(); ++k) rest = join_path(rest, segments[k]);
      return {flag_kind::value, rest, {}};
    }
    default:
      return {flag_kind::unknown, {}, {}};  // a value has no fields
  }
}

inline diagnostic command_line_error(error_kind kind, std::string flag, std::string message) {
  diagnostic d;
  d.kind = kind;
  d.where = provenance::on_command_line(std::move(flag));
  d.message = std::move(message);
  return d;
}

// One resolved `--path=value` of the command line.
struct parsed_override {
  std::string path, value, flag;
  bool union_tag = false;
  bool turns_off = false;  // `--no-section` or `--section=None`
};

// Overrides that do not simply add up: the same value given twice (the last
// one wins, with a note naming both), and a section turned off together with
// a field of it (in either order: an error, as neither can win without
// dropping what the other says).
inline void check_overrides(const std::vector<parsed_override>& overrides, std::vector<diagnostic>& out) {
  // By path, the latest override so far; the sections turned off, with the first flag that did it.
  std::map<std::string_view, const parsed_override*, std::less<>> latest, off;
  for (const parsed_override& o : overrides)
    if (o.turns_off) off.try_emplace(o.path, &o);
  for (const parsed_override& later : overrides) {
    auto [it, first] = latest.try_emplace(later.path, &later);
    if (!first) {
      const parsed_override& earlier = *it->second;
      it->second = &later;
      if (earlier.value != later.value) {  // the same value twice loses nothing
        diagnostic d = command_line_error(
            error_kind::value_error, earlier.flag,
            fmt::format("{} is given twice on the command line: {} = {} ({}) and then {} = {} ({}); the "
                        "last one, {}, is used",
                        later.path, later.path, earlier.value, earlier.flag, later.path, later.value,
                        later.flag, later.value));
        d.level = severity::note;
        d.path = later.path;
        d.input = earlier.value;
        out.push_back(std::move(d));
      }
    }
    // Each section above the path ("a.b" and "a" for "a.b.c"), nearest first.
    std::string_view path = later.path;
    for (std::size_t cut = path.find_last_of(".["); cut != std::string_view::npos && cut > 0;
         cut = path.find_last_of(".[", cut - 1)) {
      auto found = off.find(path.substr(0, cut));
      if (found == off.end()) continue;
      const parsed_override& section = *found->second;
      diagnostic d =
          command_line_error(error_kind::value_error, later.flag,
                             fmt::format("{} sets a field of {}, but {} turns {} off; give one of the two",
                                         later.flag, section.path, section.flag, section.path));
      d.path = later.path;
      d.input = later.value;
      out.push_back(std::move(d));
      break;
    }
  }
}

PRIMECFG_LOADER_API std::vector<std::string> parse_command_line(const type_ops& root,
                                                                std::span<const std::string> args,
                                                                sources& src, std::vector<diagnostic>& errors,
                                                                bool bare_arguments_are_files) {
  std::vector<std::string> positional;
  std::vector<std::string> files;
  std::vector<parsed_override> overrides;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "@") {
      if (i + 1 < args.size())
        files.push_back(args[++i]);
      else
        errors.push_back(command_line_error(error_kind::missing, "@", "'@' must be followed by a file"));
      continue;
    }
    if (arg.size() > 1 && arg[0] == '@') {
      files.push_back(arg.substr(1));
      continue;
    }
    if (arg == "-h") {  // never a file: the caller decides (load_command_line: help)
      positional.push_back(arg);
      continue;
    }
    if (arg.size() <= 2 || arg.compare(0, 2, "--") != 0) {
      (bare_arguments_are_files ? files : positional).push_back(arg);
      continue;
    }
    std::string body = arg.substr(2);
    std::optional<std::string> value;
    if (auto eq = body.find('='); eq != std::string::npos) {
      value = body.substr(eq + 1);
      body.resize(eq);
    }
    std::string flag = "--" + body;
    flag_lookup r = resolve_flag(root, split_dotted(body), 0, "");
    bool negated = false;
    if (r.kind == flag_kind::unknown && !value) {
      // --no-a.b or --a.no-b
      std::string plain = body;
      if (plain.rfind("no-", 0) == 0 || plain.rfind("no_", 0) == 0) {
        plain = plain.substr(3);
      } else if (auto dot = plain.rfind('.');
                 dot != std::string::npos &&
                 (plain.compare(dot + 1, 3, "no-") == 0 || plain.compare(dot + 1, 3, "no_") == 0)) {
        plain.erase(dot + 1, 3);
      }
      if (plain != body) {
        flag_lookup n = resolve_flag(root, split_dotted(plain), 0, "");
        if (n.kind == flag_kind::boolean || n.kind == flag_kind::optional_section) r = n, negated = true;
      }
    }
    // `--flag true`, `--flag false`, `--flag None` mean `--flag=...` for every flag.
    if (!value && !negated && r.kind != flag_kind::unknown && r.kind != flag_kind::value &&
        i + 1 < args.size() && is_flag_word(args[i + 1]))
      value = args[++i];
    switch (r.kind) {
      case flag_kind::retired:
        errors.push_back(command_line_error(
            error_kind::extra_forbidden, flag,
            r.suggestion.empty() ? fmt::format("'{}' was removed; drop the flag", flag)
                                 : fmt::format("'{}' was replaced by '--{}'; use '--{}=...' instead", flag,
                                               r.suggestion, r.suggestion)));
        continue;
      case flag_kind::unknown:
        if (arg == "--help") {  // unless a field is named help: the caller decides
          positional.push_back(arg);
          continue;
        }
        errors.push_back(command_line_error(
            error_kind::extra_forbidden, flag,
            fmt::format("'{}' names no config field{}", flag,
                        r.suggestion.empty()
                            ? ""
                            : fmt::format("; did you mean '--{}'?", in_flag_style(r.suggestion, flag)))));
        continue;
      case flag_kind::boolean:
        if (!value) value = negated ? "false" : "true";
        break;
      case flag_kind::optional_section:
        if (!value) value = negated ? "None" : "{}";
        break;
      case flag_kind::section:
        if (!value) {
          errors.push_back(command_line_error(
              error_kind::table_type, flag,
              fmt::format("'{}' is a section; set one of its fields, e.g. '--{}.<field>=...'", flag,
                          r.path)));
          continue;
        }
        break;
      case flag_kind::value:
        if (!value) {
          if (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0) {
            errors.push_back(
                command_line_error(error_kind::missing, flag, fmt::format("'{}' needs a value", flag)));
            continue;
          }
          value = args[++i];
        }
        break;
    }
    bool turns_off = *value == "None";
    overrides.push_back({r.path, *value, flag, r.union_tag, turns_off});
  }
  check_overrides(overrides, errors);
  for (const std::string& file : files) src.add_file(file);
  // A union's `type` first: `--optim.momentum=0.5 --optim.type=sgd` means what
  // `--optim.type=sgd --optim.momentum=0.5` means (the order of flags never matters).
  std::stable_partition(overrides.begin(), overrides.end(),
                        [](const parsed_override& o) { return o.union_tag; });
  for (const parsed_override& o : overrides) src.add_override(o.path, o.value, o.flag);
  return positional;
}

PRIMECFG_LOADER_API bool refuse_arguments(const std::vector<std::string>& rest,
                                          std::vector<diagnostic>& errors) {
  bool help = false;
  for (const std::string& arg : rest) {
    if (arg == "--help" || arg == "-h") {
      // Not an error for a program that prints help_text<T>() when asked
      // (loaded::help_requested); one that does not must not run as if the
      // flag were not there.
      if (!help)
        errors.push_back(command_line_error(
            error_kind::extra_forbidden, arg,
            fmt::format("'{}' asks for help; this program does not print it (primecfg::loaded::"
                        "help_requested, primecfg::help_text)",
                        arg)));
      help = true;
      continue;
    }
    errors.push_back(
        command_line_error(error_kind::extra_forbidden, arg,
                           fmt::format("unexpected argument '{}' (give config files as '@ {}')", arg, arg)));
  }
  return help;
}

}  // namespace detail

#endif  // PRIMECFG_DEFINES_LOADER

template <class T>
std::vector<std::string> parse_command_line(std::span<const std::string> args, sources& src,
                                            std::vector<diagnostic>& errors, bool bare_arguments_are_files) {
  return detail::parse_command_line(detail::ops_of<T>, args, src, errors, bare_arguments_are_files);
}

template <class T>
loaded<T> load_command_line(std::span<const std::string> args, sources base) {
  std::vector<diagnostic> errors;
  bool help = detail::refuse_arguments(
      detail::parse_command_line(detail::ops_of<T>, args, base, errors, false), errors);
  loaded<T> result = load<T>(base);
  result.diagnostics.insert(result.diagnostics.begin(), errors.begin(), errors.end());
  result.help_requested = help;
  return result;
}

}  // namespace primecfg
