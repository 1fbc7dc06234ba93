// The memory model of the planner (memory.hpp; docs/memory-planner.md): the GPU and
// host terms every offload mode shares, and the phases of a step that add them up.
// Wherever the modes differ it asks the mode's memory model, beside the mode's
// pipeline (planner/memory_model.hpp); no code here tests the mode.
#include "planner/memory.hpp"

#include "distributed/piece_layout.hpp"
#include "distributed/shard_layout.hpp"
#include "nn/activation_window.hpp"
#include "nn/loss_chunking.hpp"
#include "planner/memory_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace primecfg::train::plan::detail {

namespace {

i64 pow2_ceil(i64 bytes) {
  if (bytes <= 1) return bytes;
  i64 p = 1;
  while (p < bytes) p <<= 1;
  return p;
}

bool muon_handles(const ParamShape& p) { return muon_matrix(p.is_matrix(), static_cast<int>(p.block)); }

}  // namespace

i64 round_up(i64 bytes, i64 block) { return block <= 1 ? bytes : (bytes + block - 1) / block * block; }

i64 device_rounding(const Workload& w) { return w.a.cuda ? w.a.device_block : 1; }

i64 pinned_bytes(const Workload& w, i64 bytes) {
  return w.a.cuda && w.a.pinned_pow2 ? pow2_ceil(bytes) : bytes;
}

i64 shard_numel(i64 numel, i64 world) { return ShardSpan::of(numel, 0, world).per_rank; }

i64 piece_numel(const Workload& w, const ParamShape& p) {
  if (w.mesh.ep == 1 || p.expert < 0) return shard_numel(p.numel(), w.shard_world);
  return piece_of(w.mesh, 0, p.numel(), p.expert, w.experts).per_rank;
}

i64 piece_members(const Workload& w, const ParamShape& p) {
  return w.mesh.ep == 1 || p.expert < 0 ? w.shard_world : w.mesh.dp_shard_mod_ep();
}

bool gathered(const Workload& w, const ParamShape& p) { return holds_expert(w.mesh, 0, p.expert, w.experts); }

int moment_count(const OptInfo& o, const ParamShape& p) {
  return moment_buffers(o.kind, o.momentum, muon_handles(p));
}

i64 model_bytes(const Workload& w) {
  i64 bytes = 0;
  for (const auto& p : w.params) bytes += p.numel() * w.dt;
  return bytes;
}

i64 largest_numel(const Workload& w) {
  i64 n = 0;
  for (const auto& p : w.params) n = std::max(n, p.numel());
  return n;
}

void Builder::add(std::string name, i64 bytes, std::string what) {
  m.terms.push_back({std::move(name), bytes, std::move(what)});
}

void Builder::phase(std::string name, std::vector<std::string> names) {
  Phase p{std::move(name), 0, {}};
  for (auto& n : names) {
    const i64 b = m.term(n);
    if (b == 0) continue;
    p.bytes += b;
    p.terms.push_back(std::move(n));
  }
  m.phases.push_back(std::move(p));
}

MemoryPlan Builder::done() {
  for (const auto& p : m.phases)
    if (m.peak_phase.empty() || p.bytes > m.peak) {
      m.peak = p.bytes;
      m.peak_phase = p.name;
    }
  return std::move(m);
}

OptInfo optimizer_info(const OptimizerConfig& cfg) {
  OptInfo o;
  o.kind = optimizer_kind(cfg);
  std::visit(
      [&](const auto& c) {
        using C = std::decay_t<decltype(c)>;
        o.name = std::string(C::type);
        o.clip = c.max_norm.has_value();
        if constexpr (std::is_same_v<C, SGDConfig>) {
          o.momentum = c.momentum > 0;
          o.nesterov = c.nesterov;
        }
      },
      cfg);
  return o;
}

