// An offload pipeline: where the FP32 training state lives and when the update runs.
// The training loop makes these calls, in this order, and nothing else; each
// strategy of <primecfg/offload.hpp> has its pipeline in a file of its own
// (no_offload, optimizer_offload, full_offload), and Pipeline<Strategy> names it.
//
// Rule: a strategy's behaviour lives in its own files, and so does its memory model
// for the planner (memory.cpp beside the pipeline; planner/memory_model.hpp). A test
// of the offload mode (`mode ==`, `if constexpr (Strategy::...)`) outside offload/
// is a bug.
//
// Internal to primecfg-train.
#pragma once

#include "base/run_error.hpp"
#include "distributed/sharding.hpp"
#include "nn/transformer.hpp"
#include "offload/full/full_offload.hpp"
#include "offload/none/no_offload.hpp"
#include "offload/optimizer/optimizer_offload.hpp"
#include "offload/shared/param_state.hpp"
#include "optim/math.hpp"
#include "options.hpp"

#include <primecfg/offload.hpp>

#include <concepts>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace primecfg::train {

template <class P>
concept offload_pipeline =
    std::constructible_from<P, Transformer&, const OptSettings&, const RunOptions&, Sharding*> &&
    requires(P& p, const P& cp, double lr, std::int64_t n, bool last, const std::vector<std::int64_t>& ids) {
  typename P::strategy;  // its offload strategy (<primecfg/offload.hpp>)
  // The FP32 state, per parameter (checkpoints read and write it).
  { p.states() } -> std::same_as<std::vector<ParamState>&>;
  p.masters_from_model();  // masters := the model's weights
  p.sync_host();           // nothing still writes host state
  // One optimizer step:
  p.begin_step(lr, n, last);           // lr, step number, one micro-batch?
  p.begin_last_micro_batch(ids, ids);  // before its forward: its ids, and every rank's
  { cp.block_hook() } -> std::same_as<const Transformer::BlockHook*>;
  { cp.loss_hooks(last) } -> std::same_as<Transformer::LossHooks>;
  { cp.loss_chunks(n) } -> std::same_as<Transformer::LossChunks>;
  p.before_backward();  // its forward is queued
  // A CUDA graph of the forward and backward (base/device_graph.hpp): whether the hooks
  // only queue device work and keep what they are given, so that replays of a capture
  // do what the hooks did; then captured() follows a capture, replayed() each replay,
  // capture_failed() a capture that threw (what its hooks kept is dropped: the micro-batch
  // runs again eagerly).
  { cp.replayable() } -> std::same_as<bool>;
  p.captured();
  p.replayed();
  p.capture_failed();
  { p.finish_step() } -> std::same_as<double>;  // after backward: the norm
  p.end_step();                                 // loss and norm read back
  // Figures for the metrics.
  { cp.pipeline_stats() } -> std::same_as<std::map<std::string, double>>;
  { cp.host_bytes() } -> std::same_as<std::map<std::string, double>>;
};

template <offload_strategy Strategy>
struct pipeline_of;
template <>
struct pipeline_of<NoOffload> {
  using type = NoOffloadPipeline;
};
template <>
struct pipeline_of<OptimizerOffload> {
  using type = OptimizerOffloadPipeline;
};
template <>
struct pipeline_of<FullOffload> {
  using type = FullOffloadPipeline;
};

template <offload_strategy Strategy>
using Pipeline = typename pipeline_of<Strategy>::type;

static_assert(offload_pipeline<Pipeline<NoOffload>>);
static_assert(offload_pipeline<Pipeline<OptimizerOffload>>);
static_assert(offload_pipeline<Pipeline<FullOffload>>);

}  // namespace primecfg::train
