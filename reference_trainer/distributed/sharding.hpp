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
#include "distributed/placement.hpp"
#include "distributed/process_group.hpp"
#include "distributed/shard_layout.hpp"
#include "nn/transformer.hpp"

#include <torch/torch.h>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace primecfg::train {

template <class S>
concept sharding = std::constructible_from<S, ProcessGroup&, const ModelArgs&, const ShardingOptions&> &&
    requires(S& s, const S& cs, std::size_t i, const torch::Tensor& grad, torch::Tensor& t, double v,
             typename S::Sink sink, NamedParam& p, Transformer& model) {
  // Built before the model (from the process group's mesh, the model's parameter list
  // and the options), then given each parameter as it is built (adopt: keep this
  // rank's piece, free the whole), then the model (attach: hook its forward). The loop
  // calls nothing else of a parallelism's own.
  s.adopt(i, p);
  s.attach(model);
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
  { cs.placement(i) } -> std::same_as<MeshPlacement>;  // which mesh dimensions split it, which copy it
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
  // Its own figures of the step, named as metrics.jsonl's "pipeline" reports them; the
  // loop says when the step's last forward is queued.
  s.note_forward_end();
  { s.take_metrics() } -> std::same_as<std::vector<std::pair<std::string, double>>>;
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
