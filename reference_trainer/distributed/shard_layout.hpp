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

// A piece of a row-major matrix of rows of `dim` elements (the tied embedding, which the
// lookup and its update read by rows): the elements [begin, end) of the flattened matrix.
// Its whole rows are [first_whole, end_whole); a row it holds only part of (at most two:
// where the piece starts and where it ends, or one row cut at both ends) is cut.
struct PieceRows {
  std::int64_t dim = 1, begin = 0, end = 0;

  // The rows the piece touches, whole or cut: [first_row(), end_row()).
  std::int64_t first_row() const { return begin / dim; }
  std::int64_t end_row() const { return (end + dim - 1) / dim; }
  std::int64_t first_whole() const { return (begin + dim - 1) / dim; }
  std::int64_t end_whole() const { return std::max(end / dim, first_whole()); }
  // Row r's elements that the piece holds, [from, to) of the flattened matrix (to <= from:
  // none), and whether that is all of the row.
  std::int64_t from(std::int64_t r) const { return std::max(r * dim, begin); }
  std::int64_t to(std::int64_t r) const { return std::min((r + 1) * dim, end); }
  std::int64_t held(std::int64_t r) const { return std::max<std::int64_t>(0, to(r) - from(r)); }
  bool whole(std::int64_t r) const { return held(r) == dim; }
  // The rows the piece's ends cut, in order: none, one or two.
  template <class Fn>
  void for_each_cut_row(Fn&& fn) const {
    if (end <= begin) return;
    const std::int64_t first = begin / dim, last = (end - 1) / dim;
    if (!whole(first)) fn(first);
    if (last != first && !whole(last)) fn(last);
  }
};

}  // namespace primecfg::train
