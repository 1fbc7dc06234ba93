// FullOffload's step model (planner/step_model.hpp): gradients come down and bf16
// weights go back up each step, and the CPU update runs from the first gradient of a
// step into the next step's forward (deferred updates). One micro-batch on a GPU is
// replayed (step_replay.hpp); several micro-batches, or the CPU, wait for every update
// at the end of the step.
#include "offload/full/ring.hpp"
#include "offload/full/step_replay.hpp"
#include "planner/step_model.hpp"

#include "nn/loss_chunking.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace primecfg::train::plan::detail {

namespace {

// The pipeline's units as the replay takes them (offload/full/step_replay.hpp): the
// embedding lookup, each block, the final norm and the LM head, with this rank's
// pieces. A tied embedding splits as the pipeline splits it: the batch's rows go
// through the ring last and the lookup reads them first; the head's share, copied
// into its own buffer first, fills the worker's idle time.
ReplayInputs replay_inputs(const StepContext& x, double grad_bytes, double cpu_rate) {
  const Workload& w = x.w;
  const ModelShape& s = w.s;
  const int L = s.layers;
  ReplayInputs in;
  in.ring_bytes = static_cast<double>(full_ring_bytes(w));
  in.groups.resize(static_cast<std::size_t>(L) + 2);
  for (auto& g : in.groups) g.copy_bytes = grad_bytes;
  ReplayGroup& lookup = in.groups.front();
  ReplayGroup& head = in.groups.back();
  // A job a parameter; small ones merge while the job stays small (a few hundred
  // experts of a block would otherwise be a few hundred jobs to replay).
  const double small = in.ring_bytes / 64 / grad_bytes;
  auto add = [&](ReplayGroup& g, double n) {
    if (!g.jobs.empty() && g.jobs.back() + n <= small)
      g.jobs.back() += n;
    else
      g.jobs.push_back(n);
  };
  ReplayGroup share;  // the tied head share, filler
  for (const auto& q : w.params) {
    const double n = static_cast<double>(piece_numel(w, q));
    if (q.name == kEmbeddingParam) {
      if (!s.tie_embeddings) {
        add(lookup, n);
        continue;
      }
      // The rows a batch reads: at most its tokens (fake data draws them uniformly).
      const double rows = std::min(static_cast<double>(w.N), static_cast<double>(q.rows));
      const double batch = n * rows / static_cast<double>(q.rows);
      add(lookup, batch);
      if (batch >= n) continue;  // the batch reads every row
      // Copied whole into its own buffer; its rows but the batch's updated in slices.
      share.jobs.assign(16, (n - batch) / 16);
      share.copy_bytes = grad_bytes * n / (n - batch);
      continue;
    }
    add(q.block < 0 ? head : in.groups[static_cast<std::size_t>(q.block) + 1], n);
  }
  if (!share.jobs.empty()) {
    // Handed over first in backward with the LM head's group, read last in the forward.
    share.in_ring = false, share.filler = true;
    in.groups.push_back(share);
    std::swap(in.groups[in.groups.size() - 1], in.groups[in.groups.size() - 2]);
  }
  // The passes' GPU time, spread evenly over the blocks (with what runs beside them).
  const double blocks_f = std::max(0.0, x.fwd_wall - x.c.head_forward);
  const double blocks_b = std::max(0.0, x.bwd_wall(0) - x.c.head_backward);
  for (int b = 0; b < L; ++b) {
    in.groups[static_cast<std::size_t>(b) + 1].forward_s = blocks_f / L;
    in.groups[static_cast<std::size_t>(b) + 1].backward_s = blocks_b / L;
  }
  in.groups.back().forward_s = x.c.head_forward, in.groups.back().backward_s = x.c.head_backward;
  in.cpu_params_per_s = cpu_rate;
  in.d2h_bytes_per_s = x.p.link.d2h_both_gbs * kGB;
  in.h2d_bytes_per_s = x.p.link.h2d_both_gbs * kGB;
  return in;
}

// A tied embedding's loss in vocabulary chunks (nn/loss.cpp, by_vocabulary; FullOffload
// asks for it so the head share's gradient comes early) against the fused cross-entropy
// the profile timed: the logits' GEMM once more, and FP32 passes over the logits that the
// fused kernel does not make. Counted from its kernels, per logit: the GEMM's bf16 out (2
// bytes), the cast to FP32 (2 + 4), logsumexp (amax 4, subtract 8, exp 8, sum 4) and,
// in the second walk, the GEMM out and cast again (8), subtract and exp in place (16),
// the scaled bf16 copy (6): 62, less the fused kernel's own read and write (bf16, 4).
// Measured on the H200 (Llama-3.2-1B, 16,384 tokens): the GPU busy 49 ms longer than
// replayed, against 44 ms counted.
constexpr double kVocabularyLossBytes = 58;
double vocabulary_loss_s(const StepContext& x) {
  const ModelShape& s = x.w.s;
  if (!vocab_chunked_loss(s.tie_embeddings, x.w.N)) return 0;
  const double logits = static_cast<double>(x.w.N) * static_cast<double>(s.vocab_size);
  return x.c.head_forward + kVocabularyLossBytes * logits / (x.p.gpu.memory_gbs * kGB);
}

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
    // AdamW's rate as a full run's pipeline ran it, where the profile has one; else the
    // rate under saturating copies (the two differ by host: docs/memory-planner.md).
    const bool in_pipeline = !sign && p.host.adamw_full_params_per_s;
    if (in_pipeline) busy = *p.host.adamw_full_params_per_s;
    const double used = std::min(threads, per_rank);
    if (used != static_cast<double>(p.host.threads)) {
      const double share = std::min(1.0, used / static_cast<double>(p.host.threads));
      alone *= share, busy *= share;
      t.unsure.push_back(fmt::format("full: {} CPU threads a rank, calibrated with {} (scaled linearly)",
                                     used, p.host.threads));
    }
    const double loss = vocabulary_loss_s(x);
    t.forward += static_cast<double>(w.micro_batches) * loss;
    // One micro-batch on a GPU (updates deferred into the next forward): replayed. The
    // update runs beside the copies all along, at the rate measured under them.
    ReplayResult r;
    if (w.micro_batches == 1 && w.a.cuda) {
      ReplayInputs in = replay_inputs(x, grad_bytes, busy);
      in.groups.back().forward_s += loss;
      r = replay_full_step(in);
      if (!r.replayed)
        t.unsure.push_back(
            "full: a gradient larger than the staging ring (offload.ring_mib) cannot be replayed; the "
            "step is timed as if every update waited for the end of the step");
    }
    if (r.replayed) {
      t.cpu_update = x.rank_params / busy;
      const double last = std::max(r.step, t.link);
      if (t.link >= r.step)
        bound = "PCIe";
      else if (r.forward_wait + r.ring_wait > 0.02 * r.step)
        bound = "CPU update";
      if (loss > 0)
        t.unsure.push_back(fmt::format(
            "full with a tied embedding: the loss in vocabulary chunks costs {:.3f} s more than the "
            "calibrated fused cross-entropy, counted (one more LM-head GEMM and {} bytes a logit through "
            "device memory), not measured",
            loss, kVocabularyLossBytes));
      if (bound == "CPU update")
        t.unsure.push_back(
            in_pipeline
                ? "full: the CPU update sets the step, at the rate the profile's full run measured; hosts "
                  "of one machine kind differ (docs/memory-planner.md): --calibrate on this machine "
                  "measures its own"
                : "full: the CPU update sets the step, at the profile's rate under saturating copies (a "
                  "profile without a full run's rate); H200 machines of one kind have run it at 4.9 to "
                  "6.1 G parameters/s (docs/memory-planner.md): --calibrate on this machine measures its "
                  "own");
      t.unsure.push_back(fmt::format(
          "full: the step replayed at the calibrated rates (docs/memory-planner.md, \"Step time\"): the "
          "worker busy {:.3f} s, the forward waiting for it {:.3f} s, backward for staging room {:.3f} s",
          r.cpu_busy, r.forward_wait, r.ring_wait));
      return x.earlier + last;
    }
    t.cpu_update = in_pipeline
                       ? x.rank_params / busy
                       : cpu_update_under_copies(x.rank_params / alone, x.rank_params / busy, down + up,
                                                 (p.link.h2d_both_gbs + p.link.d2h_both_gbs) * kGB);
    // Several micro-batches: the worker sums the gradients into FP32 host accumulators
    // (offload/full/host_grads.hpp) through host memory: the first micro-batch's copied
    // in (bf16 read, FP32 written: 6 bytes a parameter) and each later one's added (10),
    // beside the GPU's next micro-batch; the last one's add and the squares for the norm
    // (14) come before its updates.
    const double M = static_cast<double>(w.micro_batches);
    double sum_last = 0, sum_earlier = 0;
    if (M > 1) {
      const double host_bps = p.host.memory_gbs * kGB;
      sum_last = x.rank_params * 14 / host_bps;
      sum_earlier = std::max(0.0, x.rank_params * (6 + 10 * (M - 2)) / host_bps - x.earlier);
      t.cpu_update += sum_last;
      t.unsure.push_back(
          fmt::format("full with several micro-batches: the host sums the gradients at the calibrated host "
                      "memory bandwidth ({:.3f} s before the last updates), not measured on its own",
                      sum_last));
    }
    // Several micro-batches, or the CPU (no deferral): each step first waits for every
    // update of its last micro-batch, which follows the head's backward.
    const double last =
        std::max({x.fwd_wall + loss + std::max(x.bwd_wall(0), x.c.head_backward + t.cpu_update), t.link});
    if (x.c.head_backward + t.cpu_update >= x.bwd_wall(0) && last > t.link)
      bound = "CPU update";
    else if (t.link >= last)
      bound = "PCIe";
    return x.earlier + sum_earlier + (M - 1) * loss + last;
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
