// The presets by model.name (model/config.hpp): each architecture's
// (model/architecture.hpp), in the order of the registry.
#include "model/architecture.hpp"
#include "model/config.hpp"

namespace primecfg::train {

std::optional<ModelArgs> preset(std::string_view name) {
  if (name == "tiny") name = "primecfg/tiny";
  for (const Architecture* a : architectures())
    for (auto& [preset_name, args] : a->presets())
      if (preset_name == name) return args;
  return std::nullopt;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> out;
  for (const Architecture* a : architectures())
    for (const auto& p : a->presets()) out.push_back(p.first);
  return out;
}

}  // namespace primecfg::train
