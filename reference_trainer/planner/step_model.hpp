// What an offload mode tells the step-time model: the interface of a mode's step
// model, and the one mapping from a strategy to it, as planner/memory_model.hpp is for
// memory. The planner owns it and never includes offload/: each mode implements it
// beside its pipeline (offload/<mode>/step_time.cpp).
//
// planner/step_time.cpp times what every mode shares (the blocks, the head, the
// collectives, activation offloading's copies) and asks the mode for the last
// micro-batch of the step, where the modes differ: what the update costs and what it
// overlaps. docs/memory-planner.md ("Step time") derives every term. No LibTorch.
#pragma once

#include "planner/memory.hpp"
#include "planner/profile.hpp"
#include "planner/step_time.hpp"

#include <primecfg/offload.hpp>

#include <string>

namespace primecfg::train::plan::detail {

inline constexpr double kGB = 1e9;

// The step so far, for one micro-batch, in seconds (bytes where named so).
struct StepContext {
  const Workload& w;
  const MachineProfile& p;
  const ComputeTimes& c;
  double shard = 1;        // ranks that split the state
  double rank_params = 0;  // this rank's share of the parameters
  double fwd = 0, recompute = 0, bwd = 0;
  double off_bytes = 0;     // activation offloading's block inputs, each way
  double pin = 1;           // 1, or the link's pageable factor
  double gather_b = 0;      // the gathers beside the backward (reshard_after_forward)
  double reduce = 0;        // the gradient reductions beside the backward
  double fwd_wall = 0;      // the forward with what runs beside it
  double compute_wall = 0;  // fwd_wall + bwd_wall(0)
  double earlier = 0;       // the micro-batches before the last: compute_wall each
  // The backward with what runs beside it; `extra`: the mode's own work inside it.
  double bwd_wall(double extra) const;
};

class StepModel {
 public:
  virtual ~StepModel() = default;
  // The step's wall time: the earlier micro-batches, then the last one with the mode's
  // update and copies. Sets the mode's terms of t (gpu_update, link, cpu_update) and
  // adds its doubts to t.unsure; `bound` comes in as "GPU compute" or "collectives" and
  // leaves as what sets the step.
  virtual double step(const StepContext& x, StepTime& t, std::string& bound) const = 0;
  // What the mode costs each step, in one clause for --plan's advice (`params`: the
  // model's, in billions).
  virtual std::string cost(double billion_params) const = 0;
};

// The model of a strategy; deleted for a strategy without one (it does not build).
template <offload_strategy Strategy>
const StepModel& step_model() = delete;
template <>
const StepModel& step_model<NoOffload>();  // offload/none/step_time.cpp
template <>
const StepModel& step_model<OptimizerOffload>();  // offload/optimizer/step_time.cpp
template <>
const StepModel& step_model<FullOffload>();  // offload/full/step_time.cpp

inline const StepModel& step_model_of(Offload mode) {
  return visit_offload(mode,
                       []<class Strategy>(Strategy) -> const StepModel& { return step_model<Strategy>(); });
}

}  // namespace primecfg::train::plan::detail
