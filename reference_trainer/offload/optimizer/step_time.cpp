// OptimizerOffload's step model (planner/step_model.hpp): every FP32 moment comes up
// and goes back over PCIe each step, beside the backward (each block's update in the
// hook of its last gradient, its moments fetched ahead, the write-backs from the first
// final gradient on) and, for the embedding, beside the forward; with clipping the
// updates wait for the end of backward.
#include "offload/shared/copy_pieces.hpp"
#include "planner/step_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace primecfg::train::plan::detail {

namespace {

class OptimizerOffloadStep final : public StepModel {
 public:
  double step(const StepContext& x, StepTime& t, std::string& bound) const override {
    const Workload& w = x.w;
    const MachineProfile& p = x.p;
    t.gpu_update = x.rank_params / p.gpu.adamw_params_per_s;
    // Every FP32 moment comes up and goes back: 4 bytes each per moment and direction,
    // one copy per moment and 64 MiB piece (offload/shared/copies.hpp), each costing
    // the profile's copy_us beyond its bytes.
    double moment_params = 0, emb_params = 0, copies = 0, emb_copies = 0;
    for (const auto& ps : w.params) {
      const double k = moment_count(w.opt, ps), per_moment = static_cast<double>(ps.numel()) / x.shard;
      const double pieces = k * std::ceil(4 * per_moment / static_cast<double>(kCopyPieceBytes));
      moment_params += k * per_moment;
      copies += pieces;
      if (ps.name == kEmbeddingParam) emb_params += k * per_moment, emb_copies += pieces;
    }
    const double copy_s = p.link.copy_us.value_or(0) * 1e-6;
    if (!p.link.copy_us)
      t.unsure.push_back(fmt::format(
          "optimizer: the profile has no per-copy cost (link.copy_us): {:.0f} copies each way are counted by "
          "their bytes alone",
          copies));
    const double up_both = p.link.h2d_both_gbs * kGB, down_both = p.link.d2h_both_gbs * kGB;
    // The embedding's moments come up beside the forward (a stream of their own) and
    // go back after the step's loss is read, beside the next forward.
    const double emb_up = 4 * emb_params / up_both + emb_copies * copy_s;
    const double emb_down = 4 * emb_params / down_both + emb_copies * copy_s;
    const double rest_copies_s = (copies - emb_copies) * copy_s;
    const double rest_up = 4 * (moment_params - emb_params) + x.off_bytes;
    const double down = 4 * (moment_params - emb_params);
    t.link = std::max(emb_up, emb_down) + std::max(rest_up / up_both, down / down_both) + rest_copies_s;
    const double last_fwd = std::max({x.fwd_wall, emb_up, emb_down});
    if (w.opt.clip) {
      // Clipping needs the whole gradient's norm: the updates follow the backward.
      t.unsure.push_back("optimizer with clipping: the moments are assumed to stream only after backward");
      return x.earlier +
             (last_fwd + x.bwd_wall(0) +
              std::max(t.gpu_update, std::max(rest_up / up_both, down / down_both) + rest_copies_s));
    }
    // Each block's update in the hook of its last gradient, its moments fetched ahead.
    // The stream up starts with the forward. The stream down starts with the first
    // update's write-back: an untied LM head's, whose gradient is final once the head's
    // backward ran; with a tied one, the last block's (recomputed first under AC), the
    // head's gradient being final only after the lookup's. Until then the down
    // direction carries only the embedding's write-back (from the step before).
    const ModelShape& s = w.s;
    double first_final = x.c.head_backward, first_group = 0;
    for (const auto& ps : w.params)
      if (s.tie_embeddings ? ps.block == s.layers - 1 : ps.name == kLmHeadParam)
        first_group += static_cast<double>(ps.numel()) / x.shard;
    if (s.tie_embeddings)
      first_final +=
          x.recompute / static_cast<double>(std::max<std::int64_t>(1, s.layers)) + x.c.block_backward;
    const double down_start =
        std::max(emb_down, x.fwd_wall + first_final + first_group / p.gpu.adamw_params_per_s);
    const double stream_up = last_fwd + rest_up / up_both + rest_copies_s;
    const double stream_down = down_start + down / down_both + rest_copies_s;
    const double stream = std::max(stream_up, stream_down);
    if (stream > last_fwd + x.recompute + x.bwd + t.gpu_update && bound == "GPU compute") bound = "PCIe";
    return x.earlier + std::max(last_fwd + x.bwd_wall(t.gpu_update), stream);
  }
  std::string cost(double gb) const override {
    return fmt::format(
        "it streams the optimizer moments over PCIe each step (about {:.0f} GB both ways for {:.2f} B "
        "parameters)",
        16 * gb, gb);
  }
};

}  // namespace

template <>
const StepModel& step_model<OptimizerOffload>() {
  static const OptimizerOffloadStep model;
  return model;
}

}  // namespace primecfg::train::plan::detail
