// Sharded data parallel (ZeRO-2) across the ranks of a ProcessGroup: the compute-dtype
// weights are replicated, while each parameter's FP32 master, gradient accumulator and
// moments are split over the ranks (distributed/shard_layout.hpp) and live where the
// offload strategy puts them. Per step:
//   1. backward: each gradient, as its hook fires, joins a bucket; a full bucket is
//      reduce-scattered in model.reduce_dtype (sum over ranks), and each rank hands
//      its piece of every gradient to the offload pipeline (the sink);
//   2. the pipeline updates its pieces and writes the new weights into weight_shard();
//   3. gather_weights(): every rank's pieces, all-gathered into every rank's model.
// Buckets are fixed (consecutive parameters, last first, as backward produces them)
// and go out in that order on every rank, so the ranks' collectives always match.
//
// Internal to primecfg-train.
#pragma once

#include "distributed/process_group.hpp"
#include "distributed/shard_layout.hpp"
#include "nn/transformer.hpp"

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

namespace primecfg::train {

using torch::Tensor;

class Zero2 {
 public:
  Zero2(ProcessGroup& group, Transformer& model, torch::ScalarType reduce_dtype, double bucket_mib);
  Zero2(const Zero2&) = delete;
  Zero2& operator=(const Zero2&) = delete;

  ProcessGroup& group() { return group_; }
  int rank() const { return group_.rank(); }
  int world() const { return group_.world(); }
  // Parameter i (model.params() order) as this rank holds it.
  const ShardSpan& span(std::size_t i) const { return spans_[i]; }
  // This rank's piece of parameter i's weights (the model's dtype, on its device):
  // where the offload pipeline writes the updated weights.
  Tensor weight_shard(std::size_t i) const;

  // Every rank starts from rank 0's weights.
  void broadcast_weights();

  // The gradients of one backward. The sink gets (parameter, this rank's piece of the
  // gradient summed over the ranks), from the hook whose gradient completed a bucket
  // or from flush().
  using Sink = std::function<void(std::size_t param, Tensor& piece)>;
  void set_sink(Sink sink) { sink_ = std::move(sink); }
  void add_grad(std::size_t i, const Tensor& grad);
  // After each backward: the buckets still open go out (a parameter that got no
  // gradient on this rank counts as zeros).
  void flush();

  // The weights are whole on every rank: nothing to gather before a block's forward.
  const Transformer::BlockHook* block_hook() const { return nullptr; }
  // After the update: the new weights of every rank's pieces into the model.
  void gather_weights();

  // Sums over the ranks.
  void sum(Tensor& t, std::string_view what) { group_.all_reduce_sum(t, what); }
  double sum(double v, std::string_view what);

 private:
  struct Bucket {
    std::vector<std::size_t> params;
    std::size_t missing = 0;  // gradients not in yet this backward
  };
  void launch_ready();
  void launch(std::size_t b);

  ProcessGroup& group_;
  Transformer& model_;
  torch::ScalarType reduce_dtype_;
  std::vector<ShardSpan> spans_;
  std::vector<std::int64_t> weight_offset_;  // parameter -> its piece in weight_shards_
  Tensor weight_shards_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;
  std::vector<Tensor> inputs_;  // per parameter: its padded gradient, waiting for its bucket
  std::size_t next_ = 0;        // the next bucket to go out
  Sink sink_;
};

}  // namespace primecfg::train
