// Suggestions for near misses ("ofload" -> "offload").
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace primecfg::detail {

// Optimal string alignment distance: insertions, deletions, substitutions and
// swaps of two neighbours ("modle" -> "model") each cost one.
inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

inline std::string snake_case(std::string_view s) {
  std::string out(s);
  std::replace(out.begin(), out.end(), '-', '_');
  return out;
}

// The closest candidate within a third of the word's length (at least 1, at
// most 3 edits); empty when nothing is close. Case and '-' vs '_' are free.
template <class Range>
std::string closest_match(std::string_view word, const Range& candidates) {
  std::string w = snake_case(word);
  std::transform(w.begin(), w.end(), w.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::size_t limit = std::clamp<std::size_t>(w.size() / 3, 1, 3);
  std::string best;
  std::size_t best_distance = limit + 1;
  for (std::string_view c : candidates) {
    std::size_t d = edit_distance(w, c);
    if (d < best_distance) best_distance = d, best = std::string(c);
  }
  return best;
}

}  // namespace primecfg::detail
