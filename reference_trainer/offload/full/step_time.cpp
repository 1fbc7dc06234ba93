// FullOffload's step model (planner/step_model.hpp): gradients come down and bf16
// weights go back up each step, and the CPU update runs from the first gradient of a
// step into the next step's forward (deferred updates), so it overlaps the whole GPU
// step but for the loss and the head's backward, which it waits for.
#include "planner/step_model.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace primecfg::train::plan::detail {

namespace {

class FullOffloadStep final : public StepModel {
 public:
  double step(const StepContext& x, StepTime& t, std::string& bound) const override {
    const Workload& w = x.w;
    const MachineProfile& p = x.p;
    // Gradients come down in bf16 (one process) or in model.reduce_dtype (the
    // reduce-scattered pieces of a sharded run; on one rank a piece is the bf16
    // gradient widened, narrowed back before the copy); bf16 weights go back up.
    const double reduce_bytes = static_cast<double>(w.reduce_bytes);
    const double grad_bytes = !w.a.sharded()  ? 2.0
                              : w.a.world > 1 ? reduce_bytes
                                              : std::min(2.0, reduce_bytes);
    const double down = x.rank_params * grad_bytes, up = x.rank_params * 2 + x.off_bytes;
    t.link = std::max(down / (p.link.d2h_both_gbs * kGB), up / (p.link.h2d_both_gbs * kGB));
    // The CPU threads: --offload.cpu-threads, else the cores each rank gets less one.
    const double per_rank = static_cast<double>(p.host.cores) / static_cast<double>(w.a.per_node());
    const double threads =
        w.a.cpu_threads ? static_cast<double>(*w.a.cpu_threads) : std::max(1.0, per_rank - 1);
    const bool sign = w.opt.kind == OptKind::sign_sgd;
    double alone = sign ? p.host.sign_sgd_params_per_s : p.host.adamw_params_per_s;
    double busy = sign ? p.host.sign_sgd_busy_params_per_s : p.host.adamw_busy_params_per_s;
    const double used = std::min(threads, per_rank);
    if (used != static_cast<double>(p.host.threads)) {
      const double share = std::min(1.0, used / static_cast<double>(p.host.threads));
      alone *= share, busy *= share;
      t.unsure.push_back(fmt::format("full: {} CPU threads a rank, calibrated with {} (scaled linearly)",
                                     used, p.host.threads));
    }
    t.cpu_update = cpu_update_under_copies(x.rank_params / alone, x.rank_params / busy, down + up,
                                           (p.link.h2d_both_gbs + p.link.d2h_both_gbs) * kGB);
    // The update runs from the first gradient to the next forward's need of the last
    // block: it overlaps everything but the loss and the head's backward.
    const double gpu = x.compute_wall;
    const double cpu = t.cpu_update + x.c.head_forward + x.c.head_backward;
    double last = std::max({gpu, cpu, t.link});
    if (w.micro_batches > 1) {
      // A step of several micro-batches first waits for every update of the last one:
      // no deferral into its forward, the update follows the head's backward.
      last = std::max({x.fwd_wall + std::max(x.bwd_wall(0), x.c.head_backward + t.cpu_update), t.link});
      t.unsure.push_back(
          "full with several micro-batches: the earlier micro-batches' gradients staged into the host "
          "accumulators are not in the model");
    }
    if (cpu >= gpu && cpu >= t.link)
      bound = "CPU update";
    else if (t.link > gpu)
      bound = "PCIe";
    if (bound == "CPU update")
      t.unsure.push_back(
          "full: the host's CPU update rate moved by 7% between two calibrations of one machine, and "
          "full's step times of one binary have measured 0.16 s in one call and 0.29 to 0.35 s in others at "
          "Qwen3-0.6B/8192 (docs/history/performance-log.md)");
    else
      t.unsure.push_back(
          "full: step times of one binary have measured 0.16 s in one call and 0.29 to 0.35 s in others at "
          "Qwen3-0.6B/8192 (docs/history/performance-log.md)");
    return x.earlier + last;
  }
  std::string cost(double gb) const override {
    return fmt::format(
        "its CPU threads update {:.2f} B parameters each step (masters, moments and gradients in host "
        "memory), "
        "which sets the step time when the GPU finishes first",
        gb);
  }
};

}  // namespace

template <>
const StepModel& step_model<FullOffload>() {
  static const FullOffloadStep model;
  return model;
}

}  // namespace primecfg::train::plan::detail
