// Definitions of load.hpp: the sources, the loader's entry point (compiled
// once where PRIMECFG_HEADER_ONLY=0, see detail/header_only.hpp) and load<T>.
#pragma once

#include <primecfg/load.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <compare>
#include <cstring>
#include <deque>
#include <fstream>
#include <sstream>
#include <typeindex>

namespace primecfg {

inline sources& sources::add_file(const std::filesystem::path& path) {
  layers_.push_back({layer::kind::file, path.string(), {}, {}});
  return *this;
}

inline sources& sources::add_text(std::string name, std::string toml_text) {
  layers_.push_back({layer::kind::text, std::move(name), std::move(toml_text), {}});
  return *this;
}

inline sources& sources::add_override(std::string dotted_key, std::string raw_value, std::string flag) {
  if (flag.empty()) flag = "--" + dotted_key;
  layers_.push_back(
      {layer::kind::override_value, std::move(dotted_key), std::move(raw_value), std::move(flag)});
  return *this;
}

template <class T>
std::size_t loaded<T>::error_count() const {
  return static_cast<std::size_t>(
      std::count_if(diagnostics.begin(), diagnostics.end(),
                    [](const diagnostic& d) { return d.level == severity::error; }));
}

template <class T>
primecfg::provenance loaded<T>::source_of(std::string_view path) const {
  auto it = provenance.find(path);
  return it == provenance.end() ? primecfg::provenance{} : it->second;
}

namespace detail {

// The loader's entry point: every source in order onto `value`, a root struct
// described by `type` that holds its defaults; then the required fields and
// the rules. Compiled once where PRIMECFG_HEADER_ONLY=0 (detail/header_only.hpp).
PRIMECFG_LOADER_API void load_sources(void* value, const type_ops& type, const sources& src,
                                      std::vector<diagnostic>& diagnostics, provenance_map& provenance);

}  // namespace detail

#if PRIMECFG_DEFINES_LOADER

namespace detail {

// What a file that is not a regular file is, for the message refusing it.
inline const char* file_type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Reads a whole file, or says why it cannot. Only regular files are read:
// a FIFO would block (or be read once and be empty the next time), a device
// may never end (/dev/zero) or have effects when opened, so they are refused
// by stat() before any open(), and again by fstat() after it (in case the
// path changed in between; O_NONBLOCK keeps that open from waiting for a
// writer). Read errors are reported, not taken for the end of the file (an
// EIO used to look like an empty, valid config), and at most
// max_config_bytes + 1 bytes are read.
inline bool read_config_file(const std::string& path, std::string& text, std::string& why) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    why = fmt::format("cannot open: {}", std::strerror(errno));
    return false;
  }
  auto refuse_type = [&](mode_t mode) {
    why = S_ISDIR(mode) ? std::string("is a directory, not a config file")
                        : fmt::format("is {}, not a regular file; config files must be regular files",
                                      file_type_name(mode));
  };
  if (!S_ISREG(st.st_mode)) {
    refuse_type(st.st_mode);
    return false;
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    why = fmt::format("cannot open: {}", std::strerror(errno));
    return false;
  }
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    refuse_type(st.st_mode);
    ::close(fd);
    return false;
  }
  if (static_cast<std::uintmax_t>(st.st_size) > max_config_bytes) {
    why = fmt::format("is {} bytes; config files are limited to {} MiB", st.st_size, max_config_bytes >> 20);
    ::close(fd);
    return false;
  }
  std::string buffer;
  char chunk[65536];
  while (true) {
    ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      why = fmt::format("read failed: {}", std::strerror(errno));
      ::close(fd);
      return false;
    }
    if (n == 0) break;
    buffer.append(chunk, static_cast<std::size_t>(n));
    if (buffer.size() > max_config_bytes) {
      why = fmt::format("holds more than {} MiB; config files are limited to {} MiB", max_config_bytes >> 20,
                        max_config_bytes >> 20);
      ::close(fd);
      return false;
    }
  }
  ::close(fd);
  text = std::move(buffer);
  return true;
}

inline std::optional<toml::table> parse_document(const std::string& text, const std::string& name,
                                                 std::vector<diagnostic>& out) {
  if (std::optional<deep_key> deep = find_deep_key(text)) {
    diagnostic d;
    d.kind = error_kind::toml_syntax;
    d.where = provenance::in_file(name, static_cast<std::uint32_t>(deep->line), 1);
    d.message =
        fmt::format("keys nested {} tables deep; more than {} is refused", deep->depth, max_key_depth);
    out.push_back(std::move(d));
    return std::nullopt;
  }
  try {
    return toml::parse(std::string_view(text), std::string_view(name));
  } catch (const toml::parse_error& e) {
    toml_error_report r = describe_parse_error(text, e);  // toml++ 3.3's own text can be garbled
    diagnostic d;
    d.kind = error_kind::toml_syntax;
    d.where = provenance::in_file(name, r.line, r.column);
    d.message = fmt::format("invalid TOML: {}", r.message);
    out.push_back(std::move(d));
    return std::nullopt;
  }
}

// {"model": {"offload": "<raw>"}} from "model.offload" and "<raw>".
inline toml::table override_table(std::string_view dotted_key, const std::string& raw) {
  toml::table root;
  toml::table* current = &root;
  std::size_t start = 0;
  while (true) {
    std::size_t dot = dotted_key.find('.', start);
    std::string_view segment =
        dotted_key.substr(start, dot == std::string_view::npos ? dotted_key.size() : dot - start);
    if (dot == std::string_view::npos) {
      current->insert_or_assign(segment, raw);
      return root;
    }
    auto [it, inserted] = current->insert(segment, toml::table{});
    current = it->second.as_table();
    start = dot + 1;
  }
}