namespace {

// Device bytes allocated while the optimizer updates one parameter on the device,
// beyond the persistent state (optim/math.hpp's update_on_device; AdamW runs as one
// in-place multi-tensor kernel, and OptimizerOffload's moments sit in the persistent
// window).
i64 update_transient(const OptInfo& o, const ParamShape& p) {
  const i64 n = p.numel();
  switch (o.kind) {
    case OptKind::adamw:
      return 0;
    case OptKind::sign_sgd:
      return 4 * n;  // grad.sign()
    case OptKind::sgd:
      return o.momentum && o.nesterov ? 4 * n : 0;  // grad.add(m1, momentum)
    case OptKind::muon: {
      if (!muon_handles(p)) return 0;
      // grad + momentum (fp32), bf16 iterate x and its successor, a*x, B@x, their sum,
      // and the Gram matrices A, A@A, B of the short side k.
      const i64 k = std::min(p.rows, p.cols);
      return 4 * n + 2 * n * 4 + 2 * k * k * 4;
    }
  }
  return 0;
}

}  // namespace

BlockMemory block_memory(const Workload& w, bool recompute_routed_experts) {
  return w.s.architecture().block_memory(
      w.s, {w.dt, w.a.fused_rms_norm, w.a.fused_swiglu, recompute_routed_experts, w.mesh.ep});
}

i64 checkpointed_blocks(i64 layers, bool ac, i64 freq) {
  if (!ac) return 0;
  return (layers + freq - 1) / freq;  // blocks l with l % freq == 0
}

