// Definitions of report.hpp, compiled once where PRIMECFG_HEADER_ONLY=0
// (detail/header_only.hpp).
#pragma once

#include <primecfg/report.hpp>

#include <algorithm>
#include <sstream>

namespace primecfg {

#if PRIMECFG_DEFINES_LOADER

PRIMECFG_LOADER_API std::string format_text(const std::vector<diagnostic>& diagnostics,
                                            std::string_view root_name) {
  std::string out;
  for (const diagnostic& d : diagnostics) out += format_diagnostic(d) + "\n";
  auto errors = std::count_if(diagnostics.begin(), diagnostics.end(),
                              [](const diagnostic& d) { return d.level == severity::error; });
  if (errors > 0) out += fmt::format("{} error{} in {}\n", errors, errors == 1 ? "" : "s", root_name);
  return out;
}

PRIMECFG_LOADER_API std::string format_json(const std::vector<diagnostic>& diagnostics) {
  toml::array list;
  for (const diagnostic& d : diagnostics) {
    toml::table entry{
        {"severity", std::string(to_string(d.level))},
        {"kind", std::string(to_string(d.kind))},
        {"path", d.path},
        {"message", d.message},
        {"input", d.input},
        {"line", static_cast<std::int64_t>(d.where.line)},
        {"column", static_cast<std::int64_t>(d.where.column)},
    };
    switch (d.where.from) {
      case provenance::origin::default_value:
        entry.insert("origin", "default");
        break;
      case provenance::origin::file:
        entry.insert("origin", "file");
        entry.insert("file", d.where.file);
        break;
      case provenance::origin::command_line:
        entry.insert("origin", "command_line");
        entry.insert("flag", d.where.file);
        break;
    }
    list.push_back(std::move(entry));
  }
  std::ostringstream os;
  os << toml::json_formatter{list};
  return os.str() + "\n";
}

#endif  // PRIMECFG_DEFINES_LOADER

}  // namespace primecfg