// Errors in source order: files as given, then the command line, then
// rules about defaults; by line and column within a file. The keys are
// sorted (the index keeps equal keys in order) and the diagnostics moved
// once: a stable sort of the diagnostics themselves instantiated a merge
// sort of a large type in every program that loads a config.
inline void sort_diagnostics(std::vector<diagnostic>& diags, const sources& src) {
  auto rank = [&](const provenance& p) {
    if (p.is_default()) return src.layers().size();
    for (std::size_t i = 0; i < src.layers().size(); ++i) {
      const auto& l = src.layers()[i];
      if (p.from == provenance::origin::command_line ? l.flag == p.file : l.name == p.file) return i;
    }
    return src.layers().size();
  };
  struct sort_key {
    std::size_t rank;
    std::uint32_t line, column;
    std::size_t index;
    auto operator<=>(const sort_key&) const = default;
  };
  std::vector<sort_key> keys;
  keys.reserve(diags.size());
  for (std::size_t i = 0; i < diags.size(); ++i)
    keys.push_back({rank(diags[i].where), diags[i].where.line, diags[i].where.column, i});
  std::sort(keys.begin(), keys.end());
  std::vector<diagnostic> sorted;
  sorted.reserve(diags.size());
  for (const sort_key& k : keys) sorted.push_back(std::move(diags[k.index]));
  diags = std::move(sorted);
}

// Every share() (parents first: shared settings reach the sections they
// belong to before any rule runs), then the required fields that no source
// set, then every validate(), children first.
inline void check_and_validate(void* value, const type_ops& type, std::vector<diagnostic>& diagnostics,
                               provenance_map& provenance) {
  value_index index;
  validation v(diagnostics, provenance);
  auto reindex = [&] {
    index = value_index{};
    index_value(value, type, "", nullptr, index);
    v.clear_fields();
    for (const value_index::field_entry& f : index.fields) v.add_field(f.address, f.type, f.path);
  };
  reindex();
  v.on_reindex(reindex);
  // A share() may turn sections on: the index is rebuilt then, so the list is copied.
  std::vector<std::pair<void*, value_index::rule_fn>> shares = index.shares;
  for (auto& [object, share] : shares) share(object, v);
  reindex();
  v.on_reindex({});
  for (const value_index::field_entry& f : index.fields) {
    if (f.doc && f.doc->required && !provenance.contains(f.path)) {
      diagnostic d;
      d.kind = error_kind::missing;
      d.path = f.path;
      std::size_t dot = f.path.rfind('.');
      if (dot != std::string::npos) {
        auto parent = provenance.find(std::string_view(f.path).substr(0, dot));
        if (parent != provenance.end()) d.where = parent->second;
      }
      d.message = fmt::format("required field '{}' is missing",
                              f.path.substr(dot == std::string::npos ? 0 : dot + 1));
      diagnostics.push_back(std::move(d));
    }
  }
  for (auto& [object, rule] : index.rules) rule(object, v);
}

PRIMECFG_LOADER_API void load_sources(void* value, const type_ops& type, const sources& src,
                                      std::vector<diagnostic>& diagnostics, provenance_map& provenance) {
  std::deque<toml::table> documents;
  decode_context ctx;
  ctx.out = &diagnostics;
  ctx.sources = &provenance;
  for (const sources::layer& layer : src.layers()) {
    if (layer.what == sources::layer::kind::override_value) {
      if (!is_valid_utf8(layer.name) || !is_valid_utf8(layer.content)) {
        diagnostic d;
        d.kind = error_kind::string_type;
        d.where = provenance::on_command_line(layer.flag);
        d.message = "the flag or its value is not valid UTF-8 (configs are UTF-8 text, as TOML requires)";
        diagnostics.push_back(std::move(d));
        continue;
      }
      ctx.file.clear();
      ctx.flag = layer.flag;
      decode_fields(override_table(layer.name, layer.content), value, type, "", ctx);
      continue;
    }
    std::string text = layer.content;
    if (layer.what == sources::layer::kind::file) {
      std::string why;
      if (!read_config_file(layer.name, text, why)) {
        diagnostic d;
        d.kind = error_kind::file_error;
        d.where = provenance::in_file(layer.name, 0, 0);
        d.message = why;
        diagnostics.push_back(std::move(d));
        continue;
      }
    }
    std::optional<toml::table> doc = parse_document(text, layer.name, diagnostics);
    if (!doc) continue;
    ctx.file = layer.name;
    ctx.flag.clear();
    // Kept to the end: a later file that switches a union's `type` decodes
    // the fields this one set again, from their own nodes (decode.hpp).
    documents.push_back(std::move(*doc));
    decode_fields(documents.back(), value, type, "", ctx);
  }
  check_and_validate(value, type, diagnostics, provenance);
  sort_diagnostics(diagnostics, src);
}

}  // namespace detail

#endif  // PRIMECFG_DEFINES_LOADER

template <class T>
loaded<T> load(const sources& src) {
  static_assert(
      !std::is_class_v<T> || std::is_aggregate_v<T>,
      "primecfg: a config struct must be an aggregate (T in the 'In instantiation of' line above): no "
      "user-declared constructor, no private or protected field, no virtual function or base");
  static_assert(!std::is_aggregate_v<T> || detail::is_struct_v<T>,
                "primecfg::load<T>: T must be a config struct");
  loaded<T> result;
  detail::load_sources(&result.value, detail::ops_of<T>, src, result.diagnostics, result.provenance);
  return result;
}

}  // namespace primecfg
