// The step-time model (step_time.hpp; docs/memory-planner.md, "Step time").
//
// GPU compute comes from the profile's measured blocks and heads, rescaled to the
// workload: the attention's share by SDPA's measured throughput at the new length,
// the rest linearly in tokens. Each mode then adds what it moves and computes
// elsewhere, and the overlaps its pipeline has, in its step model beside its pipeline
// (planner/step_model.hpp; offload/<mode>/step_time.cpp). Sharded runs add the gathers beside the forward and
// the reduce-scatters beside the backward; activation offloading its copies beside both.
#include "planner/step_time.hpp"

#include "model/architecture.hpp"

#include "planner/memory_model.hpp"
#include "planner/step_model.hpp"

#include "nn/activation_window.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <optional>

namespace primecfg::train::plan::detail {

namespace {

// Matmul FLOPs of one block per token (forward), as its architecture counts them: the
// mean over the blocks (a Qwen3-MoE model may mix routed and dense ones).
double block_matmul_flops(const ModelShape& s) {
  const Architecture& arch = s.architecture();
  std::int64_t sum = 0;
  for (int l = 0; l < s.layers; ++l) sum += arch.block_active_matmul_params(s, l);
  return 2.0 * static_cast<double>(sum) / static_cast<double>(std::max<std::int64_t>(1, s.layers));
}

// A measured block as a model of that block's shape, for its architecture to count.
ModelShape shape_of(const BlockTiming& b) {
  const Architecture* arch = find_architecture_named(b.architecture);
  if (!arch)
    throw plan_error(fmt::format(
        "the profile has a block of architecture \"{}\", which this build does not have", b.architecture));
  ModelShape s;
  s.layers = 1;
  s.model_type = std::string(arch->model_types().front());
  s.hidden = b.hidden, s.intermediate = b.intermediate, s.heads = b.heads, s.kv_heads = b.kv_heads;
  s.head_dim = b.head_dim, s.qk_norm = b.qk_norm;
  if (b.experts > 0) {
    MoeArgs m;
    m.experts = b.experts, m.top_k = b.top_k, m.intermediate = b.moe_intermediate;
    s.moe = m;
  }
  return s;
}
double block_matmul_flops(const BlockTiming& b) {
  try {
    return block_matmul_flops(shape_of(b));
  } catch (const std::bad_optional_access&) {
    throw plan_error(
        fmt::format("the profile's block of architecture \"{}\" lacks what that architecture needs "
                    "(a Qwen3-MoE block: experts, top_k, moe_intermediate)",
                    b.architecture));
  }
}

// Whether b timed a block of s's shape (in bf16 or FP8: callers pick the kind).
bool same_block(const BlockTiming& b, const ModelShape& s) {
  BlockTiming key = block_key(s);
  key.fp8 = b.fp8;
  return b.same_shape(key);
}

bool same_head(const HeadTiming& h, const ModelShape& s) {
  HeadTiming key;
  key.hidden = s.hidden, key.vocab = s.vocab_size, key.tied = s.tie_embeddings;
  return h.same_shape(key);
}

// The blocks of s's architecture where there are any, else all: a routed block's
// matmuls run far below a dense block's of as many FLOPs (routing, permutation, small
// grouped GEMMs), so FLOPs per token predict throughput only within an architecture
// (Qwen3-1.7B interpolated towards Qwen3-30B-A3B's block was planned 24-40% too slow).
std::vector<BlockTiming> of_this_architecture(std::vector<BlockTiming> blocks, const ModelShape& s) {
  const auto arch = s.architecture().name();
  if (std::any_of(blocks.begin(), blocks.end(), [&](const BlockTiming& b) { return b.architecture == arch; }))
    std::erase_if(blocks, [&](const BlockTiming& b) { return b.architecture != arch; });
  return blocks;
}

// Of those, the blocks whose heads are as wide as s's, where there are any: a block's time
// outside attention is its measured time less attention at the rate calibrated for its head
// width, so blocks of another width carry that estimate's error into the rate interpolated
// (on an H100, Qwen3-1.7B interpolated towards Llama-3.2-1B's 64-wide heads was planned
// 11% too fast; from its own width's blocks, within 3%: docs/memory-planner.md).
std::vector<BlockTiming> of_this_head_width(std::vector<BlockTiming> blocks, const ModelShape& s) {
  if (std::any_of(blocks.begin(), blocks.end(),
                  [&](const BlockTiming& b) { return b.head_dim == s.head_dim; }))
    std::erase_if(blocks, [&](const BlockTiming& b) { return b.head_dim != s.head_dim; });
  return blocks;
}

double attention_flops(std::int64_t heads, std::int64_t head_dim, std::int64_t B, std::int64_t T) {
  const double t = static_cast<double>(T);
  return 2.0 * static_cast<double>(B) * t * t * static_cast<double>(heads * head_dim);
}

// y at x from measured (x, y) points: linear in y over log x between the two around
// it, the nearest outside them (throughputs level off; they are not extrapolated).
double interpolate_log_x(std::vector<std::pair<double, double>> points, double x) {
  std::sort(points.begin(), points.end());
  if (x <= points.front().first) return points.front().second;
  if (x >= points.back().first) return points.back().second;
  for (std::size_t i = 1; i < points.size(); ++i)
    if (x <= points[i].first) {
      const auto [x0, y0] = points[i - 1];
      const auto [x1, y1] = points[i];
      if (x1 == x0) return y1;
      return y0 + (std::log(x) - std::log(x0)) / (std::log(x1) - std::log(x0)) * (y1 - y0);
    }
  return points.back().second;
}

}  // namespace

double attention_forward_flops(const ModelShape& s, std::int64_t B, std::int64_t T) {
  return attention_flops(s.heads, s.head_dim, B, T);
}

double attention_rate(const MachineProfile& p, std::int64_t T, std::int64_t head_dim, bool backward,
                      std::vector<std::string>* unsure) {
  // The entries of the nearest head dimension, by length.
  std::int64_t best_dim = p.gpu.attention.front().head_dim;
  for (const auto& a : p.gpu.attention)
    if (std::abs(a.head_dim - head_dim) < std::abs(best_dim - head_dim)) best_dim = a.head_dim;
  std::vector<std::pair<double, double>> rows;  // (seq_len, FLOP/s)
  for (const auto& a : p.gpu.attention)
    if (a.head_dim == best_dim)
      rows.emplace_back(static_cast<double>(a.seq_len),
                        (backward ? a.backward_tflops : a.forward_tflops) * 1e12);
  std::sort(rows.begin(), rows.end());
  if (unsure && best_dim != head_dim)
    unsure->push_back(fmt::format("attention: head_dim {} not measured, {} used", head_dim, best_dim));
  const double t = static_cast<double>(T);
  if (unsure && t < rows.front().first / 2)
    unsure->push_back(fmt::format("attention: {} tokens is below the shortest length measured ({})", T,
                                  rows.front().first));
  if (unsure && t > rows.back().first * 2)
    unsure->push_back(
        fmt::format("attention: {} tokens is beyond the longest length measured ({})", T, rows.back().first));
  return interpolate_log_x(rows, t);
}

ComputeTimes compute_times(const Workload& w, const MachineProfile& p) {
  ComputeTimes c;
  const ModelShape& s = w.s;
  // The block and head times are those of the kernels the calibration ran.
  const auto& measured = p.provenance.kernels;
  if (w.a.kernels && measured && *w.a.kernels != *measured) {
    auto list = [](const std::vector<std::string>& k) {
      return k.empty() ? "none" : fmt::format("{}", fmt::join(k, ", "));
    };
    c.unsure.push_back(
        fmt::format("GPU times measured with the fused kernels {} and this run uses {}: "
                    "--calibrate on this build measures its own",
                    list(*measured), list(*w.a.kernels)));
  } else if (const auto& src = p.provenance.kernel_sources;
             src && w.a.kernel_sources && *src != *w.a.kernel_sources) {
    c.unsure.push_back(
        fmt::format("GPU times measured with other code of the same fused kernels (sources {}, this "
                    "build's {}): --calibrate on this build measures its own",
                    *src, *w.a.kernel_sources));
  }

  // Blocks timed with the linears this run has (bf16, or FP8 under model.quantization); the
  // other kind only where the profile has none of this one.
  std::vector<BlockTiming> blocks;
  std::copy_if(p.gpu.blocks.begin(), p.gpu.blocks.end(), std::back_inserter(blocks),
               [&](const BlockTiming& b) { return b.fp8 == w.fp8; });
  if (blocks.empty()) {
    blocks = p.gpu.blocks;
    c.unsure.push_back(
        w.fp8
            ? "model.quantization: the profile's blocks are timed in bf16, so the FP8 matmuls' speed is not "
              "in the step time (--calibrate with model.quantization on an sm90 GPU times FP8 blocks)"
            : "the profile's blocks are timed with FP8 linears (model.quantization) and this run's are bf16 "
              "(--calibrate without model.quantization times bf16 blocks)");
  }

  blocks = of_this_architecture(std::move(blocks), s);
  const std::size_t of_architecture = blocks.size();
  blocks = of_this_head_width(std::move(blocks), s);

  // Outside attention, each measured block runs its matmuls (and what goes with them:
  // norms, casts, launches) at some throughput; bigger matmuls run faster.
  auto rest_of = [&](const BlockTiming& b) {
    const double attn = attention_flops(b.heads, b.head_dim, 1, b.tokens);
    return std::pair{
        std::max(0.1 * b.forward_s, b.forward_s - attn / attention_rate(p, b.tokens, b.head_dim, false)),
        std::max(0.1 * b.backward_s,
                 b.backward_s - 2.5 * attn / attention_rate(p, b.tokens, b.head_dim, true))};
  };
  const double flops = block_matmul_flops(s);
  const Coverage coverage = block_coverage(blocks, s);
  double rest_f = 0, rest_b = 0;  // seconds per token outside attention
  const BlockTiming* blk = nullptr;
  for (const auto& b : blocks)
    if (same_block(b, s)) blk = &b;
  if (blk) {
    const auto [f, b] = rest_of(*blk);
    rest_f = f / static_cast<double>(blk->tokens), rest_b = b / static_cast<double>(blk->tokens);
  } else {
    // This shape's throughput from the measured ones, by matmul FLOPs per token.
    std::vector<std::pair<double, double>> fwd_rate, bwd_rate;
    for (const auto& b : blocks) {
      const double x = block_matmul_flops(b);
      const auto [f, bw] = rest_of(b);
      fwd_rate.emplace_back(x, x * static_cast<double>(b.tokens) / f);
      bwd_rate.emplace_back(x, x * static_cast<double>(b.tokens) / bw);
    }
    rest_f = flops / interpolate_log_x(fwd_rate, flops);
    rest_b = flops / interpolate_log_x(bwd_rate, flops);
    const char* how =
        coverage == Coverage::smaller  ? "smaller than any measured block: run at the smallest one's matmul "
                                         "throughput (small blocks run slower, so the step is likely longer)"
        : coverage == Coverage::larger ? "larger than any measured block: run at the largest one's matmul "
                                         "throughput (large blocks run faster, so the step is likely shorter)"
                                       : "its matmul throughput interpolated between the measured blocks' by "
                                         "FLOPs per token";
    c.unsure.push_back(fmt::format(
        "block shape (hidden {}, intermediate {}, {}/{} heads of {}) not in the profile: {}{}", s.hidden,
        s.intermediate, s.heads, s.kv_heads, s.head_dim, how,
        blocks.size() < of_architecture ? fmt::format(" (of the blocks with heads of {})", s.head_dim) : ""));
    const auto arch = s.architecture().name();
    if (std::none_of(blocks.begin(), blocks.end(),
                     [&](const BlockTiming& b) { return b.architecture == arch; }))
      c.unsure.push_back(fmt::format(
          "the profile has no block of architecture \"{}\": its matmul throughput is that of other "
          "architectures' blocks of as many FLOPs (--calibrate on this model measures its own)",
          arch));
  }
  const double attn_f = attention_forward_flops(s, w.B, w.T);
  const double N = static_cast<double>(w.N);
  c.block_forward = rest_f * N + attn_f / attention_rate(p, w.T, s.head_dim, false, &c.unsure);
  c.block_backward = rest_b * N + 2.5 * attn_f / attention_rate(p, w.T, s.head_dim, true);

  // The head: this (hidden, vocab, tied), else a throughput interpolated by hidden x vocab.
  const HeadTiming* head = nullptr;
  for (const auto& h : p.gpu.heads)
    if (same_head(h, s)) head = &h;
  if (head) {
    c.head_forward = head->forward_s * N / static_cast<double>(head->tokens);
    c.head_backward = head->backward_s * N / static_cast<double>(head->tokens);
  } else {
    const double dv = static_cast<double>(s.hidden) * static_cast<double>(s.vocab_size);
    std::vector<std::pair<double, double>> fwd_rate, bwd_rate;  // (hidden x vocab, per second)
    for (const auto& h : p.gpu.heads) {
      const double x = static_cast<double>(h.hidden) * static_cast<double>(h.vocab);
      fwd_rate.emplace_back(x, x * static_cast<double>(h.tokens) / h.forward_s);
      bwd_rate.emplace_back(x, x * static_cast<double>(h.tokens) / h.backward_s);
    }
    c.head_forward = dv * N / interpolate_log_x(fwd_rate, dv);
    c.head_backward = dv * N / interpolate_log_x(bwd_rate, dv);
    c.unsure.push_back(
        fmt::format("LM head (hidden {}, vocabulary {}) not in the profile: its throughput interpolated by "
                    "hidden x vocabulary",
                    s.hidden, s.vocab_size));
  }
  if (w.masked)
    c.unsure.push_back(
        "document masks: SDPA's masked kernel was not calibrated (the flash kernel's rate is used)");
  return c;
}

double StepContext::bwd_wall(double extra) const {
  const double h2d_off = off_bytes / (p.link.h2d_gbs * kGB * pin);
  return std::max({recompute + bwd + extra, gather_b + reduce, h2d_off});
}

StepTime step_time(const Workload& w, Offload mode, bool ac, const MachineProfile& p) {
  StepTime t;
  const ComputeTimes c = compute_times(w, p);
  t.unsure = c.unsure;
  const ModelShape& s = w.s;
  StepContext x{w, p, c};
  const double M = static_cast<double>(w.micro_batches);
  const double L = static_cast<double>(s.layers);
  x.shard = static_cast<double>(w.shard_world);
  const double params = static_cast<double>(s.total_params());
  x.rank_params = params / x.shard;  // this rank's share of the state

  // Per micro-batch.
  x.fwd = L * c.block_forward + c.head_forward;
  x.recompute = static_cast<double>(checkpointed_blocks(s.layers, ac, w.ac_freq)) * c.block_forward;
  if (!ac && w.selective_experts && s.moe) {
    // Selective checkpointing runs the routed experts' forward again: timed as their
    // share of the blocks' matmul parameters (each routed token's three projections).
    double experts = 0, all = 0;
    for (int l = 0; l < s.layers; ++l) {
      if (s.moe->routed(l))
        experts += 3.0 * static_cast<double>(s.moe->top_k * s.hidden * s.moe->intermediate);
      all += static_cast<double>(s.architecture().block_active_matmul_params(s, l));
    }
    x.recompute = static_cast<double>(checkpointed_blocks(s.layers, true, w.ac_freq)) * c.block_forward *
                  (all > 0 ? experts / all : 0.0);
    t.unsure.push_back(
        "ac.mode = \"selective\": the routed experts' recompute is timed as their share of the blocks' "
        "matmul parameters");
  }
  x.bwd = L * c.block_backward + c.head_backward;
  // Expert parallelism: each routed block sends its slots' rows out and back (forward,
  // and again in a recompute) and their gradients (backward), the share for the other
  // ranks of the group crossing NVLink; at balanced routing, not overlapped with compute.
  double exchange = 0;
  if (w.mesh.ep > 1 && s.moe && w.a.world > 1) {
    double routed = 0, recomputed = 0;
    for (int l = 0; l < s.layers; ++l)
      if (s.moe->routed(l)) {
        routed += 1;
        recomputed += ac && l % w.ac_freq == 0 ? 1 : 0;
      }
    const double ep = static_cast<double>(w.mesh.ep);
    const bool in_node = w.mesh.ep <= w.a.per_node();  // a group is consecutive ranks
    const double one_way = static_cast<double>(w.N * s.moe->top_k * s.hidden * w.dt) * (ep - 1) / ep /
                           ((in_node ? p.collectives.intra_node_gbs : p.collectives.inter_node_gbs) * kGB);
    x.fwd += 2 * routed * one_way;
    x.bwd += 2 * routed * one_way;
    x.recompute += 2 * recomputed * one_way;
    exchange = 2 * (2 * routed + recomputed) * one_way;
    t.unsure.push_back(fmt::format(
        "expert parallelism: the all-to-all timed at balanced routing and the stated bandwidth ({}), "
        "not overlapped with compute; not measured",
        p.collectives.source));
  }
  // Gradients summed into FP32 accumulators on the device, where the update does not read
  // autograd's own (offload/shared/device_update.hpp, DeviceAccumulators): each hook copies
  // the step's first gradient (bf16 read, FP32 written: 6 bytes a parameter) and adds each
  // later one (10), on the compute stream during backward. At the calibrated device memory
  // bandwidth; the profile's blocks ran with the hand-over, so without these passes.
  const MemoryModel& memory = memory_model_of(mode);
  if (w.a.cuda && memory.update_at(w) != UpdateAt::host && !memory.hands_over_grads(w)) {
    const double sums = x.rank_params * (6 + 10 * (M - 1)) / (p.gpu.memory_gbs * kGB);
    x.bwd += sums / M;
  }
  t.forward = M * x.fwd;
  t.recompute = M * x.recompute;
  t.backward = M * x.bwd;
  if (w.opt.kind != OptKind::adamw && memory.update_at(w) != UpdateAt::host)
    t.unsure.push_back(fmt::format("{}: the GPU update is timed at fused AdamW's rate", w.opt.name));
  if (w.opt.kind == OptKind::muon)
    t.unsure.push_back("muon: the Newton-Schulz iterations are not in the model");

  // Copies beside the passes (per micro-batch): activation offloading's block inputs
  // go out during the forward and come back during the backward.
  if (ac && w.ac_offload) {
    const std::int64_t blocks = checkpointed_blocks(s.layers, true, w.ac_freq);
    x.off_bytes = static_cast<double>(block_inputs_offloaded(blocks, w.ac_inflight) * w.N * s.hidden * w.dt);
  }
  x.pin = w.ac_pinned ? 1.0 : p.link.pageable_factor;

  // Sharded runs: each gather moves the other ranks' pieces of the bf16 weights, each
  // reduce-scatter theirs of the gradients; HSDP all-reduces the pieces across replicas.
  // With expert parallelism a rank gathers only its own experts, from dp_shard_mod_ep.
  double gather_f = 0;
  if (w.a.sharded() && (w.a.world > 1)) {
    const bool one_node = w.a.world <= w.a.per_node();
    const double bw = (one_node ? p.collectives.intra_node_gbs : p.collectives.inter_node_gbs) * kGB;
    double moved = 0;  // elements of the others' pieces a rank receives in one pass
    for (const auto& q : w.params) {
      const double members = static_cast<double>(piece_members(w, q));
      if (gathered(w, q)) moved += static_cast<double>(q.numel()) * (members - 1) / members;
    }
    gather_f = moved * static_cast<double>(w.dt) / bw;
    x.gather_b = w.reshard_after_forward ? gather_f : 0;
    x.reduce = moved * static_cast<double>(w.reduce_bytes) / bw;
    const double replicas = static_cast<double>(w.a.world) / x.shard;
    if (replicas > 1)
      x.reduce += 2 * x.rank_params * static_cast<double>(w.reduce_bytes) * (replicas - 1) / replicas /
                  (p.collectives.inter_node_gbs * kGB);
    t.collectives = M * (gather_f + x.gather_b + x.reduce + exchange);
    t.unsure.push_back(
        fmt::format("collectives at a stated bandwidth ({}), not measured", p.collectives.source));
  }

  // One micro-batch's forward and backward with what runs beside them.
  const double d2h_off = x.off_bytes / (p.link.d2h_gbs * kGB * x.pin);
  x.fwd_wall = std::max({x.fwd, gather_f, d2h_off});
  t.ac_offload =
      M * (x.off_bytes / (p.link.d2h_gbs * kGB * x.pin) + x.off_bytes / (p.link.h2d_gbs * kGB * x.pin));

  x.compute_wall = x.fwd_wall + x.bwd_wall(0);  // one micro-batch, no update
  x.earlier = (M - 1) * x.compute_wall;
  std::string bound = "GPU compute";
  if (gather_f > x.fwd || x.gather_b + x.reduce > x.recompute + x.bwd) bound = "collectives";

  // The last micro-batch and the update: the mode's own (offload/<mode>/step_time.cpp).
  t.step = step_model_of(mode).step(x, t, bound);
  t.bound = bound;
  const double tokens = M * static_cast<double>(w.N);
  t.tokens_per_s = tokens / t.step;
  t.mfu = t.tokens_per_s * s.flops_per_token(w.T) / (p.gpu.peak_tflops * 1e12);
  return t;
}

double cpu_update_under_copies(double alone_s, double busy_s, double copy_bytes, double link_bytes_per_s) {
  const double slower = std::max(0.0, busy_s - alone_s);  // a busy rate above the rate alone: no effect
  if (slower == 0 || copy_bytes <= 0) return alone_s;
  const double c = slower * copy_bytes / link_bytes_per_s;  // t^2 - alone t - c = 0
  const double t = (alone_s + std::sqrt(alone_s * alone_s + 4 * c)) / 2;
  // Copies that would load the host more than the calibration's (an update shorter than
  // the copies themselves): the busy rate.
  return copy_bytes / t > link_bytes_per_s ? busy_s : t;
}

}  // namespace primecfg::train::plan::detail

