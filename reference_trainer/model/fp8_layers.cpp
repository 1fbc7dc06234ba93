#include "model/fp8_layers.hpp"

#include <fmt/format.h>

#include <regex>
#include <stdexcept>

namespace primecfg::train::fp8 {

using i64 = std::int64_t;

std::optional<std::string> invalid_pattern(const std::string& pattern) {
  try {
    (void)std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return fmt::format("\"{}\" is not a regular expression: {}", pattern, e.what());
  }
  return std::nullopt;
}

std::optional<std::string> stays_bf16(std::string_view module, i64 out_features, i64 in_features,
                                      const std::vector<std::string>& ignore_patterns) {
  const std::string name(module);
  for (const auto& pattern : ignore_patterns) {
    if (const auto why = invalid_pattern(pattern)) throw std::invalid_argument("ignore pattern " + *why);
    if (std::regex_search(name, std::regex(pattern, std::regex::ECMAScript)))
      return fmt::format("matches ignore pattern \"{}\"", pattern);
  }
  if (out_features % group != 0 || in_features % group != 0)
    return fmt::format("{} x {} is not a multiple of {} in both dimensions", out_features, in_features,
                       group);
  return std::nullopt;
}

std::optional<std::string> experts_stay_bf16(i64 hidden, i64 intermediate) {
  if (hidden % group == 0 && intermediate % group == 0) return std::nullopt;
  return fmt::format("are {} x {} (moe_intermediate_size x hidden_size), not multiples of {}", intermediate,
                     hidden, group);
}

}  // namespace primecfg::train::fp8
