// Fully sharded data parallel (FSDP), as prime-rl's FSDP2 lays a model out across the
// ranks of a ProcessGroup: every parameter, flattened, is split into `world` equal
// pieces (distributed/shard_layout.hpp), and each rank keeps one piece of it at rest:
// of the compute-dtype weights (here), and of the FP32 master, gradient accumulator
// and moments (wherever the offload strategy puts them). No rank holds the whole model
// at startup either: each parameter is adopted as it is built (its piece kept, the
// whole freed). Per step:
//   1. forward: just before a block's weights are used, every rank's pieces of them
//      are all-gathered into the block's parameters; with model.reshard_after_forward
//      they are freed again once the block's forward is queued, and gathered once more
//      just before its backward; without it they stay until its backward is done.
//      The embedding, the final norm and the LM head (the root, as FSDP2 calls it)
//      stay gathered through the step. Each gather is prefetched: the next block's
//      (the previous one's, in backward) starts when a block's own has arrived, and
//      runs while the block computes. With reshard_after_forward at most two blocks
//      are whole or in flight: a prefetch waits until the block before is freed;
//   2. backward: each gradient, as its hook fires, joins a bucket; a full bucket is
//      reduce-scattered in model.reduce_dtype (sum over ranks) while backward goes
//      on, and when the next bucket goes out (or backward ends) each rank hands its
//      piece of every gradient of it to the offload pipeline (the sink): at most two
//      buckets are alive at once. A block's weights are freed when the last of its
//      gradients is in;
//      with HSDP (model.dp_replicate = R) the pieces are those of a shard group of
//      world / R ranks; a bucket's pieces are then summed over the R replicas too;
//   3. the pipeline updates its pieces and writes the new weights into weight_shard();
//   4. gather_weights(): the whole weights, now stale, are freed; the next forward
//      gathers the new pieces.
// Buckets and gathers are fixed (consecutive parameters) and go out in the same order
// on every rank, so the ranks' collectives always match.
//
// With expert parallelism (model.ep > 1) a routed expert's weights, state and gradient
// live on the ranks of one expert-parallel place only, split over dp_shard_mod_ep
// (distributed/piece_layout.hpp); a block's gather fetches the dense weights over the
// shard group and this rank's experts over dp_shard_mod_ep, the other experts' storage
// stays empty (the block's forward hands their tokens to the ranks that hold them), and
// the experts' gradients are reduce-scattered in buckets of their own over
// dp_shard_mod_ep. A rank's gradient of an expert holds every token of its
// expert-parallel group that was routed there, so the sum over the rest of the ranks is
// the gradient of the whole batch, as for a dense weight (prime-rl divides both by the
// whole data-parallel degree). The sink gets an empty piece for the experts this rank
// does not hold.
//
// Internal to primecfg-train.
#pragma once

