// NoOffload's step model (planner/step_model.hpp): the update runs on the GPU once
// backward is done, after everything else.
#include "planner/step_model.hpp"

#include <fmt/format.h>

namespace primecfg::train::plan::detail {

namespace {

class NoOffloadStep final : public StepModel {
 public:
  double step(const StepContext& x, StepTime& t, std::string&) const override {
    t.gpu_update = x.rank_params / x.p.gpu.adamw_params_per_s;
    return x.earlier + x.compute_wall + t.gpu_update;
  }
  std::string cost(double) const override {
    return "every tensor stays on the GPU: no transfers, no CPU work";
  }
};

}  // namespace

template <>
const StepModel& step_model<NoOffload>() {
  static const NoOffloadStep model;
  return model;
}

}  // namespace primecfg::train::plan::detail
