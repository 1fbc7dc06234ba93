// Whether two runs' weights (RunResult::weights or model_weights) are the same names with
// the same bits.
#pragma once

#include <cstring>
#include <string>
#include <utility>
#include <vector>

inline bool bit_identical(const std::vector<std::pair<std::string, std::vector<float>>>& a,
                          const std::vector<std::pair<std::string, std::vector<float>>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].first != b[i].first || a[i].second.size() != b[i].second.size() ||
        std::memcmp(a[i].second.data(), b[i].second.data(), a[i].second.size() * 4) != 0)
      return false;
  return true;
}
