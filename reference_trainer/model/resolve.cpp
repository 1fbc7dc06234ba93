#include "model/config.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <system_error>

namespace primecfg::train {

std::optional<std::filesystem::path> hf_directory(std::string_view name) {
  if (preset(name)) return std::nullopt;
  const std::filesystem::path dir(name);
  std::error_code ec;
  if (!std::filesystem::exists(dir / "config.json", ec)) return std::nullopt;
  return dir;
}

ResolvedModel resolve_model(std::string_view name, std::optional<std::int64_t> debug_num_layers) {
  ResolvedModel r;
  if (auto p = preset(name)) {
    r.args = *p;
  } else {
    const auto dir = hf_directory(name);
    if (!dir)
      throw model_config_error(
          fmt::format("\"{}\" is neither a preset ({}) nor a local directory with config.json (nothing is "
                      "downloaded; download it, e.g. `hf download {} --local-dir DIR`, and set "
                      "model.name = DIR)",
                      name, fmt::join(preset_names(), ", "), name));
    r.args = read_hf_config(*dir / "config.json");
    r.hf_dir = *dir;
  }
  if (debug_num_layers) r.args.layers = std::min(r.args.layers, *debug_num_layers);
  return r;
}

}  // namespace primecfg::train
