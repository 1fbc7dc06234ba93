// offload = "optimizer": masters and gradient accumulators on the device, moments in
// pinned host memory. On a GPU the moments go up through a bounded device window on a
// copy stream, fetched ahead in the order the last step's gradients came; without
// clipping a transformer block is updated on the compute stream from the hook of its
// last gradient (with clipping, every parameter after backward), and the moments go
// back on a second copy stream. The copies overlap backward, and the last write-backs
// the next forward. On the CPU the moments are plain host memory and the update is
// NoOffload's.
//
// Internal to primecfg-train. The calls the training loop makes are listed in
// offload/pipeline.hpp.
#pragma once

#include "base/device_streams.hpp"
#include "base/host_trace.hpp"
#include "base/run_error.hpp"
#include "base/staging_ring.hpp"
#include "offload/shared/device_update.hpp"
#include "offload/shared/param_state.hpp"
#include "options.hpp"

#include <primecfg/offload.hpp>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <future>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace primecfg::train {

class OptimizerOffloadPipeline {
 public:
  using strategy = OptimizerOffload;

  OptimizerOffloadPipeline(Transformer& model, const OptSettings& opt, const RunOptions& run, Sharding* dp);
  OptimizerOffloadPipeline(const OptimizerOffloadPipeline&) = delete;
  OptimizerOffloadPipeline& operator=(const OptimizerOffloadPipeline&) = delete;
  ~OptimizerOffloadPipeline();

  std::vector<ParamState>& states() { return states_; }
  // Masters start as (or are reset to) the model's forward weights.
  void masters_from_model();
  // Waits for the moment copies still writing host memory (before a checkpoint reads
  // them, and at the end of a run).
  void sync_host();

  void begin_step(double lr, std::int64_t step, bool single_micro_batch);
  // Before the last micro-batch's forward: the prefetch of the moments starts.
  void begin_last_micro_batch(const std::vector<std::int64_t>& input_ids,
                              const std::vector<std::int64_t>& every_ranks_ids);
  // Once the last forward is queued: the prefetch must be queued in full by now.
  void before_backward();
  const Transformer::BlockHook* block_hook() const { return nullptr; }
  Transformer::LossHooks loss_hooks(bool) const { return {}; }
  Transformer::LossChunks loss_chunks(std::int64_t) const { return Transformer::LossChunks::tokens; }
  // After the last backward: the updates still to run; the global norm before clipping.
  double finish_step();
  // Once the step's loss and norm are read back, the input embedding's moment
  // write-back is queued: a read-back to pageable memory (.item()) waits for a running
  // device-to-host copy, and that one takes 22 ms on Qwen3-0.6B. Queued now, it runs
  // beside the next forward.
  void end_step();
  // Its hooks run host work each step (copies, waits, the CPU worker): never replayed.
  bool replayable() const { return false; }
  void captured() { throw std::logic_error("a CUDA graph of this pipeline's step"); }
  void replayed() { throw std::logic_error("a CUDA graph of this pipeline's step"); }
  void capture_failed() { throw std::logic_error("a CUDA graph of this pipeline's step"); }

  // What the copy pipelines did in the last step.
  std::map<std::string, double> pipeline_stats() const;
  std::map<std::string, double> host_bytes() const { return host_state_bytes(states_); }

 private:
  // Each parameter's moments go up into the window on the h2d stream, the update
  // waits for them on the compute stream, and they go back on the d2h stream; a
  // window region is reused once its write-back ran (a wait queued on the h2d
  // stream, never on the host). Without clipping the update of a parameter runs in
  // its gradient hook, during backward, and the moments of the parameters whose
  // gradients come next (in the order the previous step saw) are fetched ahead while
  // the window has room; with clipping, all updates run after backward, in the
  // same fetch-ahead order.
  struct WindowEntry {
    std::size_t param = 0;
    bool queued = false;  // its update (and write-back) are queued: the region may be reused after `free`
    dev::Marker free;
  };
  // Parameter i's moments on the device for its update (moments_for).
  struct DeviceMoments {
    Tensor m1, m2;
    enum class From { window, tail, temporary } from = From::window;
  };

  double finish_updates();
  void on_grad(std::size_t i, ParamState& s, Tensor& g);
  std::size_t ring_for(std::size_t largest, std::size_t total) const;

