// How one parameter is split over the ranks of a sharded run (FSDP): its elements,
// flattened, in `world` equal pieces of `per_rank` elements, rank r holding elements
// [r * per_rank, (r + 1) * per_rank); the last pieces are padded with zeros (which
// no element-wise optimizer moves). The trainer, its checkpoints and the memory
// planner use this one rule.
//
// Internal to primecfg-train; no LibTorch.
#pragma once

#include <algorithm>
#include <cstdint>

namespace primecfg::train {

struct ShardSpan {
  std::int64_t numel = 0;     // the whole parameter
  std::int64_t per_rank = 0;  // elements of each rank's piece, padding included
  std::int64_t offset = 0;    // this rank's first element in the flattened parameter
  std::int64_t length = 0;    // this rank's elements that are real (the rest is padding)

  static ShardSpan of(std::int64_t numel, std::int64_t rank, std::int64_t world) {
    ShardSpan s;
    s.numel = numel;
    s.per_rank = (numel + world - 1) / world;
    s.offset = std::min(numel, rank * s.per_rank);
    s.length = std::clamp<std::int64_t>(numel - rank * s.per_rank, 0, s.per_rank);
    return s;
  }
  // Elements of the padded, flattened parameter: world * per_rank.
  std::int64_t padded(std::int64_t world) const { return world * per_rank; }
};

}  // namespace primecfg::train