namespace {

MemoryPlan gpu_plan(const Workload& w, const MemoryModel& mode, bool ac) {
  const auto& s = w.s;
  const i64 dt = w.dt, N = w.N, D = s.hidden, V = s.vocab_size;
  const DeviceState on_device = mode.device_state();
  const i64 blk = device_rounding(w);
  Builder b;

  // --- Persistent state ------------------------------------------------------
  // Sharded runs (world > 1) split every parameter over the ranks (FSDP,
  // distributed/fsdp.hpp): each rank keeps shard_numel elements of the compute
  // weights, the masters, accumulators and moments at rest, and holds whole weights
  // only for what the forward or backward is using: the root (embedding, final norm,
  // LM head) through the step, and the blocks in flight.
  const i64 world = w.shard_world;
  const bool sharded = w.a.sharded();
  i64 weights = 0, masters = 0, grads = 0, moments = 0, max_n = 0;
  i64 weight_shard = 0, gather_temp = 0, root = 0, largest_block = 0;
  i64 max_padded_block = 0, max_padded_root = 0;  // the largest bucket's parameter, by where it is
  std::vector<i64> block_weights(static_cast<std::size_t>(std::max<i64>(s.layers, 0)), 0);
  for (const auto& p : w.params) {
    const i64 n = piece_numel(w, p), members = piece_members(w, p);
    // A routed expert another expert-parallel rank runs is never whole here.
    const i64 whole = gathered(w, p) ? round_up(p.numel() * dt, blk) : 0;
    weights += whole;
    if (p.block >= 0 && p.block < s.layers)
      block_weights[static_cast<std::size_t>(p.block)] += whole;
    else
      root += whole;
    masters += round_up(n * 4, blk);
    grads += round_up(n * 4, blk);
    moments += moment_count(w.opt, p) * round_up(n * 4, blk);
    weight_shard += round_up(n * dt, blk);
    max_n = std::max(max_n, p.numel());
    i64& padded = p.block >= 0 && p.block < s.layers ? max_padded_block : max_padded_root;
    padded = std::max(padded, n * members);
    // A padded parameter is gathered into a buffer of its own, then copied into place.
    if (n > 0 && n * members != p.numel())
      gather_temp = std::max(gather_temp, round_up(n * members * dt, blk));
  }
  for (const i64 bw : block_weights) largest_block = std::max(largest_block, bw);
  if (!sharded) {
    b.add("weights", weights, dt == 2 ? "bf16 compute copy of every parameter" : "fp32 compute weights");
  } else {
    // The root (embedding, final norm, LM head) stays whole through the step. With
    // model.reshard_after_forward a block is freed after its forward and gathered again
    // for its backward; the next block's gather is prefetched while one computes, and
    // waits until the block before is freed: two blocks, while blocks run (the loss and
    // the embedding's backward run with none). Without it, every block stays gathered
    // from its forward to its backward: the whole model from the loss to the last
    // block's backward.
    b.add("weights", root, "whole weights of the root (embedding, final norm, LM head), through the step");
    b.add("blocks_whole",
          w.reshard_after_forward ? std::min<i64>(2, s.layers) * largest_block : weights - root,
          w.reshard_after_forward ? "two blocks whole: the one running and the next, prefetched"
                                  : "every block whole (reshard_after_forward = false)");
    // Startup builds one parameter at a time, keeps its piece and frees the whole.
    b.add("startup_param", round_up(max_n * dt, blk),
          "the largest parameter, built whole at startup before its piece is kept");
  }
  if (on_device.masters) b.add("masters", masters, "FP32 master weights");
  // offload = "none" on the fused AdamW hands autograd's bf16 gradients to the update
  // (below): no FP32 accumulators.
  const bool handed = mode.hands_over_grads(w);
  if (on_device.grads && !handed) b.add("grads", grads, "FP32 gradient accumulators");
  if (on_device.moments) b.add("moments", moments, "optimizer moments (FP32)");
  // Collective buffers of a sharded run. A bucket holds whole parameters, about
  // dist.bucket_mib of full-size gradients in the reduce dtype, and at least its
  // largest padded parameter (one parameter is never split over buckets): the blocks'
  // buckets are alive while the blocks' gradients come, the root's (the embedding, as
  // large as a block or more) only in the head's and the embedding's backward.
  if (sharded) {
    b.add("weight_shard", weight_shard,
          "this rank's piece of every weight (compute dtype): the weights at rest, the all-gathers' input");
    // Blocks: when a bucket's reduce-scatter starts, the one before is still in flight
    // (its pieces are taken when the next goes out): two buckets and their outputs (1/world
    // of each) at once; with Gloo on CUDA, the copy its reduce-scatter sums (one: the
    // bucket before's has usually been summed by then). No measured row peaked in
    // backward_block, so this term is not measured yet.
    const i64 rb = w.reduce_bytes;
    struct Bucket {
      i64 full, out;  // a bucket's full-size gradients, and its 1/world reduce-scatter output
    };
    auto bucket_of = [&](i64 largest) {
      const i64 n = std::max(w.a.bucket_bytes / rb, largest);
      return Bucket{round_up(n * rb, blk), round_up((n + world - 1) / world * rb, blk)};
    };
    const Bucket blocks = bucket_of(max_padded_block), root_param = bucket_of(max_padded_root);
    const i64 copy = w.a.bucket_copy ? 1 : 0;  // Gloo on CUDA: the copy of the bucket being summed
    // One rank in all sums nothing: its gradients go to the pipeline as they come, no bucket.
    const i64 any = w.a.world > 1 ? 1 : 0;
    b.add("grad_buckets", any * (2 * blocks.full + 2 * blocks.out + copy * blocks.full),
          copy ? "gradient reduce-scatter of the blocks: two full-size buckets + their 1/world outputs + "
                 "Gloo's copy of one"
               : "gradient reduce-scatter of the blocks: two full-size buckets + their 1/world outputs");
    // A root parameter larger than a bucket is a bucket of its own, the first (an untied
    // LM head) or the last (the embedding) to fill. Each reduce-scatter is waited for
    // before the next bucket goes, so no block bucket is alive beside it.
    b.add("grad_buckets_root", any * (root_param.full + root_param.out + copy * root_param.full),
          copy ? "gradient reduce-scatter of a root parameter: its bucket, Gloo's copy and its 1/world output"
               : "gradient reduce-scatter of a root parameter: its bucket and its 1/world output");
    b.add("gather_temp", gather_temp, "all-gather output of the largest padded parameter");
    // A checkpoint gathers one weight at a time (padded) after the update, when no
    // weight is whole.
    if (w.ckpt)
      b.add("checkpoint_weight", round_up(std::max(max_padded_block, max_padded_root) * dt, blk),
            "one weight gathered whole for a checkpoint (one at a time)");
  }
  // The mode's own buffers (a window the state streams through) are alive from step
  // to step like the state.
  const std::vector<std::string> buffers = mode.device_buffers(w, b);
  if (w.a.cuda)
    b.add("workspace", w.a.cublas_workspace, "cuBLAS workspace (allocated through the allocator)");
  if (mode.replays_graph(w))
    b.add("graph_workspace", w.a.cublas_workspace, "cuBLAS workspace of the CUDA graph's capture stream");
  std::vector<std::string> persistent = {"weights", "masters", "grads", "moments"};
  persistent.insert(persistent.end(), buffers.begin(), buffers.end());
  persistent.insert(persistent.end(), {"workspace", "graph_workspace", "weight_shard", "gather_temp"});
  // Startup: each weight is drawn in fp32 on the device, then converted.
  b.add("init_draw", 4 * max_n, "fp32 random draw of the largest parameter at startup");

  // --- Activations of one micro-batch ----------------------------------------
  const BlockMemory bm = block_memory(w);
  const i64 full_tok = bm.saved, ckpt_tok = D * dt;
  const i64 n_ckpt = checkpointed_blocks(s.layers, ac, w.ac_freq);
  const bool top_ckpt = ac && (s.layers - 1) % w.ac_freq == 0;
  // Selective checkpointing of the routed experts (when not planned in full): those
  // blocks keep their activations but the experts'.
  const bool selective = !ac && w.selective_experts;
  const i64 n_sel = checkpointed_blocks(s.layers, selective, w.ac_freq);
  const bool top_sel = selective && (s.layers - 1) % w.ac_freq == 0;
  const i64 sel_tok = selective ? block_memory(w, true).saved : full_tok;
  // Activation offloading keeps a window of block inputs on the device, in the forward
  // pass (the last ones) and in the backward pass (the one in use and those brought
  // back ahead of it): the same count either way.
  const bool offload = ac && w.ac_offload;
  const i64 kept = offload ? block_inputs_kept(n_ckpt, w.ac_inflight) : n_ckpt;
  // Blocks that keep all their activations keep their fixed bytes too.
  const i64 whole = s.layers - n_ckpt - n_sel;
  const i64 saved_all = N * (kept * ckpt_tok + n_sel * sel_tok + whole * full_tok);
  const i64 saved_top = top_ckpt ? N * ckpt_tok : top_sel ? N * sel_tok : N * full_tok;
  b.add("activations", saved_all,
        offload
            ? fmt::format(
                  "checkpointed block inputs on the device: the window of {} (the rest in host memory)", kept)
        : ac        ? "checkpointed block inputs (+ blocks not checkpointed)"
        : selective ? "what every block keeps for backward, the routed experts' activations recomputed"
                    : "what every block keeps for backward");
  b.add("activations_below_top", saved_all - saved_top, "activations of all blocks but the last");
  // What a block holds only while it runs (a routed block's experts stacked): the block
  // in forward holds it, the block in backward (some of) it and its gradient. A term of
  // the blocks that have it only, as ep_exchange is (a dense model's plan has neither).
  if (bm.in_use_per_block > 0)
    b.add("block_in_use", bm.in_use_per_block, "the running block's experts stacked for the grouped GEMM");
  b.add("block_recompute", N * full_tok + (top_ckpt ? N * D * dt : 0),
        "the last block's full activations during its backward (+ recompute output)");
  // The last block's backward at its fullest moment, of the architecture's stages (those
  // of a recompute where it runs one). Where the gradients are handed to the update as
  // they come, the in-use bytes' gradient is the parameters' own: the stages count the
  // running block's as it is made, grads_top and grads_blocks_but_running the rest.
  const BlockMemory top_bm = top_sel ? block_memory(w, true) : bm;
  i64 stage = 0;
  for (const BackwardStage& st : top_bm.backward)
    if (!st.recomputed || top_ckpt) stage = std::max(stage, N * st.per_token + st.in_use + st.in_use_grad);
  b.add("backward_temps", stage,
        bm.in_use_per_block > 0
            ? "what one block's backward holds beyond its activations at its fullest: gradients in flight, "
              "its experts stacked again and their gradient, as much of each as is live then"
            : "gradients in flight inside one block's backward");

  // Expert parallelism: in a routed block's forward (and its recompute) the rows its
  // rank received are in flight beside their regrouped copy; at balanced routing as many
  // as its own tokens' slots. Unbalanced routing can send a rank up to every slot of its
  // expert-parallel group, ep times as many rows for its experts to keep for backward:
  // that bound is stated, not planned (debug.force_balanced_routing rules it out).
  if (w.mesh.ep > 1 && s.moe) {
    const i64 rows = N * s.moe->top_k, I = s.moe->intermediate;
    b.add(
        "ep_exchange", 2 * rows * D * dt,
        "expert parallelism: a block's received rows and their copy regrouped by expert (balanced routing)");
    i64 routed = 0;
    for (i64 l = 0; l < s.layers; ++l) routed += s.moe->routed(l) ? 1 : 0;
    b.add("ep_unbalanced", (w.mesh.ep - 1) * rows * (2 * D + 4 * I) * dt * (ac ? 1 : routed),
          fmt::format("not planned: what the experts would keep beyond balanced routing if one rank received "
                      "every slot of its {} ranks",
                      w.mesh.ep));
  }

  // Per-micro-batch inputs: ids, positions, targets (int64), RoPE cos/sin tables.
  b.add("inputs", N * 8 * 3 + 2 * N * s.head_dim * dt, "token ids, positions, targets, RoPE tables");
  if (w.masked) {
    const i64 TT = w.T * w.T;
    const i64 non_ckpt = s.layers - n_ckpt;
    b.add("mask", w.B * TT + non_ckpt * w.B * TT * dt,
          "document mask (bool) + additive mask SDPA keeps per block");
    b.add("mask_below_top", w.B * TT + (non_ckpt - (top_ckpt ? 0 : 1)) * w.B * TT * dt,
          "masks alive during the last block's backward");
    b.add("mask_top", w.B * TT * dt, "the last block's additive mask");
  }

  // --- LM head + cross-entropy (nn/transformer.cpp's LinearCrossEntropy) ------------
  const i64 c = w.ce_chunk;
  b.add("final_norm", N * (rms_norm_saved(D, dt, w.a.fused_rms_norm) + 4),
        "input of the final RMSNorm + rstd");
  b.add("hidden", N * D * dt, "final hidden states (input of the LM head)");
  b.add("ce_grad_h", N * D * dt, "gradient w.r.t. the hidden states, filled chunk by chunk");
  if (mode.loss_walk(w) == LossWalk::vocabulary) {
    // Vocabulary chunks (Transformer::LossChunks::vocabulary; FullOffload asks for them
    // with a tied embedding): chunks of k rows, k = c x V / N tokens' worth but at most V / 8, over all N
    // tokens. The head gradient is written in bf16 row by row (no FP32 copy); the
    // hidden states' gradient sums in FP32 beside a copy of the hidden rows. Per chunk
    // 6 bytes per logit at the peak: the bf16 logits beside their FP32 copy, or the
    // FP32 softmax beside its bf16 copy (on the H200 with LibTorch 2.11 the
    // log-sum-exp's temporaries stayed below that: 13.39 GiB measured on Qwen3-0.6B
    // at 8192, 30.53 on Llama-3.2-3B, 13.37 and 30.54 predicted). FP32 compute: the
    // FP32 logits and the softmax in place, 4 bytes (+4 for the log-sum-exp).
    const i64 k = vocab_chunk_rows(c, V, N);
    b.add("ce_grad_w", V * D * dt, "gradient of the LM head weight, written chunk by chunk");
    b.add("ce_chunk", (dt == 2 ? 6 : 8) * N * k + N * D * (dt + 4) + N * 24,
          fmt::format("logits chunk of {} vocabulary rows x {} tokens (fp32 logits, softmax, casts)", k, N));
  } else {
    b.add("ce_grad_w", V * D * 4, "FP32 gradient of the LM head weight, accumulated over chunks");
    // Per chunk, bf16 compute: the bf16 logits, their fp32 copy and the fp32
    // log-probabilities (10 bytes per logit: LibTorch 2.11's CUDA log_softmax does not
    // take bf16 in with fp32 out, so the trainer casts first; where it does, the peak is
    // 6 and this over-predicts); later that fp32 buffer is the softmax gradient, in
    // place, beside its bf16 copy. Unless the GEMM
    // accumulates straight into the fp32 grad_w (addmm with an fp32 output, CUDA), a
    // bf16 V x D product is added into it. fp32 compute: logits and log-probabilities
    // (8 bytes per logit), the rest in place. Beside them the chunk's hidden rows, indices.
    // With the fused cross-entropy kernel (bf16 on CUDA) the chunk holds its bf16 logits
    // alone, the gradient written over them, and an FP32 loss per token; its hidden rows
    // are a slice of the hidden states and its product is written into ce_grad_h (no
    // gathers, no indices: the kernel skips ignored tokens itself).
    const i64 product = w.a.cuda && w.a.fp32_out_gemm ? 0 : V * D * dt;
    const bool fused_ce = dt == 2 && w.a.cuda && w.a.fused_cross_entropy;
    const i64 chunk = fused_ce  ? 2 * c * V + product + 4 * c
                      : dt == 2 ? 10 * c * V + product + 2 * c * D * dt + c * 24 + N * 8
                                : 8 * c * V + 2 * c * D * dt + c * 24 + N * 8;
    const i64 tail = dt == 2 ? V * D * dt : 0;  // grad_w converted to bf16 after the loop
    b.add("ce_chunk", std::max(chunk, tail),
          fmt::format("logits chunk of {} tokens x vocab ({})", c,
                      fused_ce ? "bf16 logits, gradient in place" : "fp32 logits, softmax, casts"));
  }
  b.add("ce_backward", 2 * (N * D * dt + V * D * dt), "saved LM-head gradients and their scaled copies");

  // --- Backward ----------------------------------------------------------------
  // The tied embedding's gradient from the LM head waits for the embedding's own.
  b.add(
      "embed_grad", (s.tie_embeddings ? 2 : 1) * V * D * dt,
      s.tie_embeddings ? "tied embedding: LM-head gradient held + embedding gradient" : "embedding gradient");
  if (s.tie_embeddings) b.add("embed_grad_held", V * D * dt, "tied embedding's LM-head gradient, held");
  if (handed) {
    // Each parameter's bf16 gradient is held from its backward to the update: an untied
    // LM head's from the head's backward on, the final norm's and the last block's from
    // the last block's backward, every block's by the first block's backward, and the
    // embedding's (a tied head's share summed in) at the update.
    // A block's experts stacked for the grouped GEMM get their gradients as views of the
    // stacked copy's, one projection at a time: the backward's stages count the running
    // block's (backward_temps), these terms the rest.
    const bool stacked_experts = bm.in_use_per_block > 0;
    i64 head = 0, top = 0, blocks = 0, embedding = 0, first_experts = 0;
    for (const auto& p : w.params) {
      const i64 bytes = round_up(p.numel() * dt, blk);
      const bool counted_by_stages = stacked_experts && p.expert >= 0;
      if (p.name == kLmHeadParam) {
        head += bytes;
      } else if (p.name == kEmbeddingParam) {
        embedding += bytes;
      } else {
        blocks += bytes;
        if ((p.block < 0 || p.block == s.layers - 1) && !counted_by_stages) top += bytes;
        if (p.block == 0 && counted_by_stages) first_experts += bytes;
      }
    }
    b.add("grads_head", head, "bf16 gradient of the untied LM head, held for the update");
    b.add("grads_top", top,
          stacked_experts
              ? "bf16 gradients of the final norm and the last block but its experts', held for the update"
              : "bf16 gradients of the final norm and the last block, held for the update");
    b.add("grads_blocks", blocks, "bf16 gradients of every block and the final norm, held for the update");
    if (stacked_experts)
      b.add(
          "grads_blocks_but_running", blocks - first_experts,
          "bf16 gradients of every block but the first block's experts' (the backward's stages count them)");
    b.add("grads_embedding", embedding, "bf16 gradient of the embedding, held for the update");
  }
  if (sharded) {
    // A root gradient goes into its bucket once the backward that made it is done: the
    // LM head's with only its scaled copy left, the embedding's summed (tied) into one.
    b.add("head_grad_out", (s.tie_embeddings ? 0 : V * D * dt) + N * D * dt,
          "the LM head's gradient and the hidden states', as the head's backward returns them");
    b.add("embed_grad_out", V * D * dt, "the embedding's gradient (with a tied LM head's, summed)");
  }

  // Sharded full offload with a tied embedding and one micro-batch a rank splits the
  // embedding's update: the LM head's share of its gradient is summed over the ranks in
  // a copy (the gradient itself goes on into the embedding's): a vocabulary chunk of it
  // at a time in the forward's loss, or all of it as backward starts.
  const UpdateAt update_at = mode.update_at(w);
  const bool split_tied = sharded && s.tie_embeddings && update_at == UpdateAt::host && w.micro_batches == 1;
  const bool by_vocabulary = mode.loss_walk(w) == LossWalk::vocabulary;
  if (split_tied)
    b.add("head_share_sum", (by_vocabulary ? vocab_chunk_rows(w.ce_chunk, V, N) : V) * D * dt,
          "the LM head's share of the tied embedding's gradient, summed over the ranks in a copy");

  // --- Optimizer step -----------------------------------------------------------
  // (The global gradient norm is a multi-tensor reduction to one scalar per tensor.)
  // An update on the host leaves no temporaries on the device.
  if (update_at != UpdateAt::host) {
    i64 update = 0;
    for (const auto& p : w.params) update = std::max(update, update_transient(w.opt, p));
    b.add("step_transient", update, "optimizer temporaries of the largest parameter");
  }

  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> v = persistent;
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  b.phase("startup", sharded ? std::vector<std::string>{"weight_shard", "startup_param", "init_draw"}
                             : std::vector<std::string>{"weights", "init_draw"});
  if (sharded && w.ckpt) {
    std::vector<std::string> saving = {"checkpoint_weight"};
    for (const auto& t : persistent)
      if (t != "weights") saving.push_back(t);  // the root is freed after the update too
    b.phase("checkpoint", saving);
  }
  // Sharded runs: the blocks held whole (blocks_whole) while blocks run; without
  // resharding, from the last block's forward to its backward.
  const std::string held = sharded && !w.reshard_after_forward ? "blocks_whole" : "";
  if (sharded || bm.in_use_per_block > 0)
    b.phase("forward_block", with({"activations", "mask", "inputs", sharded ? "blocks_whole" : "",
                                   "ep_exchange", "block_in_use"}));
  b.phase("forward", with({"activations", "mask", "inputs", "final_norm", "hidden", "ce_grad_h", "ce_grad_w",
                           "ce_chunk", held, by_vocabulary ? "head_share_sum" : ""}));
  // The gradient buckets (absent at world 1) fill from the gradient hooks: the blocks'
  // through the blocks' backward, a root parameter's when its gradient comes (the
  // LM head's here unless it is the tied embedding, whose gradient waits).
  b.phase("backward_head", with({"activations", "mask", "inputs", "final_norm", "ce_backward", held,
                                 by_vocabulary ? "" : "head_share_sum"}));
  if (sharded && !s.tie_embeddings)
    b.phase("head_reduce", with({"activations", "mask", "inputs", "final_norm", "head_grad_out", held,
                                 "grad_buckets_root"}));
  // An update in the gradient hooks has its temporaries in backward.
  const std::string in_hooks = update_at == UpdateAt::gradient_hooks ? "step_transient" : "";
  b.phase("backward_block", with({"activations_below_top", "mask_below_top", "mask_top", "inputs",
                                  "block_recompute", "backward_temps", "embed_grad_held", in_hooks,
                                  "grad_buckets", "blocks_whole", "grads_head", "grads_top", "ep_exchange"}));
  // Held gradients grow as the activations shrink: the first block's backward, with
  // every block's gradient (its own whole, but its stacked experts', which its stages
  // count as they are made) and only its own activations.
  if (handed)
    b.phase("backward_first_block",
            with({"mask_top", "inputs", "block_recompute", "backward_temps", "embed_grad_held", "grads_head",
                  bm.in_use_per_block > 0 ? "grads_blocks_but_running" : "grads_blocks"}));
  b.phase("backward_embedding", with({"inputs", "embed_grad", in_hooks, "grads_head", "grads_blocks"}));
  if (sharded) b.phase("embedding_reduce", with({"inputs", "embed_grad_out", in_hooks, "grad_buckets_root"}));
  if (update_at != UpdateAt::host)
    b.phase("optimizer_step", with({"step_transient", "grads_head", "grads_blocks", "grads_embedding"}));
  return b.done();
}

MemoryPlan host_plan(const Workload& w, const MemoryModel& mode, bool ac) {
  Builder b;
  b.add("runtime", w.a.host_runtime, "LibTorch + CUDA runtime resident in the process");
  b.add("data", w.batch * w.T * 32 + w.N * 32 + w.jsonl_bytes * 9,
        "one step's token vectors (+ a JSONL file's tokens)");
  const HostTerms own = mode.host_terms(w, b);
  // Activation offloading: one micro-batch's block inputs beyond the device's window,
  // in one host buffer allocated to the byte (pinned on CUDA unless pin_memory is off),
  // held from the first step on.
  if (ac && w.ac_offload)
    b.add("activations_offloaded",
          block_inputs_offloaded(checkpointed_blocks(w.s.layers, true, w.ac_freq), w.ac_inflight) * w.N *
              w.s.hidden * w.dt,
          w.ac_pinned && w.a.cuda ? "checkpointed block inputs offloaded (pinned)"
                                  : "checkpointed block inputs offloaded");
  // Startup: an HF directory's safetensors files are mapped while loading.
  b.add("init", w.hf_weight_bytes, "mapped safetensors files while loading the weights");
  if (w.ckpt) {
    // A checkpoint writes one tensor at a time, each copied to the host first: a whole
    // weight (rank 0), or one of the FP32 state's pieces that the mode keeps on the device.
    i64 largest = largest_numel(w) * w.dt;
    const DeviceState on_device = mode.device_state();
    if (w.ckpt_optimizer && (on_device.masters || on_device.moments))
      for (const auto& p : w.params) largest = std::max(largest, 4 * piece_numel(w, p));
    b.add("checkpoint", largest, "host copy of the largest tensor a checkpoint writes (one at a time)");
  }
  std::vector<std::string> state = {"runtime", "data"};
  state.insert(state.end(), own.state.begin(), own.state.end());
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> v = state;
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  b.phase("startup", {"runtime", "data", "init"});
  std::vector<std::string> step = own.step;
  step.push_back("activations_offloaded");
  b.phase("step", with(step));
  if (w.ckpt) b.phase("checkpoint", with({"checkpoint"}));
  return b.done();
}

ModePlan plan_with(const Workload& w, Offload mode, const MemoryModel& model, bool ac) {
  ModePlan m;
  m.mode = mode;
  m.ac = ac;
  m.gpu = gpu_plan(w, model, ac);
  m.host = host_plan(w, model, ac);
  // The ranks of one node share its host memory: each is a process with the same plan.
  m.host_node = m.host.peak * w.a.per_node();
  const double slack = m.gpu.peak * w.a.allocator_slack;
  m.gpu_total = m.gpu.peak + static_cast<i64>(slack) + (w.a.cuda ? w.a.cuda_context : 0);
  m.gpu_total += model.reserved_gpu(w);
  if (w.a.gpu_capacity) m.gpu_fits = m.gpu_total <= *w.a.gpu_capacity;
  if (w.a.host_capacity) m.host_fits = m.host_node <= *w.a.host_capacity;
  return m;
}

}  // namespace

ModePlan plan_mode(const Workload& w, Offload mode, bool ac) {
  // The one mapping from a mode to its memory model: visit_offload picks the strategy
  // (as it picks the pipeline), and memory_model<Strategy> fails to compile for a
  // strategy without a model.
  return plan_with(w, mode, memory_model_of(mode), ac);
}

}  // namespace primecfg::train::plan::detail
