#include "command_line.hpp"

#include "options.hpp"

#include <primecfg/cli.hpp>

#include <fmt/format.h>

#include <cstddef>
#include <string_view>

namespace primecfg::train {

namespace {

// The flag's dotted name without "--", "=value" and a "no-" in front.
std::string flag_name(std::string_view arg) {
  std::string_view body = arg.substr(2);
  body = body.substr(0, body.find('='));
  if (body.rfind("no-", 0) == 0 || body.rfind("no_", 0) == 0) body.remove_prefix(3);
  return std::string(body);
}

}  // namespace

CommandLine split_command_line(const std::vector<std::string>& args) {
  namespace d = primecfg::detail;
  const d::type_ops& options = d::ops_of<TrainerOptions>;
  const auto& fields = options.record->shape->names;
  CommandLine out;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() <= 2 || a.rfind("--", 0) != 0) {  // a file (`@ F`, `@F`) or something the config refuses
      out.config.push_back(a);
      if (a == "@" && i + 1 < args.size()) out.config.push_back(args[++i]);
      continue;
    }
    const std::string name = flag_name(a);
    const std::vector<std::string> segments = d::split_dotted(name);
    const std::string first = d::snake_case(segments.front());
    const bool has_value = a.find('=') != std::string::npos;
    if (first == "options" && segments.size() == 1) {  // --options=FILE, --options FILE
      out.options.push_back("@");
      out.options.push_back(has_value ? a.substr(a.find('=') + 1) : (i + 1 < args.size() ? args[++i] : ""));
      continue;
    }
    bool mine = false;
    for (const auto& f : fields) mine = mine || f == first;
    if (!mine) {
      out.config.push_back(a);
      continue;
    }
    out.options.push_back(a);
    // `--flag value`: the value goes with its flag (booleans take none but true/false/None).
    if (has_value || i + 1 >= args.size()) continue;
    const d::flag_lookup r = d::resolve_flag(options, segments, 0, "");
    const bool needs_value = r.kind == d::flag_kind::value && flag_name(a) == a.substr(2);
    const bool word = d::is_flag_word(args[i + 1]);
    if ((needs_value && args[i + 1].rfind("--", 0) != 0) || (!needs_value && word))
      out.options.push_back(args[++i]);
  }
  return out;
}

void suggest_options(std::vector<diagnostic>& config_diagnostics) {
  namespace d = primecfg::detail;
  for (diagnostic& diag : config_diagnostics) {
    const std::string& flag = diag.where.file;
    if (diag.kind != error_kind::extra_forbidden || diag.where.from != provenance::origin::command_line ||
        flag.size() <= 2 || flag.rfind("--", 0) != 0 ||
        diag.message.find("names no config field") == std::string::npos ||
        diag.message.find("did you mean") != std::string::npos)
      continue;
    const d::flag_lookup r =
        d::resolve_flag(d::ops_of<TrainerOptions>, d::split_dotted(flag_name(flag)), 0, "");
    if (r.kind != d::flag_kind::unknown || r.suggestion.empty()) continue;
    diag.message +=
        fmt::format("; did you mean the primecfg-train option '--{}'?", d::in_flag_style(r.suggestion, flag));
  }
}

}  // namespace primecfg::train