  void ensure_window();
  std::pair<Tensor, Tensor> window_views(std::size_t i, std::size_t offset);
  bool fetch(std::size_t i);
  void fetch_ahead();
  DeviceMoments moments_for(std::size_t i);
  void release_moments(std::size_t i, const DeviceMoments& d);
  void update_one_streamed(std::size_t i);
  void update_group_streamed(std::vector<std::size_t> members);
  void record_grad_norm(std::size_t i);
  void write_back(const std::vector<std::size_t>& params, const std::vector<DeviceMoments>& moments);
  void flush_tail_write_back();
  void flush_deferred();
  void plan_order(bool split_tail);
  std::pair<Tensor, Tensor> tail_views();
  void fetch_tail();
  void update_streamed();
  void update_in_hook(const std::vector<std::size_t>& members);
  void make_window_groups();

  OptSettings opt_;
  Sharding* dp_;
  HostTrace trace_;
  StepSpans spans_{trace_};
  torch::Device device_ = torch::kCPU;
  torch::TensorOptions dev_;
  std::optional<std::int64_t> ring_bytes_;  // offload.ring_mib
  double deferred_share_;  // offload.deferred_share (None: 0; primecfg-train resolves it first)
  std::vector<ParamState> states_;
  DeviceAccumulators grads_;
  GradHooks hooks_;
  double lr_ = 0;
  std::int64_t step_ = 0;
  bool last_micro_ = false;
  dev::MaybeStream h2d_, d2h_;  // copy streams (none on the CPU)

  bool overlap_ = false;  // updates run in the gradient hooks (no clipping)
  Tensor step_t_;         // this step's number, on the device (set when updates run in the hooks)
  Tensor grad_norms_;     // FP32 gradient norm per parameter, this step
  Tensor window_;
  StagingRing window_ring_;
  std::deque<WindowEntry> window_entries_;        // one per live window region, oldest first
  std::vector<std::optional<std::size_t>> slot_;  // window offset of a fetched parameter
  std::vector<dev::Marker> ready_;                // its fetch has landed
  std::vector<std::size_t> order_, seen_;         // fetch order; hook order of this step
  std::size_t next_fetch_ = 0;
  std::vector<dev::Marker> written_;  // a parameter's last write-back to host memory
  std::vector<char> updated_;         // updated in this step
  // The parameter whose gradient comes last in backward (the input embedding; on
  // Qwen3-0.6B the tied embedding, 1.2 GB of moments) keeps its moments in a buffer of
  // its own, fetched on a stream of its own as soon as its last write-back is done
  // (beside the forward pass). In the window it would be fetched last, into room
  // that frees only as the last write-backs of backward finish, and the compute
  // stream would wait for that fetch after backward (22 ms on Qwen3-0.6B).
  std::optional<std::size_t> tail_;
  Tensor tail_buf_;
  dev::MaybeStream tail_h2d_;
  bool tail_fetched_ = false;     // its moments are queued into tail_buf_ for this step
  bool tail_write_back_ = false;  // updated; the copy back to host memory waits for end_step()
  std::future<void> prefetch_;    // the prefetch of this step, queued beside the forward
  // The write-backs of the parameters updated last in backward (up to
  // offload.deferred_share of the window, in the order the last step saw) wait for
  // end_step(): queued then, they run beside
  // the next forward, when the device-to-host direction has nothing else to do, instead
  // of after backward, when both directions are busy. Their window regions stay taken
  // until then (the next forward's prefetch uses the rest).
  std::vector<char> defer_;  // parameter i's write-back waits for end_step() this step
  struct Deferred {
    std::vector<std::size_t> params;
    std::vector<DeviceMoments> moments;
  };
  std::vector<Deferred> deferred_;
  std::vector<char> hooked_;  // hook thread: parameter i's hook ran in the last micro-batch
  std::vector<std::vector<std::size_t>> window_groups_;  // update groups (make_window_groups)
  std::vector<std::size_t> group_of_;                    // parameter -> its group
  std::vector<std::vector<std::size_t>>
      group_waiting_;  // hook thread: hooked members of a group not complete yet

  struct Stats {
    double d2h_bytes = 0, h2d_bytes = 0;
  } stats_;  // per step, for the metrics
};

}  // namespace primecfg::train
