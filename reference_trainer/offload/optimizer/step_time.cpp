// OptimizerOffload's step model (planner/step_model.hpp): every FP32 moment comes up
// and goes back over PCIe each step. On a GPU without clipping the pipeline's order is
// replayed (step_replay.hpp: each group's update in the hook of its last gradient, its
// moments fetched ahead into the window); otherwise a closed form, the streams beside
// the backward, or after it with clipping.
#include "offload/optimizer/step_replay.hpp"
#include "offload/shared/copy_pieces.hpp"
#include "offload/shared/ring_size.hpp"
#include "optim/update_groups.hpp"
#include "planner/step_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace primecfg::train::plan::detail {

namespace {

// The pipeline's groups as the replay takes them (offload/optimizer/step_replay.hpp), with
// this rank's pieces: update_groups over the parameters in the trainer's order, the
// hooks' order its reverse (the LM head's first, the blocks' last to first), the input
// embedding apart (its tail buffer); the window as ring_capacity sizes it; the last
// groups' write-backs deferred up to the share of the window (plan_order).
MomentReplayInputs replay_inputs(const StepContext& x) {
  const Workload& w = x.w;
  const MachineProfile& p = x.p;
  const ModelShape& s = w.s;
  MomentReplayInputs in;
  std::vector<int> block;
  std::vector<std::size_t> bytes;
  std::vector<double> numel, pieces;
  std::size_t largest = 0, total = 0;
  for (const auto& ps : w.params) {
    const double n = static_cast<double>(piece_numel(w, ps));
    const int k = moment_count(w.opt, ps);
    const auto b = static_cast<std::size_t>(4 * n * k);
    const double copies = k * std::ceil(4 * n / static_cast<double>(kCopyPieceBytes));
    if (ps.name == kEmbeddingParam) {
      in.tail = MomentGroup{static_cast<double>(b), copies, n, 0, false};
      continue;
    }
    block.push_back(w.opt.kind == OptKind::adamw ? ps.block : -1);
    bytes.push_back(b), numel.push_back(n), pieces.push_back(copies);
    largest = std::max(largest, b), total += b;
  }
  in.window_bytes = static_cast<double>(
      ring_capacity(static_cast<std::int64_t>(largest), static_cast<std::int64_t>(total), w.a.ring_bytes));
  const auto groups = update_groups(block, bytes, static_cast<std::size_t>(in.window_bytes) / 4);
  // Deferred: the parameters last in the hooks' order, while they fit the share.
  const double share = w.a.deferred_share.value_or(0) * in.window_bytes;
  std::vector<char> deferred(bytes.size(), 0);
  double held = 0;
  for (std::size_t i = 0; i < bytes.size() && held + static_cast<double>(bytes[i]) <= share; ++i)
    held += static_cast<double>(bytes[i]), deferred[i] = 1;
  // The backward's GPU time (with what runs beside it), each block's spread over its groups
  // by their moments, the LM head's before the first.
  const double L = static_cast<double>(std::max<std::int64_t>(1, s.layers));
  const double per_block = std::max(0.0, x.bwd_wall(0) - x.c.head_backward) / L;
  std::vector<double> block_bytes(static_cast<std::size_t>(std::max<std::int64_t>(1, s.layers)), 0);
  for (std::size_t i = 0; i < block.size(); ++i)
    if (block[i] >= 0) block_bytes[static_cast<std::size_t>(block[i])] += static_cast<double>(bytes[i]);
  for (auto g = groups.rbegin(); g != groups.rend(); ++g) {
    MomentGroup m;
    m.deferred = true;
    for (auto i : *g) {
      m.bytes += static_cast<double>(bytes[i]), m.copies += pieces[i], m.params += numel[i];
      m.deferred = m.deferred && deferred[i];
    }
    const int b = block[g->front()];
    if (b >= 0 && block_bytes[static_cast<std::size_t>(b)] > 0)
      m.backward_s = per_block * m.bytes / block_bytes[static_cast<std::size_t>(b)];
    in.groups.push_back(m);
  }
  if (!in.groups.empty()) in.groups.front().backward_s += x.c.head_backward;
  in.forward_s = x.fwd_wall;
  // Activation offloading's block inputs come back up beside the backward: the moments'
  // share of the link up (the replay has one stream a direction).
  const double moments_up = static_cast<double>(total) + in.tail.bytes;
  in.h2d_bytes_per_s = p.link.h2d_both_gbs * kGB * moments_up / (moments_up + x.off_bytes);
  in.d2h_bytes_per_s = p.link.d2h_both_gbs * kGB;
  in.copy_s = p.link.copy_us.value_or(0) * 1e-6;
  in.update_params_per_s = p.gpu.adamw_params_per_s;
  return in;
}

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
    // Each group's update in the hook of its last gradient, its moments fetched ahead into
    // the window: on a GPU, replayed.
    if (w.a.cuda) {
      const MomentReplayResult r = replay_optimizer_step(replay_inputs(x));
      if (r.replayed) {
        const double gpu = last_fwd + x.bwd_wall(t.gpu_update);
        if (r.step > 1.02 * gpu && bound == "GPU compute") bound = "PCIe";
        t.unsure.push_back(fmt::format(
            "optimizer: the step replayed at the calibrated rates (docs/memory-planner.md, \"Step time\"): "
            "the updates waiting for their moments {:.3f} s, the uploads for window room {:.3f} s",
            r.update_wait, r.room_wait));
        return x.earlier + std::max(gpu, r.step);
      }
    }
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