#include "distributed/placement.hpp"
#include "distributed/process_group.hpp"
#include "distributed/shard_layout.hpp"
#include "nn/transformer.hpp"

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace primecfg::train {

using torch::Tensor;

class Fsdp {
 public:
  // For a model of `args` whose weights have `o.weights`' dtype and device. The model
  // is built after: adopt() each parameter as it is built, then attach() the model.
  Fsdp(ProcessGroup& group, const ModelArgs& args, const ShardingOptions& o);
  Fsdp(const Fsdp&) = delete;
  Fsdp& operator=(const Fsdp&) = delete;

  ProcessGroup& group() { return group_; }
  // This rank among all (the data it takes: its share of every step's micro-batches).
  int rank() const { return group_.rank(); }
  int world() const { return group_.world(); }
  // This rank's piece of the state: the shard group's ranks split every parameter
  // (all ranks without HSDP); replica r > 0 holds the same pieces as replica 0.
  int shard_rank() const { return group_.shard_rank(); }
  int shard_world() const { return group_.shard_world(); }
  int replica() const { return group_.replica(); }
  // Parameter i (model.params() order) as this rank holds it: every one is split over
  // dp_shard_cp and copied over dp_replicate.
  const ShardSpan& span(std::size_t i) const { return spans_[i]; }
  MeshPlacement placement(std::size_t i) const {
    if (among_[i] == MeshDim::expert_fsdp) return {{MeshDim::ep, MeshDim::expert_fsdp}, MeshDim::replicate};
    return {{MeshDim::fsdp}, MeshDim::replicate};
  }
  // Whether this rank holds a piece of parameter i (false: a routed expert that another
  // expert-parallel rank runs).
  bool holds(std::size_t i) const { return held_[i]; }
  // This rank's piece of parameter i's weights (the model's dtype, on its device): the
  // weights at rest, and where the offload pipeline writes the updated ones.
  Tensor weight_shard(std::size_t i) const;

  // Parameter i, just built (drawn, loaded from an HF directory or a checkpoint): this
  // rank keeps its piece and frees the whole. Every rank builds the same weights (the
  // same seed, the same files), so the pieces fit together without a broadcast.
  void adopt(std::size_t i, NamedParam& p);
  // The model whose parameters were all adopted: its forward gathers them from here
  // on. A collective: every rank must have built the same weights, else an error
  // names the ranks that differ.
  void attach(Transformer& model);

  // The gradients of one backward. The sink gets (parameter, this rank's piece of the
  // gradient summed over the ranks, in reduce_dtype()), when the next bucket goes out
  // or from flush(); with one rank in all, the gradient itself (flattened, in its own
  // dtype) as it comes: there is nothing to sum.
  using Sink = std::function<void(std::size_t param, Tensor& piece)>;
  torch::ScalarType reduce_dtype() const { return reduce_dtype_; }
  void set_sink(Sink sink) { sink_ = std::move(sink); }
  void add_grad(std::size_t i, const Tensor& grad);
  // After each backward: the buckets still open go out (a parameter that got no
  // gradient on this rank counts as zeros).
  void flush();

  // For the next forward only: its embedding lookup reads just these rows (sorted,
  // the union of every rank's input ids), so a tied embedding is not gathered whole
  // for it. Each rank contributes the rows' elements of its piece to one all-reduce;
  // the whole embedding is gathered with the LM head's unit instead, which the
  // offload pipeline uses to finish the tied update beside the forward (`full`).
  // `rows` on the host, and the same on the weights' device (no copy is queued here: one
  // would wait behind the weight uploads queued on the copy engine).
  void lookup_rows(std::vector<std::int64_t> rows, Tensor rows_on_device);
  // Whether the gather of the next block starts while one computes (so it reads that
  // block's pieces early: an offload pipeline must have written them first). Not in a
  // shard group of one, where a gather is a copy on the compute stream: nothing to hide.
  bool prefetches() const { return shard_world() > 1; }
  // Gathers a block's weights before its forward and frees them after (the
  // Transformer's block hooks).
  const Transformer::BlockHook* block_hook() const { return &hook_; }
  // After the update: the whole weights are stale; they are freed, and the next
  // forward gathers the new pieces.
  void gather_weights();
  // The whole weights on every rank, for what reads them outside a forward pass (the
  // demo, the tests): a collective, every rank calls it.
  void gather_all();
  // Parameter i's whole weights, for a checkpoint that writes them one at a time: the
  // parameter itself if it is whole now, else gathered into a tensor of their own that
  // nothing else holds (freed with it). A collective, every rank calls it.
  Tensor whole_weight(std::size_t i);
  // Bytes of whole weights this rank holds now (the pieces are apart): what the
  // sharding leaves resident, for the metrics and the tests.
  std::int64_t gathered_bytes() const;
  // The loop's last forward of the step has been queued: what is whole then is reported.
  void note_forward_end() { whole_after_forward_ = gathered_bytes(); }
  // Its figures of the step, for metrics.jsonl's "pipeline" (docs/trainer.md), since the
  // last call: the whole weights after the last forward and at rest; the most held at
  // once (gathered or being gathered), which the planner's `weights` term predicts; how
  // many gathers were started ahead of their use; how many reduce-scatters ran, and
  // how many while backward went on; the embedding rows the last lookup gathered by
  // rows (0: it gathered the whole embedding).
  std::vector<std::pair<std::string, double>> take_metrics();

  // Sums over all ranks (what each rank computed on its data: the loss).
  void sum(Tensor& t, std::string_view what) { group_.all_reduce_sum(t, what); }
  double sum(double v, std::string_view what);
  // Sums over the pieces of the state, each counted once (the gradient norm): over the
  // shard group, since the replicas hold the same pieces.
  void sum_pieces(Tensor& t, std::string_view what) { group_.all_reduce_sum(t, what, MeshDim::fsdp); }
  double sum_pieces(double v, std::string_view what);

 private:
  struct Bucket {
    std::vector<std::size_t> params;
    MeshDim among = MeshDim::fsdp;  // the ranks it is reduce-scattered over
    std::size_t missing = 0;        // gradients not in yet this backward
  };
  // The ranks that split parameter i, and their number.
  int members(std::size_t i) const { return group_.size(among_[i]); }
  // The sink gets an empty piece of each parameter of unit u that this rank does not
  // hold, once a backward.
  void hand_empty(std::size_t u);
  // The whole of a routed expert that one expert-parallel rank holds, on every rank.
  Tensor whole_expert(std::size_t i);
  // The parameters gathered together: 0 the embedding, 1 + l block l, layers + 1 the
  // final norm and the LM head (a tied head is the embedding).
  struct Unit {
    std::vector<std::size_t> params;
    std::size_t held = 0;  // of which this rank holds pieces (all but other ranks' experts)
    bool root = false;     // gathered through the step
    // whole: the parameters hold the weights; rows: allocated, only the lookup's rows hold them.
    enum State { released, rows, in_flight, whole } state = whole;
    std::size_t missing = 0;                     // gradients not in yet this backward
    std::int64_t bytes = 0;                      // whole weights this rank gathers
    std::vector<ProcessGroup::Pending> pending;  // the all-gathers while in flight (dense, experts)
    std::vector<std::size_t> moving;             // the parameters they gather, in order
    std::vector<Tensor> outs;                    // ... and their outputs (padded ones apart)
  };
  std::size_t unit_of_block(int block) const;
  void start(std::size_t u);   // the all-gather starts
  void gather(std::size_t u);  // ... and has arrived
  void release(std::size_t u);
  void gather_lookup_rows();  // unit 0, the rows of lookup_rows_ only
  // Gathers u ahead once the blocks whole or in flight allow (reshard_after_forward: two).
  void prefetch(std::size_t u);
  void prefetch_if_room();
  void launch_ready();
  void launch(std::size_t b);  // its reduce-scatter starts
  // A gradient as its reduce-scatter reads it: padded, contiguous, in the reduce dtype.
  Tensor reduce_input(std::size_t i, Tensor grad) const;
  void finish_reduce();  // the one in flight has arrived: its pieces go to the sink
  std::string bucket_name(std::size_t b) const;

  ProcessGroup& group_;
  Transformer* model_ = nullptr;
  bool tied_ = false;                      // the embedding is also the LM head
  std::vector<std::int64_t> lookup_rows_;  // for the next forward; empty: gather it whole
  Tensor lookup_rows_dev_;
  torch::ScalarType reduce_dtype_;
  bool reshard_after_forward_;
  std::vector<ShardSpan> spans_;
  std::vector<MeshDim> among_;               // parameter -> the ranks that split it (fsdp, expert_fsdp)
  std::vector<bool> held_;                   // parameter -> whether this rank holds a piece of it
  std::vector<std::int64_t> weight_offset_;  // parameter -> its piece in weight_shards_
  Tensor weight_shards_;
  std::vector<bool> adopted_;
  Tensor checksums_;  // the sum of each parameter as this rank built it
  std::vector<Unit> units_;
  std::size_t want_ = 0;  // the unit to prefetch when there is room; 0: none
  std::int64_t whole_now_ = 0, whole_peak_ = 0, ahead_ = 0;
  std::vector<std::size_t> unit_of_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;
  std::vector<Tensor> inputs_;  // per parameter: its gradient as autograd made it, waiting for its bucket
  std::vector<bool> handed_;    // the gradients handed to the sink this backward (one rank; empty pieces)
  std::size_t next_ = 0;        // the next bucket to go out
  // The bucket whose reduce-scatter is in flight, with what it reads and writes.
  struct Reduce {
    std::size_t bucket = 0;
    ProcessGroup::Pending pending;
    Tensor flat;
    std::vector<Tensor> ins, outs;
  };
  std::optional<Reduce> reducing_;
  std::int64_t reduces_ = 0, overlapped_ = 0, lookup_rows_gathered_ = 0, whole_after_forward_ = 0;
  // Bytes of gradients held for their buckets and not yet sent (a bucket goes out when it
  // and every bucket before it are full), now and at most since the last metrics.
  std::int64_t waiting_ = 0, waiting_peak_ = 0;
  Sink sink_;
  Transformer::BlockHook hook_;
};

}  // namespace primecfg::train
