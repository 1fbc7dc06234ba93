// Which parameters OptimizerOffload updates together, in one set of multi-tensor
// launches from the gradient hook of the last of them.
//
// Why group at all: while the moment copies run over PCIe, every kernel boundary on
// the compute stream costs the GPU a few microseconds more, and a parameter updated on
// its own costs about five launches (docs/performance.md). Why not larger groups: a
// group's moments stay in the moment window until the whole group is updated, so a
// group must leave the window room to fetch ahead; past a quarter of the window the
// kernels are large anyway and grouping saves nothing.
#pragma once

#include <cstddef>
#include <vector>

namespace primecfg::train {

// Consecutive parameters of one transformer block (`block[i] >= 0`, the same value),
// in index order, closed once the next one would take the group's moments past
// `max_bytes`. A parameter outside the blocks (`block[i] < 0`), or one whose moments
// alone exceed `max_bytes`, makes a group of its own. Every index is in exactly one
// group; the groups are in index order.
inline std::vector<std::vector<std::size_t>> update_groups(const std::vector<int>& block,
                                                           const std::vector<std::size_t>& moment_bytes,
                                                           std::size_t max_bytes) {
  std::vector<std::vector<std::size_t>> groups;
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < block.size(); ++i) {
    const bool joins =
        !groups.empty() && block[i] >= 0 && block[i - 1] == block[i] && bytes + moment_bytes[i] <= max_bytes;
    if (!joins) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(i);
    bytes += moment_bytes[i];
  }
  return groups;
}

}  // namespace primecfg::train
