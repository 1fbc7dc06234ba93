// Where a parallelism puts a parameter on the device mesh, and what every parallelism
// is built from.
//
// Internal to primecfg-train.
#pragma once

#include "distributed/mesh.hpp"

#include <torch/torch.h>

namespace primecfg::train {

// The mesh dimensions that split a parameter into pieces and that hold copies of
// those pieces. Dense weights: split over dp_shard_cp (FSDP), copied over dp_replicate
// (HSDP). Routed experts (expert parallelism): split over ep, then dp_shard_mod_ep,
// copied over dp_replicate.
struct MeshPlacement {
  std::vector<MeshDim> shard;
  MeshDim replicate = MeshDim::replicate;
  bool operator==(const MeshPlacement&) const = default;
};

// What the config asks of any parallelism: the weights' dtype and device, the dtype
// gradients are summed in (model.reduce_dtype), the size of the gradient buckets
// (--dist.bucket-mib), whether gathered weights are freed after each block's forward
// (model.reshard_after_forward), and whether routed experts run stacked
// (model.moe_use_grouped_mm: their gradients come one projection at a time, not expert by
// expert, which orders the buckets).
struct ShardingOptions {
  torch::TensorOptions weights;
  torch::ScalarType reduce_dtype;
  double bucket_mib;
  bool reshard_after_forward;
  bool stacked_experts = true;
};

}  // namespace primecfg::train
