// Machine profiles (profile.hpp): read through primecfg, written as TOML.
#include "planner/profile.hpp"

#include <primecfg/dump.hpp>
#include <primecfg/load.hpp>
#include <primecfg/report.hpp>

#include <sstream>
#include <utility>

#include <fmt/format.h>

namespace primecfg::train::plan {

// The profile shipped with primecfg: planner/profiles/nvidia-h200.toml, embedded at
// build time (meson.build).
extern const char kShippedProfileText[];

namespace {

MachineProfile read(const sources& src, const std::string& what) {
  loaded<MachineProfile> p = load<MachineProfile>(src);
  if (!p.ok()) throw profile_error(format_text(p.diagnostics, what));
  for (auto [empty, key] : {std::pair{p.value.gpu.blocks.empty(), "gpu.blocks"},
                            std::pair{p.value.gpu.heads.empty(), "gpu.heads"},
                            std::pair{p.value.gpu.attention.empty(), "gpu.attention"}})
    if (empty)
      throw profile_error(
          fmt::format("{}: {} is empty; --calibrate measures at least one (the step-time "
                      "model needs it)",
                      what, key));
  return p.value;
}

}  // namespace

MachineProfile read_profile(const std::filesystem::path& file) {
  sources src;
  src.add_file(file);
  return read(src, "machine profile " + file.string());
}

MachineProfile read_profile_text(std::string_view name, std::string_view toml_text) {
  sources src;
  src.add_text(std::string(name), std::string(toml_text));
  return read(src, "machine profile " + std::string(name));
}

const std::optional<MachineProfile>& shipped_profile() {
  static const std::optional<MachineProfile> p = []() -> std::optional<MachineProfile> {
    // A file of comments and blank lines ships no profile.
    std::string_view text = kShippedProfileText;
    bool content = false;
    for (std::size_t at = 0; at < text.size();) {
      std::size_t end = text.find('\n', at);
      if (end == std::string_view::npos) end = text.size();
      std::string_view line = text.substr(at, end - at);
      const auto first = line.find_first_not_of(" \t\r");
      if (first != std::string_view::npos && line[first] != '#') content = true;
      at = end + 1;
    }
    if (!content) return std::nullopt;
    return read_profile_text("reference_trainer/planner/profiles/nvidia-h200.toml (shipped)", text);
  }();
  return p;
}

std::string profile_toml(const MachineProfile& p) {
  std::ostringstream out;
  out << to_toml_table(p) << "\n";
  return out.str();
}

}  // namespace primecfg::train::plan
