// Reading a template argument list back out of __PRETTY_FUNCTION__, the way
// field names (field_names.hpp) and enumerator names (enum_names.hpp) are read
// at compile time: one function instantiated with every value at once prints
// them all as "... Name = {a, b, ...} ..." (g++) or "[Name = <a, b, ...>]"
// (clang).
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

namespace primecfg::detail {

// The first N items of the list that follows `marker` ("V = ") in `sig`,
// split at its top-level commas, each passed through `item`. Items stay
// empty when the signature has another shape.
template <std::size_t N, class Item>
constexpr std::array<std::string_view, N> signature_list(std::string_view sig, std::string_view marker,
                                                         Item item) noexcept {
  std::array<std::string_view, N> out{};
  std::size_t open = sig.find(marker);
  if (open == std::string_view::npos) return out;
  open += marker.size();  // the list's opening '{' or '<'
  std::size_t piece = open + 1, depth = 0, k = 0;
  for (std::size_t i = open + 1; i < sig.size() && k < N; ++i) {
    char c = sig[i];
    if (depth == 0 && (c == ',' || c == '}' || c == '>')) {
      out[k++] = item(sig.substr(piece, i - piece));
      piece = i + 1;
    } else if (c == '(' || c == '<' || c == '[' || c == '{') {
      ++depth;
    } else if (c == ')' || c == '>' || c == ']' || c == '}') {
      --depth;
    }
  }
  return out;
}

}  // namespace primecfg::detail
