// What every offload pipeline shares: the FP32 training state of each parameter
// (where it lives is the strategy's decision, given as a Placement), the hooks that
// hand a fresh gradient to the strategy, and the spans of one step in the host trace.
//
// Internal to primecfg-train.
#pragma once

#include "base/host_trace.hpp"
#include "distributed/shard_layout.hpp"
#include "distributed/sharding.hpp"
#include "nn/transformer.hpp"
#include "optim/math.hpp"

#include <torch/torch.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace primecfg::train {

// FP32 training state of one parameter: all of it, or in a sharded run this rank's
// piece (`shard`: 1-D tensors of shard.per_rank elements, zero padding included).
struct ParamState {
  NamedParam* p = nullptr;
  Tensor master;  // FP32 weights the optimizer updates
  Tensor grad;    // FP32 gradient accumulator over micro-batches (FullOffload: host, made when needed)
  Tensor m1, m2;  // moments (AdamW: exp_avg, exp_avg_sq; SGD/Muon: momentum)
  Tensor weight;  // where the updated weights go: the model's tensor, or this rank's piece of it
  std::optional<ShardSpan> shard;
};

// master := the model's weights (this rank's piece of them).
void master_from_weights(ParamState& s);

// Where a strategy keeps each tensor of a ParamState.
struct Placement {
  torch::TensorOptions master;               // masters of bf16 weights
  torch::TensorOptions master_fp32_weights;  // masters of FP32 weights (tests)
  bool device_grads = false;                 // a zeroed accumulator on `grads`; else none (made when needed)
  torch::TensorOptions grads;
  torch::TensorOptions moments;
};

// One ParamState per model parameter (in model.params() order), placed as `where`
// says, masters not yet set; with `dp`, this rank's pieces only.
std::vector<ParamState> place_state(Transformer& model, const OptSettings& opt, const Placement& where,
                                    const Sharding* dp);

// Bytes of FP32 state in host memory, by category (masters, grads, moments; staging 0).
std::map<std::string, double> host_state_bytes(const std::vector<ParamState>& states);
void add_host_bytes(double& acc, const Tensor& t);

// Bytes of a parameter's moments.
inline std::size_t moment_bytes(const ParamState& s) {
  return (s.m1.defined() ? s.m1.nbytes() : 0) + (s.m2.defined() ? s.m2.nbytes() : 0);
}

inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The post-accumulate-grad hooks on every parameter: once autograd has accumulated a
// parameter's gradient, `on_grad(i, state, grad)` moves it on (the strategy's
// accumulator, or its host pipeline); then the model's copy is freed. In a sharded run
// (`dp`) the gradient goes to dp's buckets first, and on_grad gets this rank's piece of
// the sum over the ranks when its bucket went out. Removed by remove() or the
// destructor, whichever comes first.
class GradHooks {
 public:
  using Fn = std::function<void(std::size_t i, ParamState& s, Tensor& grad)>;
  GradHooks() = default;
  GradHooks(const GradHooks&) = delete;
  GradHooks& operator=(const GradHooks&) = delete;
  ~GradHooks() { remove(); }

  // `trace` and `step` (the step the hooks belong to) must outlive the hooks.
  void install(std::vector<ParamState>& states, HostTrace& trace, const std::int64_t& step, Fn on_grad,
               Sharding* dp);
  void remove();

 private:
  std::vector<ParamState>* states_ = nullptr;
  HostTrace* trace_ = nullptr;
  const std::int64_t* step_ = nullptr;
  Fn on_grad_;
  Sharding* dp_ = nullptr;
};

// The main thread's spans of one step in the host trace: queueing the last
// micro-batch's forward, its backward, finishing the step, reading the loss back.
class StepSpans {
 public:
  explicit StepSpans(HostTrace& trace) : trace_(trace) {}
  void forward_begins() { forward_ = HostTrace::now(); }
  void backward_begins(std::int64_t step) {
    backward_ = HostTrace::now();
    trace_.span("main", "queue forward", forward_, backward_, step);
  }
  // Around finish_step's work.
  HostTrace::clock::time_point finish_begins(std::int64_t step) {
    const auto t = HostTrace::now();
    trace_.span("main", "queue backward", backward_, t, step);
    return t;
  }
  void finish_ends(HostTrace::clock::time_point began, std::int64_t step) {
    finished_ = HostTrace::now();
    trace_.span("main", "finish step", began, finished_, step);
  }
  void step_ends(std::int64_t step) { trace_.span("main", "read back", finished_, HostTrace::now(), step); }

 private:
  HostTrace& trace_;
  HostTrace::clock::time_point forward_, backward_, finished_;
};

}  // namespace primecfg::train
