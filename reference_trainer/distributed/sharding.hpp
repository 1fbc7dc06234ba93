// A parallelism: how the ranks of a run share the model's state and its gradients.
// These are the calls the loop, the offload pipelines and the checkpoints make to it,
// and nothing else. Today's is FSDP, with HSDP's replicas (distributed/fsdp.hpp);
// another (expert or tensor parallelism) implements this concept and becomes
// `Sharding` here, so that nothing outside distributed/ names an implementation.
//
// One process (world 1, no launcher) runs without one: the callers hold a null
// `Sharding*` then.
//
// Internal to primecfg-train.
#pragma once

#include "distributed/fsdp.hpp"
#include "distributed/shard_layout.hpp"
#include "nn/transformer.hpp"

#include <torch/torch.h>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace primecfg::train {

template <class S>
concept sharding = requires(S& s, const S& cs, std::size_t i, const torch::Tensor& grad, torch::Tensor& t,
                            double v, typename S::Sink sink) {
  // Where this process stands: among all ranks (its share of the data), and among
  // those that split the state (its piece; replicas hold the same pieces).
  { cs.rank() } -> std::same_as<int>;
  { cs.world() } -> std::same_as<int>;
  { cs.shard_rank() } -> std::same_as<int>;
  { cs.shard_world() } -> std::same_as<int>;
  { cs.replica() } -> std::same_as<int>;
  // Place the state: parameter i's piece that this rank keeps (its FP32 master,
  // accumulator and moments, wherever the offload pipeline puts them; the checkpoint
  // writes and reads these pieces), and where the update writes its new weights.
  { cs.span(i) } -> std::same_as<const ShardSpan&>;
  { cs.weight_shard(i) } -> std::same_as<torch::Tensor>;
  // Hook the gradients: each gradient, as backward produces it, goes in (add_grad);
  // the sink gets this rank's piece of it, summed over the ranks; flush() after each
  // backward sends what is still held.
  s.set_sink(sink);
  { cs.reduce_dtype() } -> std::same_as<torch::ScalarType>;  // the pieces' dtype
  s.add_grad(i, grad);
  s.flush();
  // Gather before use and release after: the forward calls these around each block's
  // weights (null: the weights are whole on every rank), beside the pipeline's own.
  { cs.block_hook() } -> std::same_as<const Transformer::BlockHook*>;
  // Whether that hook gathers the next block ahead (reading its pieces before its use).
  { cs.prefetches() } -> std::same_as<bool>;
  // The next forward's embedding lookup reads only these rows (on the host, and on the
  // weights' device): a tied embedding is gathered whole with the LM head instead.
  s.lookup_rows(std::vector<std::int64_t>{}, grad);
  s.gather_weights();  // after the update: every rank's new weights where the forward reads them
  s.gather_all();      // the whole weights, for what reads them outside a forward (the demo)
  { s.whole_weight(i) } -> std::same_as<torch::Tensor>;   // one whole weight (a checkpoint)
  { cs.gathered_bytes() } -> std::same_as<std::int64_t>;  // whole weights held now
  // Peak whole, gathers prefetched, reduce-scatters overlapped with backward.
  { s.take_collective_stats() } -> std::same_as<typename S::CollectiveStats>;
  // Sums over the ranks (the loss), and over the pieces (the gradient norm).
  s.sum(t, std::string_view{});
  { s.sum(v, std::string_view{}) } -> std::same_as<double>;
  s.sum_pieces(t, std::string_view{});
  { s.sum_pieces(v, std::string_view{}) } -> std::same_as<double>;
};

// FSDP (distributed/fsdp.hpp): weights, FP32 state and gradients sharded, as prime-rl
// lays a model out.
using Sharding = Fsdp;
static_assert(sharding<Sharding>);

}  // namespace primecfg::train
