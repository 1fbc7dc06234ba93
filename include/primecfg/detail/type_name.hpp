// The unqualified name of a type ("SFTConfig"), for messages.
#pragma once

#include <string_view>

namespace primecfg::detail {

template <class T>
constexpr std::string_view type_signature() noexcept {
  return __PRETTY_FUNCTION__;
}

template <class T>
constexpr std::string_view type_name() noexcept {
  std::string_view s = type_signature<T>();
  std::size_t start = s.find("T = ");
  if (start == std::string_view::npos) return "config";
  start += 4;
  std::size_t end = s.find_first_of(";]", start);
  s = s.substr(start, end - start);
  std::size_t colon = s.rfind("::");
  return colon == std::string_view::npos ? s : s.substr(colon + 2);
}

}  // namespace primecfg::detail