namespace primecfg::train::plan {

BlockTiming block_key(const ModelShape& s) {
  BlockTiming key;
  key.architecture = std::string(s.architecture().name());
  key.hidden = s.hidden, key.intermediate = s.intermediate, key.heads = s.heads, key.kv_heads = s.kv_heads;
  key.head_dim = s.head_dim, key.qk_norm = s.qk_norm;
  if (s.moe)
    key.experts = s.moe->experts, key.top_k = s.moe->top_k, key.moe_intermediate = s.moe->intermediate;
  return key;
}

Coverage block_coverage(const MachineProfile& p, const ModelShape& s) {
  return block_coverage(p.gpu.blocks, s);
}

Coverage block_coverage(const std::vector<BlockTiming>& all, const ModelShape& s) {
  using detail::block_matmul_flops;
  const std::vector<BlockTiming> blocks = detail::of_this_architecture(all, s);
  for (const auto& b : blocks)
    if (detail::same_block(b, s)) return Coverage::measured;
  const double flops = block_matmul_flops(s);
  bool below = false, above = false;
  for (const auto& b : blocks) {
    const double x = block_matmul_flops(b);
    below = below || x <= flops;
    above = above || x >= flops;
  }
  return below && above ? Coverage::interpolated : below ? Coverage::larger : Coverage::smaller;
}

}  // namespace primecfg::train::plan
