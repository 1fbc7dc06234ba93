#include "planner.hpp"

#include "json.hpp"
#include "loss_chunking.hpp"
#include "offload/ring_size.hpp"
#include "optimizer_state.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>
#include <sstream>

namespace primecfg::train::plan {

namespace fs = std::filesystem;
using i64 = std::int64_t;

// ---------------------------------------------------------------------------
// Model shapes
// ---------------------------------------------------------------------------

namespace {

std::string preset_list() {
  std::string s;
  for (const auto& n : preset_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace

std::optional<ModelShape> preset_shape(std::string_view name) { return preset(name); }

ModelShape shape_from_hf_config(const fs::path& path) {
  try {
    return read_hf_config(path);
  } catch (const model_config_error& e) {
    throw plan_error(e.what());
  }
}

ModelShape resolve_model(const ModelConfig& model) {
  std::optional<ModelShape> s = preset_shape(model.name);
  if (!s) {
    std::error_code ec;
    const fs::path cfg = fs::path(model.name) / "config.json";
    if (!fs::exists(cfg, ec))
      throw plan_error(
          fmt::format("model.name = \"{}\" is neither a preset ({}) nor a local directory with config.json "
                      "(nothing is downloaded)",
                      model.name, preset_list()));
    s = shape_from_hf_config(cfg);
  }
  if (model.debug && model.debug->num_layers) s->layers = std::min(s->layers, *model.debug->num_layers);
  return *s;
}

// ---------------------------------------------------------------------------
// The memory model
// ---------------------------------------------------------------------------

i64 MemoryPlan::term(std::string_view name) const {
  for (const auto& t : terms)
    if (t.name == name) return t.bytes;
  return 0;
}

const Phase* MemoryPlan::phase(std::string_view name) const {
  for (const auto& p : phases)
    if (p.name == name) return &p;
  return nullptr;
}

const ModePlan& Plan::mode(Offload m, bool toggled_ac) const {
  const auto& v = toggled_ac ? modes_other : modes;
  for (const auto& mp : v)
    if (mp.mode == m) return mp;
  throw plan_error("no plan for that mode");
}

std::string_view mode_name(Offload m) {
  switch (m) {
    case Offload::none:
      return "none";
    case Offload::optimizer:
      return "optimizer";
    case Offload::full:
      break;
  }
  return "full";
}

namespace {

i64 round_up(i64 bytes, i64 block) { return block <= 1 ? bytes : (bytes + block - 1) / block * block; }

i64 pow2_ceil(i64 bytes) {
  if (bytes <= 1) return bytes;
  i64 p = 1;
  while (p < bytes) p <<= 1;
  return p;
}

struct OptInfo {
  OptKind kind = OptKind::adamw;
  bool momentum = false;  // SGD: momentum > 0
  bool clip = false;      // max_norm set
  bool nesterov = false;
  std::string name;
};

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

bool muon_handles(const ParamShape& p) { return muon_matrix(p.is_matrix(), static_cast<int>(p.block)); }

// FP32 moment buffers of one parameter (optimizer_state.hpp, as the trainer allocates them).
int moment_count(const OptInfo& o, const ParamShape& p) {
  return moment_buffers(o.kind, o.momentum, muon_handles(p));
}

// Device bytes allocated while the optimizer updates one parameter, beyond the
// persistent state (trainer.cpp's update_on_device; AdamW runs as one in-place
// multi-tensor kernel, and OptimizerOffload's moments sit in the persistent window).
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

struct Builder {
  MemoryPlan m;
  void add(std::string name, i64 bytes, std::string what) {
    m.terms.push_back({std::move(name), bytes, std::move(what)});
  }
  void phase(std::string name, std::vector<std::string> names) {
    Phase p{std::move(name), 0, {}};
    for (auto& n : names) {
      const i64 b = m.term(n);
      if (b == 0) continue;
      p.bytes += b;
      p.terms.push_back(std::move(n));
    }
    m.phases.push_back(std::move(p));
  }
  MemoryPlan done() {
    for (const auto& p : m.phases)
      if (m.peak_phase.empty() || p.bytes > m.peak) {
        m.peak = p.bytes;
        m.peak_phase = p.name;
      }
    return std::move(m);
  }
};

// Everything about one micro-batch and the model that does not depend on the mode.
struct Workload {
  ModelShape s;
  std::vector<ParamShape> params;
  OptInfo opt;
  Assumptions a;
  i64 dt = 2;  // compute dtype bytes
  i64 B = 1, T = 1, N = 1, batch = 1;
  bool ac = false;
  i64 ac_freq = 1;
  bool masked = false;
  i64 ce_chunk = 0;
  i64 micro_batches = 1;  // per optimizer step
  bool ckpt = false, ckpt_optimizer = false;
  i64 hf_weight_bytes = 0;  // safetensors files mapped while loading an HF directory
  i64 jsonl_bytes = 0;      // size of data.path
};

// Bytes one block keeps for backward, per token (model.cpp's block_forward under
// autograd, with the CUDA kernels: fused RMSNorm saves its input and an FP32 rstd per
// row; SDPA saves q, k, v, its output and an FP32 logsumexp per head; RoPE saves only
// the shared cos/sin tables; the matmuls save their activation input).
struct BlockBytes {
  i64 attn_norm, qkv_in, qk_norm, sdpa, mlp_norm, mlp;
  i64 full() const { return attn_norm + qkv_in + qk_norm + sdpa + mlp_norm + mlp; }
};

// What an RMSNorm over `width` elements keeps per row, besides its FP32 rstd: the fused
// kernel (CUDA) keeps its input; LibTorch's composite fallback (CPU) keeps an FP32 copy
// of the input and the FP32 normalised values.
i64 norm_saved(i64 width, i64 dt, bool fused) { return fused ? width * dt : 8 * width; }

BlockBytes block_bytes(const ModelShape& s, i64 dt, bool fused_norm) {
  const i64 D = s.hidden, q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim, I = s.intermediate;
  BlockBytes b{};
  b.attn_norm = norm_saved(D, dt, fused_norm) + 4;  // x, rstd
  b.qkv_in = D * dt;                                // rmsnorm(x)
  b.qk_norm = s.qk_norm() ? norm_saved(q + kv, dt, fused_norm) + (s.heads + s.kv_heads) * 4
                          : 0;                              // q, k before their norms, rstd
  b.sdpa = (2 * q + 2 * kv) * dt + s.heads * 4;             // q, k, v, out, lse
  b.mlp_norm = norm_saved(D, dt, fused_norm) + 4 + D * dt;  // x1, rstd, rmsnorm(x1)
  b.mlp = 4 * I * dt;                                       // gate, silu, up, product
  return b;
}

i64 checkpointed_blocks(i64 layers, bool ac, i64 freq) {
  if (!ac) return 0;
  return (layers + freq - 1) / freq;  // blocks l with l % freq == 0
}

MemoryPlan gpu_plan(const Workload& w, Offload mode, bool ac) {
  const auto& s = w.s;
  const i64 dt = w.dt, N = w.N, D = s.hidden, V = s.vocab_size;
  const i64 q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim, I = s.intermediate;
  const bool masters_dev = mode != Offload::full, grads_dev = mode != Offload::full,
             moments_dev = mode == Offload::none;
  const i64 blk = w.a.cuda ? w.a.device_block : 1;
  Builder b;

  // --- Persistent state ------------------------------------------------------
  i64 weights = 0, masters = 0, grads = 0, moments = 0, max_n = 0;
  for (const auto& p : w.params) {
    weights += round_up(p.numel() * dt, blk);
    masters += round_up(p.numel() * 4, blk);
    grads += round_up(p.numel() * 4, blk);
    moments += moment_count(w.opt, p) * round_up(p.numel() * 4, blk);
    max_n = std::max(max_n, p.numel());
  }
  b.add("weights", weights, dt == 2 ? "bf16 compute copy of every parameter" : "fp32 compute weights");
  if (masters_dev) b.add("masters", masters, "FP32 master weights");
  if (grads_dev) b.add("grads", grads, "FP32 gradient accumulators");
  if (moments_dev) b.add("moments", moments, "optimizer moments (FP32)");
  // Without clipping the input embedding, whose gradient comes last, keeps its
  // moments in a buffer of its own and the window serves the rest (trainer.cpp, tail_).
  const bool split_tail = mode == Offload::optimizer && w.a.cuda && !w.opt.clip;
  i64 largest_moments = 0, total_moments = 0, tail_moments = 0;
  for (const auto& p : w.params) {
    const i64 bytes = 4 * p.numel() * moment_count(w.opt, p);
    if (split_tail && p.name == "model.embed_tokens.weight") {
      tail_moments = bytes;
      continue;
    }
    largest_moments = std::max(largest_moments, bytes);
    total_moments += bytes;
  }
  if (mode == Offload::optimizer && w.a.cuda) {
    b.add("moment_window", round_up(ring_capacity(largest_moments, total_moments, w.a.ring_bytes), blk),
          "device window the moments stream through (kept after the first step)");
    if (tail_moments > 0)
      b.add("moment_tail", round_up(tail_moments, blk),
            "the input embedding's moments, fetched beside the forward pass (from the second step)");
  }
  if (w.a.cuda)
    b.add("workspace", w.a.cublas_workspace, "cuBLAS workspace (allocated through the allocator)");
  const std::vector<std::string> persistent = {"weights",       "masters",     "grads",    "moments",
                                               "moment_window", "moment_tail", "workspace"};
  // Startup: each weight is drawn in fp32 on the device, then converted.
  b.add("init_draw", 4 * max_n, "fp32 random draw of the largest parameter at startup");

  // --- Activations of one micro-batch ----------------------------------------
  const BlockBytes bb = block_bytes(s, dt, w.a.fused_rms_norm);
  const i64 full_tok = bb.full(), ckpt_tok = D * dt;
  const i64 n_ckpt = checkpointed_blocks(s.layers, ac, w.ac_freq);
  const bool top_ckpt = ac && (s.layers - 1) % w.ac_freq == 0;
  const i64 saved_all = N * (n_ckpt * ckpt_tok + (s.layers - n_ckpt) * full_tok);
  const i64 saved_top = N * (top_ckpt ? ckpt_tok : full_tok);
  b.add("activations", saved_all,
        ac ? "checkpointed block inputs (+ blocks not checkpointed)" : "what every block keeps for backward");
  b.add("activations_below_top", saved_all - saved_top, "activations of all blocks but the last");
  b.add("block_recompute", N * full_tok + (top_ckpt ? N * D * dt : 0),
        "the last block's full activations during its backward (+ recompute output)");

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

  // --- LM head + cross-entropy (model.cpp's LinearCrossEntropy) ---------------
  const i64 c = w.ce_chunk;
  b.add("final_norm", N * (norm_saved(D, dt, w.a.fused_rms_norm) + 4), "input of the final RMSNorm + rstd");
  b.add("hidden", N * D * dt, "final hidden states (input of the LM head)");
  b.add("ce_grad_h", N * D * dt, "gradient w.r.t. the hidden states, filled chunk by chunk");
  if (mode == Offload::full && vocab_chunked_loss(s.tie_embeddings, N)) {
    // FullOffload with a tied embedding walks vocabulary chunks (Transformer::LossChunks):
    // chunks of k rows, k = c x V / N tokens' worth but at most V / 8, over all N
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
    const i64 product = w.a.cuda && w.a.fp32_out_gemm ? 0 : V * D * dt;
    const i64 chunk = dt == 2 ? 10 * c * V + product + 2 * c * D * dt + c * 24 + N * 8
                              : 8 * c * V + 2 * c * D * dt + c * 24 + N * 8;
    const i64 tail = dt == 2 ? V * D * dt : 0;  // grad_w converted to bf16 after the loop
    b.add("ce_chunk", std::max(chunk, tail),
          fmt::format("logits chunk of {} tokens x vocab (fp32 logits, softmax, casts)", c));
  }
  b.add("ce_backward", 2 * (N * D * dt + V * D * dt), "saved LM-head gradients and their scaled copies");

  // --- Backward ----------------------------------------------------------------
  // MLP stage of a block's backward: the residual gradient plus two N x I gradients
  // (mul backward); attention stage: dq/dk/dv, an fp32 dq accumulator, softmax_d, GQA
  // expansion, with the MLP's activations already freed.
  const i64 mlp_stage = N * (D + 2 * I) * dt;
  const i64 attn_stage =
      N * ((D + 2 * q + 2 * kv) * dt + 4 * q + 4 * s.heads + (s.heads != s.kv_heads ? 2 * q * dt : 0)) -
      N * (bb.mlp + bb.mlp_norm);
  b.add("backward_temps", std::max(mlp_stage, attn_stage), "gradients in flight inside one block's backward");
  // The tied embedding's gradient from the LM head waits for the embedding's own.
  b.add(
      "embed_grad", (s.tie_embeddings ? 2 : 1) * V * D * dt,
      s.tie_embeddings ? "tied embedding: LM-head gradient held + embedding gradient" : "embedding gradient");
  if (s.tie_embeddings) b.add("embed_grad_held", V * D * dt, "tied embedding's LM-head gradient, held");

  // --- Optimizer step -----------------------------------------------------------
  // (The global gradient norm is a multi-tensor reduction to one scalar per tensor.)
  if (mode != Offload::full) {
    i64 update = 0;
    for (const auto& p : w.params) update = std::max(update, update_transient(w.opt, p));
    b.add("step_transient", update, "optimizer temporaries of the largest parameter");
  }

  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> v = persistent;
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  b.phase("startup", {"weights", "init_draw"});
  b.phase("forward", with({"activations", "mask", "inputs", "final_norm", "hidden", "ce_grad_h", "ce_grad_w",
                           "ce_chunk"}));
  b.phase("backward_head", with({"activations", "mask", "inputs", "final_norm", "ce_backward"}));
  // OptimizerOffload without clipping updates each parameter in its gradient hook, so
  // the update's temporaries land in backward.
  const std::string in_hooks = mode == Offload::optimizer && w.a.cuda && !w.opt.clip ? "step_transient" : "";
  b.phase("backward_block", with({"activations_below_top", "mask_below_top", "mask_top", "inputs",
                                  "block_recompute", "backward_temps", "embed_grad_held", in_hooks}));
  b.phase("backward_embedding", with({"inputs", "embed_grad", in_hooks}));
  if (mode != Offload::full) b.phase("optimizer_step", with({"step_transient"}));
  return b.done();
}

MemoryPlan host_plan(const Workload& w, Offload mode) {
  const i64 dt = w.dt;
  const bool pinned = w.a.cuda;
  auto pin = [&](i64 bytes) { return pinned && w.a.pinned_pow2 ? pow2_ceil(bytes) : bytes; };
  i64 masters = 0, grads = 0, moments_pinned = 0, moments_plain = 0, model_bytes = 0, max_n = 0;
  for (const auto& p : w.params) {
    const i64 n = p.numel();
    const int k = moment_count(w.opt, p);
    // FullOffload keeps bf16-model masters in pageable memory; fp32 weights upload
    // straight from pinned masters.
    masters += dt == 2 || !pinned ? 4 * n : pin(4 * n);
    grads += 4 * n;
    moments_pinned += k * pin(4 * n);
    moments_plain += k * 4 * n;
    model_bytes += n * dt;
    max_n = std::max(max_n, n);
  }
  Builder b;
  b.add("runtime", w.a.host_runtime, "LibTorch + CUDA runtime resident in the process");
  b.add("data", w.batch * w.T * 32 + w.N * 32 + w.jsonl_bytes * 9,
        "one step's token vectors (+ a JSONL file's tokens)");
  if (mode == Offload::optimizer)
    b.add("moments", moments_pinned, pinned ? "optimizer moments, pinned" : "optimizer moments");
  if (mode == Offload::full) {
    b.add("moments", moments_plain, "optimizer moments");
    b.add("masters", masters, "FP32 master weights");
    // Accumulators exist only when a step has several micro-batches.
    if (w.micro_batches > 1) b.add("grads", grads, "FP32 gradient accumulators (gradient accumulation)");
    const i64 ring = ring_capacity(max_n * dt, model_bytes, w.a.ring_bytes);
    b.add("grad_ring", pin(ring), "pinned staging ring the gradients land in");
    if (pinned && dt == 2) b.add("upload_ring", pin(ring), "pinned ring of new bf16 weights going up");
    // A tied embedding's LM-head gradient lands in a buffer of its own (its update
    // runs in slices whenever the CPU has nothing else to do).
    if (w.s.tie_embeddings)
      b.add("head_grad", pin(w.s.vocab_size * w.s.hidden * dt),
            "pinned buffer of the tied LM head's gradient");
    // Startup copies the bf16 weights into the FP32 masters through a bf16 host copy;
    // with accumulation the worker squares an FP32 accumulator for the norm.
    b.add("state_transient", std::max(dt == 2 && pinned ? 2 * max_n : 0, w.micro_batches > 1 ? 4 * max_n : 0),
          "largest parameter's host temporaries (master init / norm)");
  }
  // Startup: an HF directory's safetensors files are mapped while loading.
  b.add("init", w.hf_weight_bytes, "mapped safetensors files while loading the weights");
  if (w.ckpt) {
    // Tensors not already on the host are copied there before writing.
    i64 opt_bundle = 0;
    if (w.ckpt_optimizer) {
      if (mode != Offload::full) opt_bundle += 4 * (model_bytes / dt);
      if (mode == Offload::none) opt_bundle += moments_plain;
    }
    b.add("checkpoint", std::max(model_bytes, opt_bundle), "host copies gathered while saving a checkpoint");
  }
  const std::vector<std::string> state = {"runtime", "data",      "moments",     "masters",
                                          "grads",   "grad_ring", "upload_ring", "head_grad"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> v = state;
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  b.phase("startup", {"runtime", "data", "init"});
  b.phase("step", with({"state_transient"}));
  if (w.ckpt) b.phase("checkpoint", with({"checkpoint"}));
  return b.done();
}

ModePlan plan_mode(const Workload& w, Offload mode, bool ac) {
  ModePlan m;
  m.mode = mode;
  m.ac = ac;
  m.gpu = gpu_plan(w, mode, ac);
  m.host = host_plan(w, mode);
  const double slack = m.gpu.peak * w.a.allocator_slack;
  m.gpu_total = m.gpu.peak + static_cast<i64>(slack) + (w.a.cuda ? w.a.cuda_context : 0);
  if (mode == Offload::full && w.a.cuda) {
    // Freed gradients stay reserved until their copy into the staging ring ran; the
    // ring bounds how many are in flight.
    i64 model_bytes = 0, max_n = 0;
    for (const auto& p : w.params) {
      model_bytes += p.numel() * w.dt;
      max_n = std::max(max_n, p.numel());
    }
    m.gpu_total += ring_capacity(max_n * w.dt, model_bytes, w.a.ring_bytes);
  }
  if (w.a.gpu_capacity) m.gpu_fits = m.gpu_total <= *w.a.gpu_capacity;
  if (w.a.host_capacity) m.host_fits = m.host.peak <= *w.a.host_capacity;
  return m;
}

i64 dir_safetensors_bytes(const fs::path& dir) {
  std::error_code ec;
  i64 total = 0;
  if (!fs::is_directory(dir, ec)) return 0;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors") total += static_cast<i64>(e.file_size(ec));
  return total;
}

}  // namespace

Plan make_plan(const SFTConfig& cfg, const Assumptions& a) {
  return make_plan(cfg, resolve_model(cfg.model), a);
}

Plan make_plan(const SFTConfig& cfg, const ModelShape& shape, const Assumptions& a) {
  Workload w;
  w.s = shape;
  w.params = shape.params();
  w.opt = optimizer_info(cfg.optim);
  w.a = a;
  w.dt = a.compute_bytes;
  std::visit(
      [&](const auto& d) {
        using C = std::decay_t<decltype(d)>;
        w.B = d.micro_batch_size;
        w.T = d.seq_len;
        w.batch = d.batch_size;
        if constexpr (std::is_same_v<C, FakeDataConfig>) {
          w.masked = d.length == FakeLength::variable;  // fixed rows hold one document each
        } else {
          w.masked = true;  // packed documents or padding: the trainer builds a document mask
          std::error_code ec;
          if (d.path) w.jsonl_bytes = static_cast<i64>(fs::file_size(*d.path, ec));
          if (ec) w.jsonl_bytes = 0;
        }
      },
      cfg.data);
  w.N = w.B * w.T;
  w.ac = cfg.model.ac.has_value();
  w.ac_freq = cfg.model.ac ? std::max<i64>(1, cfg.model.ac->freq) : 1;
  const i64 chunk = ce_chunk_tokens(cfg.model.fused_lm_head_token_chunk_size, shape.vocab_size, w.N);
  w.ce_chunk = std::min(chunk, w.N);
  w.micro_batches = std::max<i64>(1, w.batch / std::max<i64>(1, w.B));
  w.ckpt = cfg.ckpt.has_value();
  w.ckpt_optimizer = cfg.ckpt && !cfg.ckpt->skip_optimizer;
  if (!preset_shape(cfg.model.name) && !(cfg.model.debug && cfg.model.debug->random_init))
    w.hf_weight_bytes = dir_safetensors_bytes(cfg.model.name);

  Plan p;
  p.model_name = cfg.model.name;
  p.shape = shape;
  p.params = shape.total_params();
  p.micro_batch = w.B;
  p.seq_len = w.T;
  p.batch = w.batch;
  p.optimizer = w.opt.name;
  p.ac = w.ac;
  p.ac_freq = w.ac_freq;
  p.attention_mask = w.masked;
  p.assumptions = a;

  const BlockBytes bb = block_bytes(shape, w.dt, a.fused_rms_norm);
  auto& act = p.activations;
  act.tokens = w.N;
  act.per_block_full = w.N * bb.full();
  act.per_block_checkpointed = w.N * shape.hidden * w.dt;
  act.saved_without_ac = shape.layers * act.per_block_full;
  const i64 n_ckpt = checkpointed_blocks(shape.layers, true, w.ac_freq);
  act.saved_with_ac = n_ckpt * act.per_block_checkpointed + (shape.layers - n_ckpt) * act.per_block_full;
  act.ce_chunk_tokens = w.ce_chunk;

  for (Offload m : {Offload::none, Offload::optimizer, Offload::full}) {
    p.modes.push_back(plan_mode(w, m, w.ac));
    p.modes_other.push_back(plan_mode(w, m, !w.ac));
  }

  if (w.masked)
    p.notes.push_back(
        "packed rows need a document mask: SDPA then cannot use the flash kernel; the plan assumes a fused "
        "kernel that keeps one additive mask per block (a math fallback would need far more)");
  if (std::holds_alternative<MuonConfig>(cfg.optim))
    p.notes.push_back("muon: the orthogonalisation temporaries are an estimate");
  if (!a.cuda) p.notes.push_back("CPU run: device memory is host memory; the modes differ only in layout");
  return p;
}

// ---------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------

namespace {

std::string human(i64 bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (i64{1} << 30)) return fmt::format("{:.2f} GiB", b / (1 << 30));
  if (bytes >= (i64{1} << 20)) return fmt::format("{:.1f} MiB", b / (1 << 20));
  if (bytes >= (i64{1} << 10)) return fmt::format("{:.1f} KiB", b / (1 << 10));
  return fmt::format("{} B", bytes);
}

std::string gib(i64 bytes) { return fmt::format("{:.2f}", static_cast<double>(bytes) / (1 << 30)); }

std::string yes_no(std::optional<bool> v) { return v ? (*v ? "yes" : "NO") : "?"; }

// A table: one row per term (in first-seen order), one column per mode.
void table(std::string& out, const std::vector<const MemoryPlan*>& cols,
           const std::vector<std::pair<std::string, std::string>>& labels) {
  std::vector<std::string> names;
  for (const auto* c : cols)
    for (const auto& t : c->terms)
      if (std::find(names.begin(), names.end(), t.name) == names.end()) names.push_back(t.name);
  for (const auto& n : names) {
    std::string label = n;
    for (const auto& [k, v] : labels)
      if (k == n) label = v;
    bool shown = false;
    for (const auto* c : cols) shown |= c->term(n) != 0;
    if (!shown) continue;
    out += fmt::format("  {:<34}", label);
    for (const auto* c : cols) {
      const i64 b = c->term(n);
      out += fmt::format("{:>13}", b ? human(b) : "-");
    }
    out += "\n";
  }
}

std::string shape_line(const Plan& p) {
  const auto& s = p.shape;
  return fmt::format("{:.2f}M params: {} blocks, hidden {}, {}/{} heads x {}, MLP {}, vocab {}{}{}",
                     static_cast<double>(p.params) / 1e6, s.layers, s.hidden, s.heads, s.kv_heads, s.head_dim,
                     s.intermediate, s.vocab_size, s.qk_norm() ? ", QK-norm" : "",
                     s.tie_embeddings ? ", tied embeddings" : "");
}

const std::vector<std::pair<std::string, std::string>>& gpu_labels() {
  static const std::vector<std::pair<std::string, std::string>> l = {
      {"weights", "weights (compute copy)"},
      {"masters", "FP32 masters"},
      {"grads", "FP32 gradient accumulators"},
      {"moments", "optimizer moments"},
      {"moment_window", "moment window (streamed)"},
      {"workspace", "cuBLAS workspace"},
      {"init_draw", "startup: fp32 draw"},
      {"activations", "activations (all blocks)"},
      {"activations_below_top", "  of which below the last block"},
      {"block_recompute", "last block in backward"},
      {"inputs", "inputs + RoPE tables"},
      {"mask", "attention masks"},
      {"mask_below_top", "  masks below the last block"},
      {"mask_top", "  last block's mask"},
      {"final_norm", "final norm input"},
      {"hidden", "final hidden states"},
      {"ce_grad_h", "CE grad w.r.t. hidden"},
      {"ce_grad_w", "CE grad of LM head (fp32)"},
      {"ce_chunk", "logits / CE chunk"},
      {"ce_backward", "LM-head backward buffers"},
      {"backward_temps", "backward temporaries (one block)"},
      {"embed_grad", "embedding gradient(s)"},
      {"embed_grad_held", "  tied LM-head gradient held"},
      {"step_transient", "optimizer-step temporaries"},
  };
  return l;
}

const std::vector<std::pair<std::string, std::string>>& phase_labels() {
  static const std::vector<std::pair<std::string, std::string>> l = {
      {"forward", "end of forward (LM head + CE)"},
      {"backward_head", "backward of the LM head"},
      {"backward_block", "backward of the last block"},
      {"backward_embedding", "backward of the embedding"},
      {"optimizer_step", "optimizer step"},
      {"startup", "startup"},
      {"step", "training step"},
      {"checkpoint", "checkpoint save"},
  };
  return l;
}

std::string label(const std::vector<std::pair<std::string, std::string>>& labels, const std::string& key) {
  for (const auto& [k, v] : labels)
    if (k == key) return v;
  return key;
}

const std::vector<std::pair<std::string, std::string>>& host_labels() {
  static const std::vector<std::pair<std::string, std::string>> l = {
      {"runtime", "LibTorch + CUDA runtime"},
      {"data", "data"},
      {"moments", "optimizer moments"},
      {"masters", "FP32 masters"},
      {"grads", "FP32 gradient accumulators"},
      {"grad_ring", "gradient staging ring (pinned)"},
      {"upload_ring", "weight upload ring (pinned)"},
      {"head_grad", "tied LM head gradient (pinned)"},
      {"state_transient", "host temporaries"},
      {"init", "safetensors mapped at startup"},
      {"checkpoint", "checkpoint save copies"},
  };
  return l;
}

void mode_section(std::string& out, const std::vector<ModePlan>& modes) {
  out += fmt::format("  {:<34}", "");
  for (const auto& m : modes) out += fmt::format("{:>13}", mode_name(m.mode));
  out += "\n";
}

}  // namespace

std::string format_text(const Plan& p) {
  const auto& a = p.assumptions;
  std::string out;
  out += fmt::format("Memory plan: {} ({})\n", p.model_name, shape_line(p));
  out += fmt::format(
      "micro-batch {} x {} tokens ({} per step), {} compute, optimizer {}, activation checkpointing {}\n",
      p.micro_batch, p.seq_len, p.batch, a.compute_bytes == 2 ? "bf16" : "fp32", p.optimizer,
      p.ac ? fmt::format("on (every {} block{})", p.ac_freq == 1 ? std::string() : std::to_string(p.ac_freq),
                         p.ac_freq == 1 ? "" : "s")
           : "off");
  out += fmt::format("GPU: {} ({}); host: {} ({})\n", a.gpu_capacity ? human(*a.gpu_capacity) : "unknown",
                     a.gpu_capacity_source, a.host_capacity ? human(*a.host_capacity) : "unknown",
                     a.host_capacity_source);
  const auto& act = p.activations;
  out += fmt::format(
      "\nActivations of one micro-batch ({} tokens): one block keeps {} ({} B/token); all {} blocks {} "
      "without checkpointing, {} with it (+ one block recomputed in backward). CE chunk: {} tokens.\n",
      act.tokens, human(act.per_block_full), act.tokens ? act.per_block_full / act.tokens : 0, p.shape.layers,
      human(act.saved_without_ac), human(act.saved_with_ac), act.ce_chunk_tokens);

  std::vector<const MemoryPlan*> g, h;
  for (const auto& m : p.modes) {
    g.push_back(&m.gpu);
    h.push_back(&m.host);
  }
  out += "\nGPU memory, by term (offload mode in columns)\n";
  mode_section(out, p.modes);
  table(out, g, gpu_labels());
  out += "  phases (sum of the terms alive then):\n";
  for (std::size_t i = 0; i < p.modes.front().gpu.phases.size(); ++i) {
    const std::string& name = p.modes.front().gpu.phases[i].name;
    out += fmt::format("    {:<32}", label(phase_labels(), name));
    for (const auto& m : p.modes) {
      const Phase* ph = m.gpu.phase(name);
      out += fmt::format("{:>13}", ph ? human(ph->bytes) : "-");
    }
    out += "\n";
  }
  out += fmt::format("  {:<34}", "PEAK ALLOCATED");
  for (const auto& m : p.modes) out += fmt::format("{:>13}", human(m.gpu.peak));
  out += "\n";
  out += fmt::format("  {:<34}", "  at");
  for (const auto& m : p.modes) out += fmt::format("{:>13}", m.gpu.peak_phase.substr(0, 12));
  out += "\n";
  out += fmt::format("  {:<34}", "device total (+slack, context)");
  for (const auto& m : p.modes) out += fmt::format("{:>13}", human(m.gpu_total));
  out += "\n";
  out += fmt::format("  {:<34}", "fits the GPU");
  for (const auto& m : p.modes) out += fmt::format("{:>13}", yes_no(m.gpu_fits));
  out += "\n";

  out += "\nHost memory, by term\n";
  mode_section(out, p.modes);
  table(out, h, host_labels());
  out += fmt::format("  {:<34}", "PEAK RESIDENT");
  for (const auto& m : p.modes) out += fmt::format("{:>13}", human(m.host.peak));
  out += "\n";
  out += fmt::format("  {:<34}", "  at");
  for (const auto& m : p.modes) out += fmt::format("{:>13}", m.host.peak_phase.substr(0, 12));
  out += "\n";
  out += fmt::format("  {:<34}", "fits the host");
  for (const auto& m : p.modes) out += fmt::format("{:>13}", yes_no(m.host_fits));
  out += "\n";

  out += fmt::format("\nWith model.ac {}:\n", p.ac ? "off" : "on (freq 1)");
  mode_section(out, p.modes_other);
  out += fmt::format("  {:<34}", "peak allocated");
  for (const auto& m : p.modes_other) out += fmt::format("{:>13}", human(m.gpu.peak));
  out += "\n";
  out += fmt::format("  {:<34}", "fits (GPU and host)");
  for (const auto& m : p.modes_other) out += fmt::format("{:>13}", m.fits() ? "yes" : "NO");
  out += "\n";

  std::vector<std::string> fit;
  for (const auto& m : p.modes)
    if (m.fits()) fit.emplace_back(mode_name(m.mode));
  out += "\n";
  if (!a.gpu_capacity || !a.host_capacity) out += "Capacity unknown for part of the machine: '?' above.\n";
  if (fit.empty())
    out += "No offload mode fits this machine with this config.\n";
  else {
    std::string list;
    for (const auto& f : fit) list += (list.empty() ? "" : ", ") + f;
    out += fmt::format("Fits this machine: offload = {}\n", list);
  }
  for (const auto& n : p.notes) out += "note: " + n + "\n";
  out += fmt::format(
      "assumptions: allocator slack {:.0f}%, CUDA context {}, runtime on host {}, pinned buffers rounded to "
      "powers of two: {} (docs/memory-planner.md)\n",
      a.allocator_slack * 100, human(a.cuda_context), human(a.host_runtime), a.pinned_pow2 ? "yes" : "no");
  return out;
}

namespace {

std::string json_mem(const MemoryPlan& m) {
  std::string terms, phases;
  for (const auto& t : m.terms)
    terms += fmt::format("{}{}:{}", terms.empty() ? "" : ",", json::quote(t.name), t.bytes);
  for (const auto& p : m.phases) {
    std::string names;
    for (const auto& n : p.terms) names += (names.empty() ? "" : ",") + json::quote(n);
    phases += fmt::format("{}{{\"name\":{},\"bytes\":{},\"terms\":[{}]}}", phases.empty() ? "" : ",",
                          json::quote(p.name), p.bytes, names);
  }
  return fmt::format("\"peak_bytes\":{},\"peak_gib\":{},\"peak_phase\":{},\"terms\":{{{}}},\"phases\":[{}]",
                     m.peak, gib(m.peak), json::quote(m.peak_phase), terms, phases);
}

std::string json_opt_bool(std::optional<bool> v) { return v ? (*v ? "true" : "false") : "null"; }

std::string json_modes(const std::vector<ModePlan>& modes) {
  std::string out;
  for (const auto& m : modes) {
    out += fmt::format(
        "{}{{\"offload\":\"{}\",\"ac\":{},\"gpu\":{{{},\"total_bytes\":{},\"fits\":{}}},"
        "\"host\":{{{},\"fits\":{}}},\"fits\":{}}}",
        out.empty() ? "" : ",", mode_name(m.mode), m.ac ? "true" : "false", json_mem(m.gpu), m.gpu_total,
        json_opt_bool(m.gpu_fits), json_mem(m.host), json_opt_bool(m.host_fits), m.fits() ? "true" : "false");
  }
  return out;
}

std::string json_opt_int(const std::optional<i64>& v) { return v ? std::to_string(*v) : "null"; }

}  // namespace

std::string format_json(const Plan& p) {
  const auto& s = p.shape;
  const auto& a = p.assumptions;
  const auto& act = p.activations;
  std::string fits, notes;
  for (const auto& m : p.modes)
    if (m.fits()) fits += fmt::format("{}\"{}\"", fits.empty() ? "" : ",", mode_name(m.mode));
  for (const auto& n : p.notes) notes += (notes.empty() ? "" : ",") + json::quote(n);
  return fmt::format(
      "{{\"model\":{{\"name\":{},\"params\":{},\"vocab_size\":{},\"hidden\":{},\"layers\":{},\"heads\":{},"
      "\"kv_heads\":{},\"head_dim\":{},\"intermediate\":{},\"qk_norm\":{},\"tie_embeddings\":{}}},"
      "\"micro_batch_size\":{},\"seq_len\":{},\"batch_size\":{},\"compute_dtype\":\"{}\",\"optimizer\":\"{}"
      "\","
      "\"ac\":{},\"ac_freq\":{},\"attention_mask\":{},"
      "\"capacity\":{{\"gpu_bytes\":{},\"gpu_source\":{},\"host_bytes\":{},\"host_source\":{}}},"
      "\"assumptions\":{{\"device_block\":{},\"pinned_pow2\":{},\"cublas_workspace\":{},\"cuda_context\":{},"
      "\"allocator_slack\":{},\"host_runtime\":{}}},"
      "\"activations\":{{\"tokens\":{},\"per_block_full\":{},\"per_block_checkpointed\":{},"
      "\"saved_without_ac\":{},\"saved_with_ac\":{},\"ce_chunk_tokens\":{}}},"
      "\"modes\":[{}],\"modes_ac_toggled\":[{}],\"fits\":[{}],\"notes\":[{}]}}\n",
      json::quote(p.model_name), p.params, s.vocab_size, s.hidden, s.layers, s.heads, s.kv_heads, s.head_dim,
      s.intermediate, s.qk_norm() ? "true" : "false", s.tie_embeddings ? "true" : "false", p.micro_batch,
      p.seq_len, p.batch, a.compute_bytes == 2 ? "bf16" : "fp32", p.optimizer, p.ac ? "true" : "false",
      p.ac_freq, p.attention_mask ? "true" : "false", json_opt_int(a.gpu_capacity),
      json::quote(a.gpu_capacity_source), json_opt_int(a.host_capacity), json::quote(a.host_capacity_source),
      a.device_block, a.pinned_pow2 ? "true" : "false", a.cublas_workspace, a.cuda_context, a.allocator_slack,
      a.host_runtime, act.tokens, act.per_block_full, act.per_block_checkpointed, act.saved_without_ac,
      act.saved_with_ac, act.ce_chunk_tokens, json_modes(p.modes), json_modes(p.modes_other), fits, notes);
}

std::string fit_refusal(const Plan& p, Offload mode) {
  const auto& a = p.assumptions;
  const ModePlan& m = p.mode(mode);
  if (m.fits()) return {};
  std::string out = fmt::format("model.offload = \"{}\"{} is predicted not to fit:", mode_name(mode),
                                p.ac ? " with model.ac" : "");
  if (!m.gpu_fits.value_or(true))
    out += fmt::format(" GPU {} needed, {} there ({})", human(m.gpu_total), human(*a.gpu_capacity),
                       a.gpu_capacity_source);
  if (!m.host_fits.value_or(true))
    out += fmt::format("{} host {} needed, {} available ({})", m.gpu_fits.value_or(true) ? "" : ";",
                       human(m.host.peak), human(*a.host_capacity), a.host_capacity_source);
  std::string fit;
  for (const auto& o : p.modes)
    if (o.mode != mode && o.fits())
      fit += fmt::format("{}model.offload = \"{}\"", fit.empty() ? "" : ", ", mode_name(o.mode));
  for (const auto& o : p.modes_other)
    if (o.fits())
      fit += fmt::format("{}model.offload = \"{}\" with model.ac {}", fit.empty() ? "" : ", ",
                         mode_name(o.mode), p.ac ? "off" : "on");
  out += fit.empty() ? ". No mode is predicted to fit; shorten data.seq_len or micro_batch_size.\n"
                     : ". Predicted to fit: " + fit + ".\n";
  return out;
}

std::string oom_advice(const Plan& p, Offload mode) {
  const auto& a = p.assumptions;
  const ModePlan& failed = p.mode(mode);
  std::string out = fmt::format(
      "out of GPU memory with model.offload = \"{}\"{}. The planner predicted a peak of {} allocated "
      "({} with allocator slack and CUDA context)",
      mode_name(mode), p.ac ? " and model.ac on" : "", human(failed.gpu.peak), human(failed.gpu_total));
  if (a.gpu_capacity)
    out += fmt::format(" on a {} device{}", human(*a.gpu_capacity),
                       failed.gpu_fits.value_or(false) ? " (it predicted a fit: see docs/memory-planner.md, "
                                                         "known limits)"
                                                       : "");
  out += ".\n";
  std::vector<const ModePlan*> fit;
  for (const auto& m : p.modes)
    if (m.mode != mode && m.fits() && m.gpu_total < failed.gpu_total) fit.push_back(&m);
  if (!fit.empty()) {
    std::string list;
    for (const auto* m : fit)
      list += fmt::format("{}model.offload = \"{}\" ({})", list.empty() ? "" : ", ", mode_name(m->mode),
                          human(m->gpu_total));
    out += "Predicted to fit: " + list + ".\n";
    return out;
  }
  std::vector<const ModePlan*> fit_ac;
  for (const auto& m : p.modes_other)
    if (m.fits() && m.gpu_total < failed.gpu_total) fit_ac.push_back(&m);
  if (!fit_ac.empty()) {
    std::string list;
    for (const auto* m : fit_ac)
      list += fmt::format("{}\"{}\" ({})", list.empty() ? "" : ", ", mode_name(m->mode), human(m->gpu_total));
    out += fmt::format(
        "No other offload mode fits as is; with activation checkpointing {} these are "
        "predicted to fit: model.offload = {}.\n",
        p.ac ? "off" : "on (--model.ac)", list);
    return out;
  }
  out += "No offload mode is predicted to fit this config; reduce data.micro_batch_size or data.seq_len";
  out += p.ac ? ".\n" : ", or enable activation checkpointing (--model.ac).\n";
  return out;
}

}  // namespace primecfg::train::plan
