// Which piece of a parameter each rank of a mesh holds: the one rule that the sharding
// (distributed/fsdp.hpp), the checkpoint's optimizer files (checkpoint/shards.hpp) and
// the memory planner follow, so that a checkpoint saved on one mesh is read on another.
//
//   a dense parameter      split over dp_shard x cp (FSDP): piece = the rank's place in
//                          that group (ShardSpan), the same on every replica;
//   routed expert e        held by the expert-parallel rank e / (experts / ep) alone,
//   (ParamShape::expert)   and split over dp_shard_mod_ep there; every other rank holds
//                          no element of it (an empty piece).
//
// With ep = 1 both are FSDP's split over dp_shard x cp. Per rank the experts' elements
// come to about what FSDP alone would give (experts / ep experts, each in
// dp_shard_mod_ep pieces); what expert parallelism saves is the gathers: a block's
// forward gathers only the experts its rank runs.
//
// Internal to primecfg-train; no LibTorch.
#pragma once

#include "distributed/mesh.hpp"
#include "distributed/shard_layout.hpp"

#include <cstdint>

namespace primecfg::train {

// The place along the expert-parallel group (MeshDim::ep) of the rank that runs routed
// expert `expert` of `experts` (ep must divide experts).
inline int expert_owner(const MeshDims& m, std::int64_t expert, std::int64_t experts) {
  return static_cast<int>(expert / (experts / m.ep));
}

// Whether `rank` holds a piece of routed expert `expert` (-1: a dense parameter, held
// by every rank).
inline bool holds_expert(const MeshDims& m, int rank, std::int64_t expert, std::int64_t experts) {
  if (expert < 0 || m.ep == 1) return true;
  const MeshCoords c = mesh_coords(m, rank);
  return c.in_ep * m.cp + c.cp == expert_owner(m, expert, experts);
}

// The piece of a parameter of `numel` elements (routed expert `expert` of `experts`, or
// -1) that `rank` of mesh m holds. A rank that holds none gets {numel, 0, 0, 0}.
inline ShardSpan piece_of(const MeshDims& m, int rank, std::int64_t numel, std::int64_t expert,
                          std::int64_t experts) {
  const MeshCoords c = mesh_coords(m, rank);
  if (expert < 0 || m.ep == 1)
    return ShardSpan::of(numel, (c.mod_ep * m.dp_shard_in_ep() + c.in_ep) * m.cp + c.cp, m.fsdp());
  if (!holds_expert(m, rank, expert, experts)) return ShardSpan{numel, 0, 0, 0};
  return ShardSpan::of(numel, c.mod_ep, m.dp_shard_mod_ep());
}

}  // namespace primecfg::train
