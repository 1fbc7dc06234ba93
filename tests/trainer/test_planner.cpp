// The memory planner (`primecfg-train --plan`): hand-computed arithmetic on a tiny
// shape, the ordering of the modes, activation checkpointing, allocator rounding,
// the model shapes against the trainer's real model, the JSON output, the
// out-of-memory advice, and sharded runs (the FP32 state per rank, host per node).
#include "base/remove_tree.hpp"
#include "base/strict_json.hpp"
#include "distributed/launch.hpp"
#include "hand_shape.hpp"
#include "nn/loss_chunking.hpp"
#include "options.hpp"
#include "planner/machine.hpp"
#include "planner/planner.hpp"
#include "planner/profile.hpp"
#include "trainer.hpp"
#include "unfused_assumptions.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

namespace fs = std::filesystem;
using namespace primecfg;
namespace plan = primecfg::train::plan;

namespace {

// No rounding, no fixed overheads: every byte below comes from the formulas.
plan::Assumptions exact() {
  plan::Assumptions a = unfused_assumptions();
  a.compute_bytes = 2;
  a.device_block = 1;
  a.pinned_pow2 = false;
  a.cublas_workspace = 0;
  a.cuda_context = 0;
  a.allocator_slack = 0;
  a.host_runtime = 0;
  return a;
}

// Fake fixed-length data, one row of seq_len tokens per step, AdamW; activation
// checkpointing and offloading off (on by default, as in prime-rl) unless a test turns
// them on.
SFTConfig fake_config(std::string model, std::int64_t seq_len) {
  SFTConfig c;
  c.model.name = std::move(model);
  c.model.ac = std::nullopt;
  c.model.ac_offloading = std::nullopt;
  FakeDataConfig d;
  d.seq_len = seq_len;
  d.batch_size = 1;
  d.micro_batch_size = 1;
  c.data = d;
  c.max_steps = 1;
  return c;
}

std::int64_t peak_of(const plan::Plan& p, Offload m) { return p.mode(m).gpu.peak; }

fs::path temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("primecfg-planner-test-" + std::to_string(::getpid())) / name;
  primecfg::train::remove_tree(d);
  fs::create_directories(d);
  return d;
}

// Parameter names and sizes of the trainer's real model (built through run_sft with
// zero steps, which returns every parameter when collect_weights is set).
std::vector<std::pair<std::string, std::int64_t>> real_params(const SFTConfig& base) {
  SFTConfig c = base;
  c.max_steps = 0;
  c.model.compile = std::nullopt;
  c.output_dir = temp_dir("real-model");
  SFTDataConfig d;
  d.seq_len = 16;
  d.batch_size = 2;
  d.micro_batch_size = 1;
  c.data = d;
  train::RunOptions o;
  o.print = false;
  o.collect_weights = true;
  o.device = "cpu";
  auto r = train::run_sft(c, o);
  std::vector<std::pair<std::string, std::int64_t>> out;
  for (const auto& [name, w] : r.weights) out.emplace_back(name, static_cast<std::int64_t>(w.size()));
  return out;
}

std::vector<std::pair<std::string, std::int64_t>> planned_params(const plan::ModelShape& s) {
  std::vector<std::pair<std::string, std::int64_t>> out;
  for (const auto& p : s.params()) out.emplace_back(p.name, p.numel());
  return out;
}

}  // namespace

TEST_CASE("planner: hand-computed terms of a tiny shape") {
  // Parameters: embedding 16x8 = 128; per block norms 8+8, q 64, k 32, v 32, o 64,
  // q/k-norm 4+4, gate/up/down 128 each = 600; final norm 8. Total 1336.
  const auto s = hand_shape();
  CHECK(s.total_params() == 1336);
  auto cfg = fake_config("hand", 4);  // N = 4 tokens
  auto p = plan::make_plan(cfg, s, exact());

  const auto& none = p.mode(Offload::none).gpu;
  CHECK(none.term("weights") == 1336 * 2);
  CHECK(none.term("masters") == 1336 * 4);
  CHECK(none.term("grads") == 1336 * 4);
  CHECK(none.term("moments") == 1336 * 8);  // AdamW: two FP32 moments
  // Per token and block: x 16+4, h 16, q/k before QK-norm 24 + rstd 12,
  // SDPA q,k,v,out 48 + lse 8, x1 16+4, rmsnorm(x1) 16, gate/silu/up/product 128 = 292.
  CHECK(p.activations.per_block_full == 4 * 292);
  CHECK(none.term("activations") == 2 * 4 * 292);
  CHECK(none.term("inputs") == 4 * 24 + 2 * 4 * 4 * 2);  // ids/positions/targets + cos/sin
  CHECK(none.term("final_norm") == 4 * (16 + 4));
  CHECK(none.term("hidden") == 64);
  CHECK(none.term("ce_grad_h") == 64);
  CHECK(none.term("ce_grad_w") == 16 * 8 * 4);
  // Chunk of 4 tokens: 10 B per logit (bf16 logits, their fp32 copy, fp32
  // log-probabilities) = 640,
  // c x D pieces 2 x 4 x 8 x 2 = 128, per-token indices 96 + rows 32; the head's
  // gradient GEMM accumulates into FP32 directly. Without that GEMM, a bf16 16 x 8
  // product (256 B) per chunk.
  CHECK(p.activations.ce_chunk_tokens == 4);
  CHECK(none.term("ce_chunk") == 640 + 128 + 96 + 32);
  auto no_fp32_gemm = exact();
  no_fp32_gemm.fp32_out_gemm = false;
  CHECK(plan::make_plan(cfg, s, no_fp32_gemm).mode(Offload::none).gpu.term("ce_chunk") ==
        640 + 256 + 128 + 96 + 32);
  // The fused cross-entropy kernel: the chunk's bf16 logits alone (2 B per logit, the
  // gradient written over them) and an FP32 loss per token (4 x 4 B); the hidden rows are
  // a slice and their product goes into ce_grad_h, no indices. That is less than the bf16
  // copy of the head's gradient after the loop (256 B), so the term is the copy; with the
  // bf16 product per chunk it is the chunk again.
  auto fused_ce = exact();
  fused_ce.fused_cross_entropy = true;
  CHECK(plan::make_plan(cfg, s, fused_ce).mode(Offload::none).gpu.term("ce_chunk") == 256);
  fused_ce.fp32_out_gemm = false;
  CHECK(plan::make_plan(cfg, s, fused_ce).mode(Offload::none).gpu.term("ce_chunk") == 128 + 256 + 16);
  CHECK(none.term("ce_backward") == 2 * (64 + 256));
  CHECK(none.term("backward_temps") == 4 * (8 + 2 * 16) * 2);  // the MLP stage
  CHECK(none.term("embed_grad") == 2 * 16 * 8 * 2);
  CHECK(none.term("step_transient") == 0);   // AdamW: one in-place multi-tensor kernel
  CHECK(none.term("init_draw") == 4 * 128);  // fp32 draw of the embedding at startup

  // Phases: persistent 24048 = 2672 + 5344 + 5344 + 10688; the end of forward adds
  // activations 2336, inputs 160, final norm 80, hidden 64, grad_h 64, grad_w 512, chunk 896.
  REQUIRE(none.phase("forward"));
  CHECK(none.phase("startup")->bytes == 2672 + 512);
  CHECK(none.phase("forward")->bytes == 24048 + 4112);
  CHECK(none.phase("backward_head")->bytes == 24048 + 2336 + 160 + 80 + 640);
  CHECK(none.phase("backward_block")->bytes == 24048 + 1168 + 160 + 1168 + 320 + 256);
  CHECK(none.phase("backward_embedding")->bytes == 24048 + 160 + 512);
  CHECK(none.phase("optimizer_step")->bytes == 24048);
  CHECK(none.peak == 24048 + 4112);
  CHECK(none.peak_phase == "forward");

  // offload = "none" on the fused AdamW (bf16 on CUDA, unsharded, one micro-batch a step):
  // no FP32 accumulators (persistent 24048 - 5344 = 18704); each bf16 gradient is held
  // from its backward to the update. The shape is tied (no LM head): the embedding's
  // 128 x 2 B, the blocks' and the final norm's (1336 - 128) x 2 = 2416 B, of them the
  // last block's and the final norm's (600 + 8) x 2 = 1216 B.
  auto adamw = exact();
  adamw.fused_adamw = true;
  const auto handed_plan = plan::make_plan(cfg, s, adamw);
  const auto& handed = handed_plan.mode(Offload::none).gpu;
  CHECK(handed.term("grads") == 0);
  CHECK(handed.term("grads_head") == 0);
  CHECK(handed.term("grads_top") == 1216);
  CHECK(handed.term("grads_blocks") == 2416);
  CHECK(handed.term("grads_embedding") == 256);
  CHECK(handed.phase("forward")->bytes == 18704 + 4112);
  CHECK(handed.phase("backward_block")->bytes == 18704 + 1168 + 160 + 1168 + 320 + 256 + 1216);
  CHECK(handed.phase("backward_first_block")->bytes == 18704 + 160 + 1168 + 320 + 256 + 2416);
  CHECK(handed.phase("backward_embedding")->bytes == 18704 + 160 + 512 + 2416);
  CHECK(handed.phase("optimizer_step")->bytes == 18704 + 2416 + 256);
  // Those steps replay a CUDA graph (--cuda-graph, by default): its capture stream has a
  // cuBLAS workspace of its own, alive like the first one. Not where it is turned off,
  // nor in the other modes.
  auto graphed = adamw;
  graphed.cublas_workspace = 1000;
  const auto graph_plan = plan::make_plan(cfg, s, graphed);
  CHECK(graph_plan.mode(Offload::none).gpu.term("graph_workspace") == 1000);
  CHECK(graph_plan.mode(Offload::none).gpu.phase("optimizer_step")->bytes == 18704 + 2416 + 256 + 2 * 1000);
  CHECK(graph_plan.mode(Offload::optimizer).gpu.term("graph_workspace") == 0);
  graphed.cuda_graph = false;
  CHECK(plan::make_plan(cfg, s, graphed).mode(Offload::none).gpu.term("graph_workspace") == 0);
  // The other modes keep theirs; two micro-batches a step sum in FP32 accumulators again.
  CHECK(handed_plan.mode(Offload::optimizer).gpu.term("grads") == 1336 * 4);
  auto two_micro = cfg;
  std::get<FakeDataConfig>(two_micro.data).batch_size = 2;
  const auto summed_plan = plan::make_plan(two_micro, s, adamw);
  const auto& summed = summed_plan.mode(Offload::none).gpu;
  CHECK(summed.term("grads") == 1336 * 4);
  CHECK(summed.term("grads_blocks") == 0);
  CHECK_FALSE(summed.phase("backward_first_block"));
  auto summed_graph = graphed;
  summed_graph.cuda_graph = std::nullopt;
  CHECK(plan::make_plan(two_micro, s, summed_graph).mode(Offload::none).gpu.term("graph_workspace") == 0);

  // Optimizer offload: moments leave, a window for them comes: room for two of the
  // largest (2 x 1024), at least 2 GiB, at most all of them (10688), + 4096.
  const auto& opt = p.mode(Offload::optimizer).gpu;
  CHECK(opt.term("moments") == 0);
  CHECK(opt.term("moment_window") == 10688 + 4096);
  CHECK(opt.peak == 13360 + 14784 + 4112);
  // Full offload walks the tied embedding's logits in vocabulary chunks: 4 x 16 / 4 = 16
  // rows' worth, at most 16 / 8 = 2 rows. 6 B per logit x 4 tokens x 2 rows = 48, the
  // hidden rows and their FP32 gradient 4 x 8 x (2 + 4) = 192, indices 96; the head's
  // gradient is written in bf16 (256) instead of summed in FP32.
  const auto& full = p.mode(Offload::full).gpu;
  CHECK(full.term("ce_grad_w") == 16 * 8 * 2);
  CHECK(full.term("ce_chunk") == 48 + 192 + 96);
  CHECK(full.peak == 2672 + 2336 + 160 + 80 + 64 + 64 + 256 + 336);
  // Above train::kVocabChunkedLossMaxTokens tokens per micro-batch it walks token chunks.
  const auto long_plan =
      plan::make_plan(fake_config("hand", train::kVocabChunkedLossMaxTokens + 1), s, exact());
  CHECK(long_plan.mode(Offload::full).gpu.term("ce_grad_w") == 16 * 8 * 4);
  CHECK(long_plan.mode(Offload::full).gpu.term("ce_chunk") ==
        long_plan.mode(Offload::none).gpu.term("ce_chunk"));
  CHECK(p.mode(Offload::full).gpu.phase("optimizer_step") == nullptr);
  // With PRIMECFG_OFFLOAD_RING_MB set below the largest moments, the window is those + 4096.
  auto small_ring = exact();
  small_ring.ring_bytes = 100;
  CHECK(plan::make_plan(cfg, s, small_ring).mode(Offload::optimizer).gpu.term("moment_window") ==
        1024 + 4096);
  // Without clipping (updates in the gradient hooks), the embedding's moments (the
  // last gradient of backward) get a buffer of their own and the window the rest.
  auto no_clip = cfg;
  std::get<AdamWConfig>(no_clip.optim).max_norm = std::nullopt;
  const auto plan_nc = plan::make_plan(no_clip, s, exact());
  const auto& opt_nc = plan_nc.mode(Offload::optimizer).gpu;
  CHECK(opt_nc.term("moment_tail") == 128 * 8);
  CHECK(opt_nc.term("moment_window") == 10688 - 128 * 8 + 4096);
  CHECK(opt.term("moment_tail") == 0);

  // Host: data 4 x 32 (one step) + 4 x 32 (tensors of a micro-batch).
  CHECK(p.mode(Offload::none).host.peak == 256);
  CHECK(p.mode(Offload::optimizer).host.peak == 256 + 10688);
  // Full: moments, masters (pageable), two staging rings (all 2672 bf16 bytes + 4096
  // each), the tied LM head's gradient buffer (16 x 8 bf16), and the bf16 host copy of
  // the embedding while the masters are initialised.
  const auto& fh = p.mode(Offload::full).host;
  CHECK(fh.term("grads") == 0);  // one micro-batch: no accumulators
  CHECK(fh.term("grad_ring") == 2672 + 4096);
  CHECK(fh.term("head_grad") == 16 * 8 * 2);
  CHECK(fh.peak == 256 + 10688 + 5344 + 2 * (2672 + 4096) + 16 * 8 * 2 + 2 * 128);
  // Two micro-batches per step: FP32 accumulators on the host.
  auto cfg2 = cfg;
  std::get<FakeDataConfig>(cfg2.data).batch_size = 2;
  CHECK(plan::make_plan(cfg2, s, exact()).mode(Offload::full).host.term("grads") == 1336 * 4);

  // Activation checkpointing, every block: inputs only (4 x 16 per block); the last
  // block is recomputed whole in backward, with its output.
  auto cfg_ac = cfg;
  cfg_ac.model.ac = ActivationCheckpointConfig{};
  auto pa = plan::make_plan(cfg_ac, s, exact());
  const auto& ac = pa.mode(Offload::none).gpu;
  CHECK(ac.term("activations") == 2 * 4 * 16);
  CHECK(ac.term("block_recompute") == 4 * 292 + 4 * 16);
  CHECK(ac.phase("backward_block")->bytes == 24048 + 64 + 160 + 1232 + 320 + 256);
  CHECK(ac.phase("forward")->bytes == 24048 + 128 + 160 + 80 + 64 + 64 + 512 + 896);
  // The forward shrank below the last block's recompute: the peak moves into backward.
  CHECK(ac.peak == 24048 + 64 + 160 + 1232 + 320 + 256);
  CHECK(ac.peak_phase == "backward_block");
}

TEST_CASE("planner: RMSNorm without the fused kernel keeps FP32 copies") {
  // LibTorch's composite RMSNorm (CPU) keeps an FP32 copy of its input and the FP32
  // normalised values: 8 B per element instead of 2. Per token and block: input norm
  // 8 x 8 + 4, QK-norms 8 x 12 + 12, post-attention norm 8 x 8 + 4 (+ its output 16).
  auto a = exact();
  a.fused_rms_norm = false;
  auto p = plan::make_plan(fake_config("hand", 4), hand_shape(), a);
  CHECK(p.activations.per_block_full == 4 * (292 + 48 + 72 + 48));
  CHECK(p.mode(Offload::none).gpu.term("final_norm") == 4 * (8 * 8 + 4));
}

TEST_CASE("planner: model.quantization says what of FP8 it does not model") {
  auto cfg = fake_config("hand", 4);
  auto has_note = [](const plan::Plan& p) {
    return std::any_of(p.notes.begin(), p.notes.end(), [](const std::string& n) {
      return n.starts_with("model.quantization (FP8): its memory is planned as bf16");
    });
  };
  const auto bf16 = plan::make_plan(cfg, hand_shape(), exact());
  CHECK(!has_note(bf16));
  cfg.model.quantization = QuantizationConfig{};
  const auto fp8 = plan::make_plan(cfg, hand_shape(), exact());
  CHECK(has_note(fp8));
  CHECK(fp8.mode(Offload::none).gpu.peak == bf16.mode(Offload::none).gpu.peak);
}

TEST_CASE("planner: the fused SwiGLU kernel keeps no silu(gate)") {
  // ATen's silu(g) * u saves silu(g) for backward: intermediate x 2 B per token and
  // block (16 x 2 here); the fused kernel recomputes it. FP32 compute keeps ATen's.
  auto a = exact();
  const auto aten = plan::make_plan(fake_config("hand", 4), hand_shape(), a);
  a.fused_swiglu = true;
  const auto fused = plan::make_plan(fake_config("hand", 4), hand_shape(), a);
  CHECK(aten.activations.per_block_full - fused.activations.per_block_full == 4 * 16 * 2);
  a.compute_bytes = 4;
  const auto fp32 = plan::make_plan(fake_config("hand", 4), hand_shape(), a);
  a.fused_swiglu = false;
  CHECK(fp32.activations.per_block_full ==
        plan::make_plan(fake_config("hand", 4), hand_shape(), a).activations.per_block_full);
}

TEST_CASE("planner: optimizers change the moments and the step") {
  const auto s = hand_shape();
  auto cfg = fake_config("hand", 4);
  cfg.optim = SignSGDConfig{};
  auto p = plan::make_plan(cfg, s, exact());
  CHECK(p.mode(Offload::none).gpu.term("moments") == 0);
  CHECK(p.mode(Offload::full).host.term("moments") == 0);

  SGDConfig sgd;
  sgd.momentum = 0.9;
  cfg.optim = sgd;
  p = plan::make_plan(cfg, s, exact());
  CHECK(p.mode(Offload::none).gpu.term("moments") == 1336 * 4);

  // Optimizer offload without clipping updates inside the gradient hooks: grad.sign()
  // of the embedding (4 x 128) shows up in backward. Persistent: weights, masters, grads
  // and an empty 4 KiB moment window.
  SignSGDConfig sign;
  sign.max_norm = std::nullopt;
  cfg.optim = sign;
  p = plan::make_plan(cfg, s, exact());
  CHECK(p.mode(Offload::optimizer).gpu.phase("backward_embedding")->bytes == 13360 + 4096 + 160 + 512 + 512);
  sign.max_norm = 1.0;
  cfg.optim = sign;
  p = plan::make_plan(cfg, s, exact());
  CHECK(p.mode(Offload::optimizer).gpu.phase("backward_embedding")->bytes == 13360 + 4096 + 160 + 512);
  CHECK(p.mode(Offload::optimizer).gpu.phase("optimizer_step")->bytes == 13360 + 4096 + 512);

  // Muon: one momentum for block matrices, two AdamW moments for the rest
  // (embedding 128, norms 2 x 24 + 8 = 56).
  cfg.optim = MuonConfig{};
  p = plan::make_plan(cfg, s, exact());
  const std::int64_t matrices = 2 * (64 + 32 + 32 + 64 + 3 * 128);
  CHECK(p.mode(Offload::none).gpu.term("moments") == matrices * 4 + (1336 - matrices) * 8);
}

TEST_CASE("planner: allocator rounding") {
  auto s = hand_shape();  // with sizes that are not powers of two: vocab 10, MLP 12, untied
  s.vocab_size = 10;
  s.layers = 1;
  s.intermediate = 12;
  s.model_type = "llama", s.qk_norm = false;
  s.tie_embeddings = false;
  auto a = exact();
  a.pinned_pow2 = true;
  a.device_block = 512;
  auto p = plan::make_plan(fake_config("odd", 4), s, a);
  // Pinned moments (optimizer offload), FP32 bytes per tensor 320, 32, 256, 128, 128,
  // 256, 32, 384 x 3, 32, 320: pinned memory rounds 320 and 384 up to 512.
  CHECK(p.mode(Offload::optimizer).host.term("moments") == 2 * 3424);
  // The staging rings of full offload: all 1328 bf16 bytes + 4096 = 5424 -> 8192.
  CHECK(p.mode(Offload::full).host.term("grad_ring") == 8192);
  CHECK(p.mode(Offload::full).host.term("masters") == 4 * 664);  // pageable: not rounded
  a.pinned_pow2 = false;
  auto q = plan::make_plan(fake_config("odd", 4), s, a);
  CHECK(q.mode(Offload::optimizer).host.term("moments") == 2 * 4 * 664);
  CHECK(q.mode(Offload::full).host.term("grad_ring") == 5424);
  CHECK(q.mode(Offload::full).host.term("head_grad") == 0);  // untied: no LM head gradient buffer
  // Every one of the 12 bf16 weights is under 512 bytes: one 512-byte block each.
  CHECK(p.mode(Offload::none).gpu.term("weights") == 12 * 512);
}

TEST_CASE("planner: modes order GPU and host memory oppositely") {
  // Models whose moments exceed the optimizer-offload window (two of the largest, at
  // least 2 GiB); below that the window holds them all and equals NoOffload.
  for (const char* model : {"Qwen/Qwen3-0.6B", "meta-llama/Llama-3.2-3B", "meta-llama/Meta-Llama-3-8B"}) {
    CAPTURE(model);
    for (std::int64_t seq : {128, 8192}) {
      CAPTURE(seq);
      auto p = plan::make_plan(fake_config(model, seq), unfused_assumptions());
      CHECK(peak_of(p, Offload::full) < peak_of(p, Offload::optimizer));
      CHECK(peak_of(p, Offload::optimizer) < peak_of(p, Offload::none));
      CHECK(p.mode(Offload::none).host.peak < p.mode(Offload::optimizer).host.peak);
      CHECK(p.mode(Offload::optimizer).host.peak < p.mode(Offload::full).host.peak);
      // Full offload frees at least the 12 bytes per parameter of FP32 state it moves.
      CHECK(peak_of(p, Offload::none) - peak_of(p, Offload::full) >= 12 * p.params);
    }
  }
  auto tiny = plan::make_plan(fake_config("primecfg/tiny", 128), unfused_assumptions());
  CHECK(peak_of(tiny, Offload::full) < peak_of(tiny, Offload::none));
  CHECK(peak_of(tiny, Offload::optimizer) <= peak_of(tiny, Offload::none) + 4096 + 512);
  CHECK(tiny.mode(Offload::none).host.peak < tiny.mode(Offload::full).host.peak);
}

TEST_CASE("planner: activation checkpointing reduces activations and the peak") {
  auto cfg = fake_config("Qwen/Qwen3-0.6B", 8192);
  auto off = plan::make_plan(cfg, unfused_assumptions());
  cfg.model.ac = ActivationCheckpointConfig{};
  auto on = plan::make_plan(cfg, unfused_assumptions());
  CHECK(on.activations.saved_with_ac < on.activations.saved_without_ac);
  CHECK(on.activations.saved_with_ac * 10 < on.activations.saved_without_ac);
  for (Offload m : offload_modes) {
    CHECK(on.mode(m).gpu.term("activations") < off.mode(m).gpu.term("activations"));
    CHECK(on.mode(m).gpu.peak < off.mode(m).gpu.peak);
    // The toggled plan of one is the plan of the other.
    CHECK(off.mode(m, true).gpu.peak == on.mode(m).gpu.peak);
  }
  // Checkpointing every second block keeps about half the blocks whole.
  cfg.model.ac->freq = 2;
  auto half = plan::make_plan(cfg, unfused_assumptions());
  CHECK(half.mode(Offload::none).gpu.term("activations") > on.mode(Offload::none).gpu.term("activations"));
  CHECK(half.mode(Offload::none).gpu.term("activations") < off.mode(Offload::none).gpu.term("activations"));
}

// Activation offloading: a window of block inputs on the device, the rest in host
// memory (one buffer allocated to the byte, not rounded as the pinned allocator would
// round each: 192 MiB inputs would take 256 MiB there); when it is what
// makes a mode fit, the advice says so.
TEST_CASE("planner: activation offloading moves all but a window of block inputs to host memory") {
  auto cfg = fake_config("meta-llama/Llama-3.2-3B", 32768);  // 28 blocks, hidden 3072
  cfg.model.ac = ActivationCheckpointConfig{};
  plan::Assumptions a = unfused_assumptions();
  a.cuda = true;
  a.pinned_pow2 = true;
  auto alone = plan::make_plan(cfg, a);
  cfg.model.ac_offloading = ActivationOffloadConfig{.max_inflight_activations = 3};
  auto offloaded = plan::make_plan(cfg, a);
  const std::int64_t input = 32768LL * 3072 * 2;  // one block input, bf16: 192 MiB
  CHECK(offloaded.ac_inputs_kept == 3);
  CHECK(offloaded.ac_inputs_offloaded == 25);
  for (Offload m : offload_modes) {
    CAPTURE(m);
    CHECK(alone.mode(m).gpu.term("activations") == 28 * input);
    CHECK(offloaded.mode(m).gpu.term("activations") == 3 * input);
    CHECK(offloaded.mode(m).gpu.term("activations_below_top") == 2 * input);
    CHECK(alone.mode(m).gpu.peak - offloaded.mode(m).gpu.peak == 25 * input);
    CHECK(offloaded.mode(m).host.term("activations_offloaded") == 25 * input);
    CHECK(offloaded.mode(m).host.peak - alone.mode(m).host.peak == 25 * input);
    CHECK(alone.mode(m).host.term("activations_offloaded") == 0);
    // With model.ac toggled off there is nothing to offload.
    CHECK(offloaded.mode(m, true).host.term("activations_offloaded") == 0);
  }

  // Llama-3-8B at 131072 tokens: with checkpointing alone `full` needs 82 GiB of GPU,
  // with offloading 54: on a 70 GiB GPU only offloading makes a mode fit.
  auto longer = fake_config("meta-llama/Meta-Llama-3-8B", 131072);
  longer.model.ac = ActivationCheckpointConfig{};
  plan::Assumptions h200 = unfused_assumptions();
  h200.cuda = true;
  h200.gpu_capacity = 70LL << 30;
  h200.host_capacity = 200LL << 30;
  auto p = plan::make_plan(longer, h200);
  const auto advice = plan::advise(longer, p);
  auto names = [](const plan::Advice& advice, const std::string& change) {
    for (const auto& c : advice.changes)
      if (c.starts_with(change)) return true;
    return false;
  };
  CHECK(names(advice, "--model.ac-offloading ("));
  // The other way: at 200,000 tokens with 125 GiB of host memory, full offload fits only
  // with the block inputs on the GPU (its FP32 state takes 90 GiB of the host).
  longer.model.ac_offloading = ActivationOffloadConfig{};
  std::get<FakeDataConfig>(longer.data).seq_len = 200000;
  h200.gpu_capacity = 139LL << 30;
  h200.host_capacity = 125LL << 30;
  CHECK(names(plan::advise(longer, plan::make_plan(longer, h200)), "--no-model.ac-offloading"));
}

// Issue 50's case: Qwen3-8B at 32,768 tokens on 80 GiB GPUs in nodes of 24 GiB. No
// single change fits (without checkpointing even 1024 ranks hold too many activations;
// checkpointing alone leaves 8B parameters' FP32 state on one GPU or a 24 GiB host), so the
// advice combines them, and each combination it prints is what planning it gives.
TEST_CASE("advice: where no change fits alone, combinations of them, each planned in full") {
  const auto& prof = plan::shipped_profile();
  REQUIRE(prof);
  auto cfg = fake_config("Qwen/Qwen3-8B", 32768);
  plan::Assumptions a = unfused_assumptions();
  a.profile = &*prof;
  a.gpu_capacity = std::int64_t{80} << 30;
  a.host_capacity = std::int64_t{24} << 30;
  const auto advice = plan::advise(cfg, plan::make_plan(cfg, a));
  CHECK(!advice.mode);
  CHECK(advice.changes.empty());
  REQUIRE(!advice.combined.empty());
  CHECK(advice.combined.size() <= plan::kCombinationsShown);
  const std::string& first = advice.combined.front();
  INFO(first);
  CHECK(first.starts_with("--model.ac with 4 ranks (4 per node; data.batch_size a multiple of 4)"));
  CHECK(plan::format_advice(advice).find("Combined") != std::string::npos);
  // Planned again by hand, it fits, in the mode and at the size said; 2 ranks do not.
  cfg.model.ac = ActivationCheckpointConfig{};
  a.world = 4;
  const auto q = plan::make_plan(cfg, a);
  const auto& none = q.mode(Offload::none);
  CHECK(none.fits());
  CHECK(first.find(fmt::format("model.offload = \"none\" fits, {:.2f} GiB per GPU",
                               static_cast<double>(none.gpu_total) / (1 << 30))) != std::string::npos);
  a.world = 2;
  for (Offload m : offload_modes) CHECK(!plan::make_plan(cfg, a).mode(m).fits());

  // Rank counts the config cannot be spread over are no suggestion, and no error: HSDP
  // over 3 replicas from 3 ranks skips 12 (nodes of 8 not full) and plans 24.
  auto hsdp = fake_config("Qwen/Qwen3-8B", 32768);
  hsdp.model.dp_replicate = 3;
  plan::Assumptions three = a;
  three.world = 3;
  three.host_capacity = std::int64_t{24} << 30;
  const auto spread = plan::advise(hsdp, plan::make_plan(hsdp, three));
  REQUIRE(!spread.combined.empty());
  CHECK(spread.combined.front().starts_with("--model.ac with 24 ranks (8 per node"));

  // Where one change is enough, nothing is combined.
  cfg = fake_config("Qwen/Qwen3-8B", 32768);
  a.world = 1;
  a.host_capacity = std::int64_t{500} << 30;
  const auto single = plan::advise(cfg, plan::make_plan(cfg, a));
  CHECK(!single.changes.empty());
  CHECK(single.combined.empty());
}

TEST_CASE("planner: presets have the published parameter counts") {
  CHECK(plan::preset_shape("Qwen/Qwen3-0.6B")->total_params() == 596049920);
  CHECK(plan::preset_shape("meta-llama/Llama-3.2-1B")->total_params() == 1235814400);
  CHECK(plan::preset_shape("meta-llama/Llama-3.2-3B")->total_params() == 3212749824);
  CHECK(plan::preset_shape("meta-llama/Meta-Llama-3-8B")->total_params() == 8030261248);
  CHECK(plan::preset_shape("meta-llama/Llama-3.1-8B")->total_params() == 8030261248);
  CHECK(plan::preset_shape("meta-llama/Llama-3.1-70B")->total_params() == 70553706496);
  CHECK(plan::preset_shape("Qwen/Qwen3-4B")->total_params() == 4022468096);
  CHECK(plan::preset_shape("Qwen/Qwen3-8B")->total_params() == 8190735360);
  CHECK(plan::preset_shape("Qwen/Qwen3-14B")->total_params() == 14768307200);
  CHECK(plan::preset_shape("Qwen/Qwen3-32B")->total_params() == 32762123264);
  // Qwen3-1.7B ties its LM head to the embedding but its checkpoint stores the head as
  // well: the published count (2,031,739,904) holds the vocabulary x hidden matrix twice.
  const auto q17 = *plan::preset_shape("Qwen/Qwen3-1.7B");
  CHECK(q17.tie_embeddings);
  CHECK(q17.total_params() + q17.vocab_size * q17.hidden == 2031739904);
  CHECK_FALSE(plan::preset_shape("gpt2"));
  ModelConfig m;
  m.name = "no/such-model";
  CHECK_THROWS_AS(plan::resolve_model(m), plan::plan_error);
  m.name = "Qwen/Qwen3-0.6B";
  m.debug = ModelDebugConfig{};
  m.debug->num_layers = 3;
  CHECK(plan::resolve_model(m).layers == 3);
}

TEST_CASE("planner: parameters match the trainer's real model (tiny preset)") {
  auto cfg = fake_config("primecfg/tiny", 16);
  auto real = real_params(cfg);
  auto shape = plan::resolve_model(cfg.model);
  CHECK(real == planned_params(shape));
  std::int64_t n = 0;
  for (const auto& [name, numel] : real) n += numel;
  CHECK(n == shape.total_params());
  CHECK(n > 0);
}

TEST_CASE("planner: an HF directory is read like the trainer reads it") {
  // Llama-style (no QK-norm), untied, grouped-query attention, head_dim from hidden/heads.
  auto dir = temp_dir("hf-llama");
  std::ofstream(dir / "config.json") << R"({"model_type": "llama", "vocab_size": 300, "hidden_size": 64,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
    "intermediate_size": 96, "tie_word_embeddings": false})";
  auto cfg = fake_config(dir.string(), 16);
  cfg.model.debug = ModelDebugConfig{};
  cfg.model.debug->random_init = true;  // no safetensors: the trainer draws weights
  auto shape = plan::resolve_model(cfg.model);
  CHECK(shape.head_dim == 16);
  CHECK_FALSE(shape.qk_norm);
  CHECK_FALSE(shape.tie_embeddings);
  CHECK(real_params(cfg) == planned_params(shape));

  std::ofstream(dir / "config.json") << R"({"model_type": "mixtral", "vocab_size": 3})";
  CHECK_THROWS_AS(plan::resolve_model(cfg.model), plan::plan_error);
  std::ofstream(dir / "config.json") << "{not json";
  CHECK_THROWS_AS(plan::resolve_model(cfg.model), plan::plan_error);
}

TEST_CASE("planner: packed SFT rows add the document masks") {
  auto cfg = fake_config("primecfg/tiny", 64);
  auto fixed = plan::make_plan(cfg, unfused_assumptions());
  CHECK_FALSE(fixed.attention_mask);
  CHECK(fixed.mode(Offload::none).gpu.term("mask") == 0);
  SFTDataConfig d;
  d.seq_len = 64;
  d.batch_size = 2;
  d.micro_batch_size = 2;
  cfg.data = d;
  auto packed = plan::make_plan(cfg, unfused_assumptions());
  CHECK(packed.attention_mask);
  // bool mask B x T x T + one bf16 additive mask per block (2 blocks).
  CHECK(packed.mode(Offload::none).gpu.term("mask") == 2 * 64 * 64 + 2 * 2 * 64 * 64 * 2);
}

TEST_CASE("planner: JSON output carries the per-term breakdown") {
  auto a = unfused_assumptions();
  a.gpu_capacity = std::int64_t{139} << 30;
  a.host_capacity = std::int64_t{120} << 30;
  auto p = plan::make_plan(fake_config("Qwen/Qwen3-0.6B", 8192), a);
  auto doc = train::strict_json::parse(plan::format_json(p));
  CHECK(doc.at("model").at("params") == 596049920);
  const auto& modes = doc.at("modes");
  REQUIRE(modes.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(modes[i].at("gpu").at("peak_bytes") == p.modes[i].gpu.peak);
    CHECK(modes[i].at("gpu").at("terms").at("weights") == p.modes[i].gpu.term("weights"));
    CHECK(modes[i].at("host").at("peak_bytes") == p.modes[i].host.peak);
  }
  CHECK(modes[0].at("offload") == "none");
  CHECK(doc.at("modes_ac_toggled").size() == 3);
  auto text = plan::format_text(p);
  CHECK(text.find("PEAK ALLOCATED") != std::string::npos);
  CHECK(text.find("Fits this machine") != std::string::npos);
}

TEST_CASE("planner: out-of-memory advice names a mode that fits") {
  auto cfg = fake_config("Qwen/Qwen3-0.6B", 8192);
  auto base = plan::make_plan(cfg, unfused_assumptions());
  const auto full = base.mode(Offload::full).gpu_total, opt = base.mode(Offload::optimizer).gpu_total;
  plan::Assumptions a = unfused_assumptions();
  a.gpu_capacity = (full + opt) / 2;  // only full offload fits
  a.host_capacity = std::int64_t{1} << 50;
  auto p = plan::make_plan(cfg, a);
  CHECK_FALSE(p.mode(Offload::none).gpu_fits.value());
  CHECK(p.mode(Offload::full).gpu_fits.value());
  auto advice = plan::oom_advice(p, Offload::none);
  CHECK(advice.find("model.offload = \"none\"") != std::string::npos);
  CHECK(advice.find("model.offload = \"full\"") != std::string::npos);
  CHECK(advice.find("\"optimizer\" (") == std::string::npos);

  // A device too small for any mode without checkpointing, large enough with it.
  auto cfg_ac = cfg;
  cfg_ac.model.ac = ActivationCheckpointConfig{};
  a.gpu_capacity = plan::make_plan(cfg_ac, unfused_assumptions()).mode(Offload::full).gpu_total + 1;
  p = plan::make_plan(cfg, a);
  CHECK(p.mode(Offload::full).gpu_fits == false);
  advice = plan::oom_advice(p, Offload::full);
  CHECK(advice.find("--model.ac") != std::string::npos);

  a.gpu_capacity = std::int64_t{1} << 30;
  advice = plan::oom_advice(plan::make_plan(cfg, a), Offload::none);
  CHECK(advice.find("No offload mode") != std::string::npos);
}

TEST_CASE("planner: a run predicted not to fit is refused before it starts, naming what fits") {
  SFTConfig cfg = fake_config("Qwen/Qwen3-0.6B", 8192);
  plan::Assumptions a = unfused_assumptions();
  a.gpu_capacity = plan::make_plan(cfg, a).mode(Offload::full).gpu_total + 1;
  a.gpu_capacity_source = "test";
  a.host_capacity = std::int64_t{1} << 50;
  auto p = plan::make_plan(cfg, a);
  CHECK(plan::fit_refusal(p, Offload::full).empty());
  const std::string why = plan::fit_refusal(p, Offload::none);
  CHECK(why.find("model.offload = \"none\" is predicted not to fit") != std::string::npos);
  CHECK(why.find("GPU") != std::string::npos);
  CHECK(why.find("Predicted to fit: model.offload = \"full\"") != std::string::npos);
  a.host_capacity = std::int64_t{1} << 30;  // 1 GiB of host memory: nothing fits
  a.host_capacity_source = "test";
  CHECK(plan::fit_refusal(plan::make_plan(cfg, a), Offload::full).find("host") != std::string::npos);
}

TEST_CASE("planner: host memory") {
  auto h = plan::host_memory();
  REQUIRE(h);
  CHECK(h->total > 0);
  CHECK(h->available <= h->total);
}

namespace {

// One rank's piece of a parameter, padding included, computed here from the shard
// rule's definition (ceil(numel / world)) rather than through ShardSpan.
std::int64_t per_rank(std::int64_t numel, std::int64_t world) { return (numel + world - 1) / world; }

std::int64_t round_to(std::int64_t bytes, std::int64_t block) { return (bytes + block - 1) / block * block; }

// FP32 bytes of one state tensor set (masters, or accumulators) on one rank: the sum
// over the model's parameters of per_rank x 4, each tensor rounded to `block`.
std::int64_t fp32_state_per_rank(const plan::ModelShape& s, std::int64_t world, std::int64_t block) {
  std::int64_t sum = 0;
  for (const auto& p : s.params()) sum += round_to(per_rank(p.numel(), world) * 4, block);
  return sum;
}

std::string plan_error_text(const std::function<void()>& f) {
  try {
    f();
  } catch (const plan::plan_error& e) {
    return e.what();
  }
  return "(no plan_error)";
}

}  // namespace

TEST_CASE("planner: sharded runs split the FP32 state and the weights per rank (FSDP)") {
  const auto s = hand_shape();
  const auto cfg = fake_config("hand", 4);
  const auto one = plan::make_plan(cfg, s, exact());
  // World 3 does not divide the 8-element norms or the 128-element embedding: the
  // pieces are padded (3 and 43 elements) and every rank allocates rank 0's size.
  for (std::int64_t world : {2, 3, 4}) {
    CAPTURE(world);
    auto a = exact();
    a.world = world;
    const auto p = plan::make_plan(cfg, s, a);
    std::int64_t fp32 = 0, shard_bf16 = 0;
    for (const auto& q : s.params()) {
      fp32 += per_rank(q.numel(), world) * 4;
      shard_bf16 += per_rank(q.numel(), world) * 2;
    }
    CHECK(fp32 == fp32_state_per_rank(s, world, 1));
    if (world != 3) CHECK(fp32 == 1336 * 4 / world);  // nothing to pad
    if (world == 3) CHECK(fp32 > 1336 * 4 / 3);

    const auto& none = p.mode(Offload::none).gpu;
    // Two blocks: the root and both blocks are the whole model.
    CHECK(none.term("weights") + none.term("blocks_whole") == one.mode(Offload::none).gpu.term("weights"));
    CHECK(none.term("weights") == 136 * 2);
    CHECK(none.term("startup_param") == 128 * 2);  // the largest parameter: the 128-element embedding
    CHECK(none.term("masters") == fp32);
    CHECK(none.term("grads") == fp32);
    CHECK(none.term("moments") == 2 * fp32);  // AdamW: two moments
    CHECK(none.term("weight_shard") == shard_bf16);
    // Per micro-batch terms are the single process's.
    CHECK(none.term("activations") == one.mode(Offload::none).gpu.term("activations"));
    CHECK(none.term("ce_chunk") == one.mode(Offload::none).gpu.term("ce_chunk"));

    // Optimizer offload: masters and accumulators on the GPU, the moments pinned on the host.
    const auto& opt = p.mode(Offload::optimizer);
    CHECK(opt.gpu.term("masters") == fp32);
    CHECK(opt.gpu.term("grads") == fp32);
    CHECK(opt.gpu.term("moments") == 0);
    CHECK(opt.host.term("moments") == 2 * fp32);
    // Full offload: all FP32 state on the host (accumulators only with accumulation).
    const auto& full = p.mode(Offload::full);
    CHECK(full.gpu.term("masters") == 0);
    CHECK(full.host.term("masters") == fp32);
    CHECK(full.host.term("moments") == 2 * fp32);
    CHECK(full.gpu.term("weights") + full.gpu.term("blocks_whole") == 1336 * 2);

    // One node holds every rank by default; its host memory is theirs together.
    for (const auto& m : p.modes) CHECK(m.host_node == m.host.peak * world);
  }

  // A real preset with the allocator's 512-byte blocks and pinned rounding.
  const auto cfg8 = fake_config("Qwen/Qwen3-0.6B", 1024);
  const auto shape = *plan::preset_shape("Qwen/Qwen3-0.6B");
  const auto q1 = plan::make_plan(cfg8, shape, unfused_assumptions());
  for (std::int64_t world : {2, 4, 8}) {
    CAPTURE(world);
    plan::Assumptions a = unfused_assumptions();
    a.world = world;
    const auto p = plan::make_plan(cfg8, shape, a);
    const auto fp32 = fp32_state_per_rank(shape, world, 512);
    CHECK(p.mode(Offload::none).gpu.term("masters") == fp32);
    CHECK(p.mode(Offload::none).gpu.term("grads") == fp32);
    CHECK(p.mode(Offload::none).gpu.term("moments") == 2 * fp32);
    CHECK(p.mode(Offload::full).host.term("masters") == fp32_state_per_rank(shape, world, 1));
    // The root (the tied embedding, the final norm) and two of the 28 blocks whole.
    std::int64_t root = 0, block = 0;
    for (const auto& q : shape.params()) {
      const auto bytes = round_to(q.numel() * 2, 512);
      if (q.block < 0) root += bytes;
      if (q.block == 0) block += bytes;
    }
    CHECK(p.mode(Offload::none).gpu.term("weights") == root);
    CHECK(p.mode(Offload::none).gpu.term("blocks_whole") == 2 * block);
    CHECK(root + 2 * block < q1.mode(Offload::none).gpu.term("weights") / 3);
    // Startup: the pieces, and one whole parameter at a time (the embedding, the largest).
    CHECK(p.mode(Offload::none).gpu.term("startup_param") == round_to(151936 * 1024 * 2, 512));
    CHECK(p.mode(Offload::none).gpu.phase("startup")->bytes <
          q1.mode(Offload::none).gpu.phase("startup")->bytes);
    CHECK(p.mode(Offload::none).gpu.peak < q1.mode(Offload::none).gpu.peak);
  }
}

TEST_CASE("planner: FSDP holds the root and the blocks in use whole, every block without resharding") {
  // Four blocks of 600 parameters; the root is the tied embedding (128) and the final
  // norm (8). bf16: 2 bytes each.
  auto s = hand_shape();
  s.layers = 4;
  auto cfg = fake_config("hand", 4);
  auto a = exact();
  const auto one = plan::make_plan(cfg, s, a);
  CHECK(one.mode(Offload::none).gpu.term("weights") == (136 + 4 * 600) * 2);
  CHECK(one.mode(Offload::none).gpu.term("startup_param") == 0);  // one process: nothing sharded
  a.world = 2;
  for (bool reshard : {true, false}) {
    CAPTURE(reshard);
    cfg.model.reshard_after_forward = reshard;
    const auto p = plan::make_plan(cfg, s, a);
    for (const auto& m : p.modes) {
      CAPTURE(plan::mode_name(m.mode));
      CHECK(m.gpu.term("weights") == 136 * 2);
      CHECK(m.gpu.term("blocks_whole") == (reshard ? 2 : 4) * 600 * 2);
      // Blocks are whole while blocks run; without resharding, from the loss on too.
      auto has = [&](const char* phase, const char* term) {
        const auto& t = m.gpu.phase(phase)->terms;
        return std::find(t.begin(), t.end(), term) != t.end();
      };
      for (const char* ph : {"forward_block", "backward_block"}) CHECK(has(ph, "blocks_whole"));
      for (const char* ph : {"forward", "backward_head"}) CHECK(has(ph, "blocks_whole") == !reshard);
      CHECK(!has("backward_embedding", "blocks_whole"));
      CHECK(m.gpu.term("weight_shard") == (136 + 4 * 600) * 2 / 2);
      // Startup builds one parameter at a time beside the pieces; the steps hold what is in use.
      CHECK(m.gpu.term("startup_param") == 128 * 2);
      CHECK(m.gpu.phase("startup")->bytes ==
            m.gpu.term("weight_shard") + m.gpu.term("startup_param") + m.gpu.term("init_draw"));
      CHECK(m.gpu.phase("weight_gather") == nullptr);
    }
  }
}

TEST_CASE("planner: a checkpoint copies one tensor at a time; sharded, it gathers one weight at a time") {
  const auto s = hand_shape();  // the largest tensor: the 128-element tied embedding
  auto cfg = fake_config("hand", 4);
  cfg.ckpt.emplace();
  for (std::int64_t world : {1, 2, 3}) {
    CAPTURE(world);
    auto a = exact();
    a.world = world;
    const auto p = plan::make_plan(cfg, s, a);
    for (const auto& m : p.modes) {
      CAPTURE(plan::mode_name(m.mode));
      // Host: the largest weight (bf16), or the largest FP32 piece the mode keeps on the GPU.
      const std::int64_t fp32_on_gpu = m.mode == Offload::full ? 0 : 4 * per_rank(128, world);
      CHECK(m.host.term("checkpoint") == std::max<std::int64_t>(128 * 2, fp32_on_gpu));
      if (world == 1) {
        CHECK(m.gpu.phase("checkpoint") == nullptr);  // the weights are whole already
        continue;
      }
      // GPU: the step's state less the root (freed after the update), and one weight gathered whole.
      CHECK(m.gpu.term("checkpoint_weight") == per_rank(128, world) * world * 2);
      const auto* saving = m.gpu.phase("checkpoint");
      REQUIRE(saving);
      const auto& t = saving->terms;
      CHECK(std::find(t.begin(), t.end(), "checkpoint_weight") != t.end());
      CHECK(std::find(t.begin(), t.end(), "weights") == t.end());
      CHECK(std::find(t.begin(), t.end(), "weight_shard") != t.end());
      CHECK(saving->bytes < m.gpu.peak);
    }
  }

  // Llama-3.1-70B on a node of 8 H200s with 1.8 TB of host memory: `full` fits with
  // checkpoints too. A save holds the 2.1 GB embedding on the host and on the GPU, not
  // the 141 GB model (which on every rank would need 1.9 TB a node).
  auto big = fake_config("meta-llama/Llama-3.1-70B", 8192);
  big.model.ac = ActivationCheckpointConfig{};
  big.ckpt.emplace();
  plan::Assumptions a = unfused_assumptions();
  a.world = 8;
  a.ranks_per_node = 8;
  a.gpu_capacity = std::int64_t{139} << 30;
  a.host_capacity = std::int64_t{1800} << 30;
  const auto p = plan::make_plan(big, *plan::preset_shape("meta-llama/Llama-3.1-70B"), a);
  const auto& full = p.mode(Offload::full);
  CHECK(full.host.term("checkpoint") == std::int64_t{128256} * 8192 * 2);
  CHECK(full.gpu.term("checkpoint_weight") == std::int64_t{128256} * 8192 * 2);
  CHECK(full.host_fits);
  CHECK(full.gpu_fits);
}

TEST_CASE("planner: a rank accumulates only over its own micro-batches") {
  // 8 micro-batches a step: one process (and 4 ranks, 2 each) accumulate; over 8 ranks each
  // runs one, as the trainer does, and full offload keeps no FP32 accumulators.
  const auto s = hand_shape();
  auto cfg = fake_config("hand", 4);
  std::get<FakeDataConfig>(cfg.data).batch_size = 8;
  for (std::int64_t world : {1, 4, 8}) {
    CAPTURE(world);
    auto a = exact();
    a.world = world;
    const auto p = plan::make_plan(cfg, s, a);
    CHECK((p.mode(Offload::full).host.term("grads") > 0) == (world < 8));
  }
}

TEST_CASE("planner: HSDP shards within a group and replicates across groups") {
  const auto s = hand_shape();
  auto cfg = fake_config("hand", 8);
  auto a = exact();
  a.world = 2;
  const auto two = plan::make_plan(cfg, s, a);  // FSDP over 2 ranks
  a.world = 8;
  cfg.model.dp_replicate = 4;  // 4 replicas of 2-rank shard groups
  const auto hsdp = plan::make_plan(cfg, s, a);
  CHECK(hsdp.replicas == 4);
  CHECK(hsdp.shard_world == 2);
  for (Offload m : offload_modes) {
    CAPTURE(plan::mode_name(m));
    // Each rank holds the pieces of a 2-rank group: what FSDP over 2 ranks holds.
    for (const char* term :
         {"weight_shard", "masters", "grads", "moments", "weights", "blocks_whole", "grad_buckets"}) {
      CAPTURE(term);
      CHECK(hsdp.mode(m).gpu.term(term) == two.mode(m).gpu.term(term));
      CHECK(hsdp.mode(m).host.term(term) == two.mode(m).host.term(term));
    }
    CHECK(hsdp.mode(m).host_node == hsdp.mode(m).host.peak * 8);  // one node of 8 ranks by default
  }
  CHECK(plan::format_text(hsdp).find("HSDP: 4 replicas of 2-rank shard groups") != std::string::npos);
  CHECK(train::strict_json::parse(plan::format_json(hsdp))["shard_world_size"] == 2);
  // dp_replicate must divide the world size.
  cfg.model.dp_replicate = 3;
  try {
    plan::make_plan(cfg, s, a);
    FAIL("dp_replicate = 3 over 8 ranks was planned");
  } catch (const plan::plan_error& e) {
    const std::string what = e.what();
    CHECK(what.find("model.dp_replicate: dp_replicate = 3 does not divide the world size 8") !=
          std::string::npos);
  }
}

TEST_CASE("planner: a sharded run's collective buffers") {
  const auto s = hand_shape();
  auto cfg = fake_config("hand", 4);
  auto a = exact();
  a.world = 2;
  // dist.bucket_mib's default, 25 MiB of FP32 gradients, is far above this model.
  auto p = plan::make_plan(cfg, s, a);
  const std::int64_t elems = (25ll << 20) / 4;
  CHECK(p.mode(Offload::none).gpu.term("grad_buckets") == 2 * elems * 4 + 2 * (elems / 2) * 4);
  // The all-gathers write into the weights themselves: no bucket, and no padded
  // parameter at world 2 that would need a buffer of its own.
  CHECK(p.mode(Offload::none).gpu.term("gather_temp") == 0);

  // A bucket is at least the largest padded parameter: the 128-element embedding (129
  // padded at world 3, 43 per rank).
  a.bucket_bytes = 64;
  p = plan::make_plan(cfg, s, a);
  for (const auto& m : p.modes) {
    CAPTURE(plan::mode_name(m.mode));
    CHECK(m.gpu.term("grad_buckets") == 2 * 128 * 4 + 2 * 64 * 4);
  }
  a.world = 3;
  CHECK(plan::make_plan(cfg, s, a).mode(Offload::none).gpu.term("grad_buckets") == 2 * 129 * 4 + 2 * 43 * 4);
  // At world 3 the 128-element matrices pad to 129: gathered apart, then copied in.
  CHECK(plan::make_plan(cfg, s, a).mode(Offload::none).gpu.term("gather_temp") == 129 * 2);
  a.world = 2;
  auto cfg_bf16 = cfg;
  cfg_bf16.model.reduce_dtype = Dtype::bfloat16;
  CHECK(plan::make_plan(cfg_bf16, s, a).mode(Offload::none).gpu.term("grad_buckets") ==
        2 * 128 * 2 + 2 * 64 * 2);
  // One rank under a launcher (torchrun with one process) is sharded, but sums nothing:
  // no bucket at all. With HSDP's replicas (shard groups of one) the buckets are back.
  auto launched = a;
  launched.world = 1;
  launched.process_group = true;
  for (const auto& m : plan::make_plan(cfg, s, launched).modes) {
    CHECK(m.gpu.term("grad_buckets") == 0);
    CHECK(m.gpu.term("grad_buckets_root") == 0);
  }
  auto replicas = cfg;
  replicas.model.dp_replicate = 2;
  CHECK(plan::make_plan(replicas, s, a).mode(Offload::none).gpu.term("grad_buckets") > 0);

  // The buckets are alive in backward.
  const auto one = plan::make_plan(cfg, s, exact());
  const auto& g = p.mode(Offload::none).gpu;
  const auto& g1 = one.mode(Offload::none).gpu;
  const std::int64_t persistent = g.phase("optimizer_step")->bytes,
                     persistent1 = g1.phase("optimizer_step")->bytes;
  // Weights whole (2 B), masters + accumulators + two moments halved (16 B / 2), the
  // bf16 weight shard (2 B / 2), per parameter.
  // Root whole (2 B of its 136), masters + accumulators + two moments halved (16 B / 2),
  // the bf16 weight shard (2 B / 2), per parameter; the two blocks whole while they run.
  CHECK(persistent == 136 * 2 + 1336 * 8 + 1336);
  const std::int64_t blocks = 1200 * 2;
  // The hand model's embedding is tied: its gradient waits for the embedding's backward,
  // so the LM head's backward has no bucket.
  CHECK(g.phase("backward_head")->bytes - persistent == g1.phase("backward_head")->bytes - persistent1);
  CHECK(g.phase("backward_block")->bytes - persistent ==
        g1.phase("backward_block")->bytes - persistent1 + g.term("grad_buckets") + blocks);
  CHECK(g.phase("backward_embedding")->bytes - persistent ==
        g1.phase("backward_embedding")->bytes - persistent1);
  // The embedding's gradient (the tied head's summed in) goes into its own bucket.
  CHECK(g.term("grad_buckets_root") == 128 * 4 + 64 * 4);
  CHECK(g.phase("embedding_reduce")->bytes - persistent ==
        g.term("inputs") + 128 * 2 + g.term("grad_buckets_root"));
  CHECK(g.phase("head_reduce") == nullptr);  // tied: the head's gradient waits for the embedding's
  CHECK(g.phase("forward")->bytes - persistent == g1.phase("forward")->bytes - persistent1);
  CHECK(g.phase("weight_gather") == nullptr);
  std::int64_t max_phase = 0;
  for (const auto& ph : g.phases) max_phase = std::max(max_phase, ph.bytes);
  CHECK(g.peak == max_phase);
}

TEST_CASE("planner: a bucket as large as the embedding is alive only in the root's backward") {
  // Llama-3.2-3B: a block's largest parameter (the MLP's 8192 x 3072) is 16 times
  // smaller than the tied embedding (128256 x 3072); each sets its own buckets.
  auto cfg = fake_config("meta-llama/Llama-3.2-3B", 8192);
  std::get<FakeDataConfig>(cfg.data).batch_size = 2;
  auto a = exact();
  a.world = 2;
  const auto p = plan::make_plan(cfg, a);
  const auto& g = p.mode(Offload::none).gpu;
  const std::int64_t mlp = 8192ll * 3072 * 4, embedding = 128256ll * 3072 * 4;  // FP32 reduce
  CHECK(g.term("grad_buckets") == 2 * mlp + 2 * (mlp / 2));
  CHECK(g.term("grad_buckets_root") == embedding + embedding / 2);
  auto has = [&](const char* phase, const char* term) {
    const auto& t = g.phase(phase)->terms;
    return std::find(t.begin(), t.end(), term) != t.end();
  };
  CHECK(has("backward_block", "grad_buckets"));
  CHECK(!has("backward_block", "grad_buckets_root"));
  CHECK(has("embedding_reduce", "grad_buckets_root"));
  CHECK(!has("embedding_reduce", "grad_buckets"));
  CHECK(!has("backward_embedding", "grad_buckets_root"));
  // The tied embedding's gradient from the LM head is held, not bucketed, until the
  // embedding's own has come.
  CHECK(!has("backward_head", "grad_buckets_root"));
  CHECK(!has("backward_head", "grad_buckets"));
  // Gloo on CUDA (dist.backend = "gloo": ranks sharing one GPU) sums a copy of each bucket.
  a.bucket_copy = true;
  const auto pg = plan::make_plan(cfg, a);
  const auto& gloo = pg.mode(Offload::none).gpu;
  CHECK(gloo.term("grad_buckets") == g.term("grad_buckets") + mlp);
  CHECK(gloo.term("grad_buckets_root") == g.term("grad_buckets_root") + embedding);
  // An untied LM head's gradient goes into its bucket when the head's backward is done.
  cfg.model.name = "meta-llama/Meta-Llama-3-8B";
  const auto untied = plan::make_plan(cfg, a);
  const auto& u = untied.mode(Offload::none).gpu;
  REQUIRE(u.phase("head_reduce") != nullptr);
  const auto& t = u.phase("head_reduce")->terms;
  CHECK(std::find(t.begin(), t.end(), "grad_buckets_root") != t.end());
  CHECK(std::find(t.begin(), t.end(), "ce_backward") == t.end());
  CHECK(u.term("head_grad_out") == (128256ll * 4096 + 8192 * 4096) * 2);  // one 8192-token micro-batch
  train::TrainerOptions o;
  o.plan = true;
  o.dist.backend = train::DistBackend::gloo;
  plan::Assumptions from_options = unfused_assumptions();
  plan::apply_ranks(from_options, o, train::Launch{});
  CHECK(from_options.bucket_copy);
  o.dist.backend = train::DistBackend::nccl;
  plan::apply_ranks(from_options, o, train::Launch{});
  CHECK(!from_options.bucket_copy);
}

TEST_CASE("planner: host memory per node decides the host fit") {
  const auto s = hand_shape();
  const auto cfg = fake_config("hand", 4);
  auto a = exact();
  a.world = 4;
  a.ranks_per_node = 2;  // two nodes of two ranks
  auto p = plan::make_plan(cfg, s, a);
  const auto& opt = p.mode(Offload::optimizer);
  CHECK(opt.host_node == 2 * opt.host.peak);
  a.host_capacity = opt.host_node;
  CHECK(plan::make_plan(cfg, s, a).mode(Offload::optimizer).host_fits == true);
  a.host_capacity = opt.host_node - 1;  // one rank's would fit, the node's does not
  CHECK(opt.host.peak <= *a.host_capacity);
  p = plan::make_plan(cfg, s, a);
  CHECK(p.mode(Offload::optimizer).host_fits == false);
  a.gpu_capacity = std::int64_t{1} << 40;
  a.host_capacity_source = "test";
  const auto why = plan::fit_refusal(plan::make_plan(cfg, s, a), Offload::optimizer);
  CHECK(why.find("over 4 ranks") != std::string::npos);
  CHECK(why.find("by 2 ranks on the node") != std::string::npos);
}

TEST_CASE("planner: --plan-world-size alone fills nodes of 8 ranks, as the advice does") {
  auto ranks = [](std::int64_t world) {
    train::TrainerOptions o;
    o.plan = true;
    o.plan_world_size = world;
    plan::Assumptions a = unfused_assumptions();
    plan::apply_ranks(a, o, train::Launch{});
    return a;
  };
  CHECK(ranks(64).per_node() == 8);
  CHECK(ranks(64).ranks_per_node_source == "--plan-ranks-per-node unset: 8 a node");
  CHECK(ranks(16).per_node() == 8);
  CHECK(ranks(8).per_node() == 8);
  CHECK(ranks(4).per_node() == 4);  // fewer than a node: one node
  // 12 ranks do not fill nodes of 8: the error names the option that says otherwise.
  try {
    ranks(12);
    FAIL("12 ranks in nodes of 8 planned");
  } catch (const plan::plan_error& e) {
    CHECK(std::string(e.what()).find("--plan-ranks-per-node") != std::string::npos);
  }
  // Said, it is used.
  train::TrainerOptions o;
  o.plan = true;
  o.plan_world_size = 12;
  o.plan_ranks_per_node = 4;
  plan::Assumptions a = unfused_assumptions();
  plan::apply_ranks(a, o, train::Launch{});
  CHECK(a.per_node() == 4);
}

TEST_CASE("planner: world 1 is the single-process plan") {
  const auto cfg = fake_config("Qwen/Qwen3-0.6B", 8192);
  plan::Assumptions base = unfused_assumptions();
  base.gpu_capacity = std::int64_t{139} << 30;
  base.host_capacity = std::int64_t{120} << 30;
  auto a = base;
  train::TrainerOptions o;
  o.plan = true;
  plan::apply_ranks(a, o, train::Launch{});  // no launcher, no options
  CHECK(a.world == 1);
  CHECK(a.per_node() == 1);
  const auto p0 = plan::make_plan(cfg, base), p1 = plan::make_plan(cfg, a);
  CHECK(plan::format_text(p1) == plan::format_text(p0));
  CHECK(plan::format_text(p1).find("Ranks:") == std::string::npos);
  auto j0 = train::strict_json::parse(plan::format_json(p0)),
       j1 = train::strict_json::parse(plan::format_json(p1));
  CHECK(j1.at("modes") == j0.at("modes"));
  CHECK(j1.at("world_size") == 1);
  CHECK(j1.at("ranks_per_node") == 1);
  for (const auto& m : p1.modes) {
    CHECK(m.host_node == m.host.peak);
    CHECK(m.gpu.term("weight_shard") == 0);
    CHECK(m.gpu.term("grad_buckets") == 0);
    CHECK(m.gpu.phase("weight_gather") == nullptr);
  }
}

TEST_CASE("planner: ranks from the options and the launcher, and bad combinations") {
  train::TrainerOptions o;
  o.plan = true;
  plan::Assumptions a = unfused_assumptions();
  // The launcher's variables when the options are not given.
  train::Launch env;
  env.world = 16;
  env.local_world = 8;
  plan::apply_ranks(a, o, env);
  CHECK(a.world == 16);
  CHECK(a.per_node() == 8);
  CHECK(a.world_source == "WORLD_SIZE");
  CHECK(a.ranks_per_node_source == "LOCAL_WORLD_SIZE");
  CHECK(a.bucket_bytes == 25ll << 20);
  // The options win; ranks per node default to the world size without a launcher.
  o.plan_world_size = 8;
  o.dist.bucket_mib = 1;
  plan::apply_ranks(a, o, train::Launch{});
  CHECK(a.world == 8);
  CHECK(a.per_node() == 8);
  CHECK(a.bucket_bytes == 1 << 20);
  o.plan_ranks_per_node = 4;
  plan::apply_ranks(a, o, env);
  CHECK(a.world == 8);
  CHECK(a.per_node() == 4);

  // Bad combinations name the option (or the launcher's variable) they came from.
  o.plan_ranks_per_node = 16;
  auto why = plan_error_text([&] { plan::apply_ranks(a, o, train::Launch{}); });
  CHECK(why.find("--plan-ranks-per-node = 16") != std::string::npos);
  CHECK(why.find("--plan-world-size = 8") != std::string::npos);
  o.plan_ranks_per_node = 3;
  why = plan_error_text([&] { plan::apply_ranks(a, o, train::Launch{}); });
  CHECK(why.find("--plan-world-size = 8 is not a multiple of --plan-ranks-per-node = 3") !=
        std::string::npos);
  o.plan_world_size = std::nullopt;
  o.plan_ranks_per_node = 2;  // alone: the world is one process
  why = plan_error_text([&] { plan::apply_ranks(a, o, train::Launch{}); });
  CHECK(why.find("--plan-ranks-per-node = 2") != std::string::npos);
  o.plan_ranks_per_node = std::nullopt;
  env.world = 12;
  env.local_world = 8;
  why = plan_error_text([&] { plan::apply_ranks(a, o, env); });
  CHECK(why.find("WORLD_SIZE = 12 is not a multiple of LOCAL_WORLD_SIZE = 8") != std::string::npos);
  // make_plan checks the same on Assumptions set by hand.
  plan::Assumptions bad = unfused_assumptions();
  bad.world = 4;
  bad.ranks_per_node = 3;
  CHECK_THROWS_AS(plan::make_plan(fake_config("hand", 4), hand_shape(), bad), plan::plan_error);
  bad.world = 0;
  bad.ranks_per_node = std::nullopt;
  CHECK_THROWS_AS(plan::make_plan(fake_config("hand", 4), hand_shape(), bad), plan::plan_error);
}

TEST_CASE("planner: a sharded plan's text and JSON") {
  plan::Assumptions a = unfused_assumptions();
  a.gpu_capacity = std::int64_t{139} << 30;
  a.host_capacity = std::int64_t{120} << 30;
  a.world = 8;
  a.ranks_per_node = 8;
  const auto p = plan::make_plan(fake_config("Qwen/Qwen3-0.6B", 8192), a);
  const auto doc = train::strict_json::parse(plan::format_json(p));
  CHECK(doc.at("world_size") == 8);
  CHECK(doc.at("ranks_per_node") == 8);
  CHECK(doc.at("dist").at("bucket_bytes") == 25ll << 20);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(doc.at("modes")[i].at("gpu").at("peak_bytes") == p.modes[i].gpu.peak);
    CHECK(doc.at("modes")[i].at("host").at("node_peak_bytes") == p.modes[i].host_node);
    CHECK(p.modes[i].host_node == 8 * p.modes[i].host.peak);
  }
  const auto text = plan::format_text(p);
  CHECK(text.find("Ranks: 8") != std::string::npos);
  CHECK(text.find("PER NODE (8 ranks)") != std::string::npos);
  CHECK(text.find("reduce-scatter buckets (blocks)") != std::string::npos);
  CHECK(text.find("embedding grad reduce-scatter") != std::string::npos);
  // A sharded `full` splits the tied embedding over the pieces: each rank's head-share
  // buffer holds its piece (pinned, rounded up to a power of 2 as the CUDA host
  // allocator does: V x D / 8 bf16, 37 MiB, takes 64 MiB); one process's the whole
  // (297 MiB: 512 MiB). With one micro-batch a rank (8 ranks, 8 micro-batches) the
  // head's share is summed over the ranks in a copy, a vocabulary chunk at a time in the
  // forward's loss (8192 tokens: vocabulary chunks).
  CHECK(p.mode(Offload::full).host.term("head_grad") == (64ll << 20));
  const auto& fg = p.mode(Offload::full).gpu;
  CHECK(fg.term("head_share_sum") ==
        train::vocab_chunk_rows(train::default_ce_chunk_tokens(151936), 151936, 8192) * 1024 * 2);
  const auto& fwd = fg.phase("forward")->terms;
  CHECK(std::find(fwd.begin(), fwd.end(), "head_share_sum") != fwd.end());
  CHECK(p.mode(Offload::none).gpu.term("head_share_sum") == 0);  // none and optimizer do not split
  a.world = 1;
  a.ranks_per_node.reset();
  const auto one = plan::make_plan(fake_config("Qwen/Qwen3-0.6B", 8192), a);
  CHECK(one.mode(Offload::full).host.term("head_grad") == (512ll << 20));
  CHECK(one.mode(Offload::full).gpu.term("head_share_sum") == 0);  // one process: nothing to sum
  // The activation checkpointing line: "every block", "every 2 blocks".
  auto every2 = fake_config("Qwen/Qwen3-0.6B", 8192);
  every2.model.ac = ActivationCheckpointConfig{};
  CHECK(plan::format_text(plan::make_plan(every2, a)).find("activation checkpointing on (every block)") !=
        std::string::npos);
  every2.model.ac = ActivationCheckpointConfig{};
  every2.model.ac->freq = 2;
  CHECK(plan::format_text(plan::make_plan(every2, a)).find("activation checkpointing on (every 2 blocks)") !=
        std::string::npos);
}

TEST_CASE(
    "host memory: an HF directory's safetensors are mapped at startup; a preset or random init maps none") {
  const fs::path dir = temp_dir("hf-init");
  std::ofstream(dir / "config.json") << R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
    "vocab_size": 260, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 384, "rope_theta": 10000.0,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
    "attention_bias": false, "torch_dtype": "float32"})";
  std::ofstream(dir / "model-00001-of-00002.safetensors") << std::string(1000, 'x');
  std::ofstream(dir / "model-00002-of-00002.safetensors") << std::string(234, 'x');
  std::ofstream(dir / "README.md") << std::string(5000, 'x');  // not a weight file
  auto init = [](const SFTConfig& c) {
    return plan::make_plan(c, exact()).mode(Offload::full).host.term("init");
  };
  SFTConfig c = fake_config(dir.string(), 64);
  CHECK(init(c) == 1234);
  c.model.debug = ModelDebugConfig{.random_init = true};
  CHECK(init(c) == 0);
  CHECK(init(fake_config("primecfg/tiny", 64)) == 0);
}

// ac.mode = "selective" with "routed_experts" (prime-rl's selective checkpointing of the
// experts): every ac_freq-th routed block keeps its activations but its experts'. By hand
// for Qwen3-30B-A3B (D 2048, moe_intermediate 768, top-8, every block routed), per token
// and block: the experts' rows, gate, up, silu, product and output in bf16 and the
// weighted sum's indices, 8 x (2048 x 2 + 4 x 768 x 2 + 2048 x 2 + 20) = 114848 bytes,
// become each slot's place in the order and its FP32 weight, 8 x 12.
TEST_CASE("planner: selective checkpointing of routed_experts keeps the routing, not the experts") {
  const auto s = plan::preset_shape("Qwen/Qwen3-30B-A3B").value();
  auto cfg = fake_config("Qwen/Qwen3-30B-A3B", 1024);
  auto a = exact();
  const auto& prof = plan::shipped_profile();
  REQUIRE(prof);
  a.profile = &*prof;
  const auto none = plan::make_plan(cfg, s, a);
  cfg.model.ac = ActivationCheckpointConfig{};
  cfg.model.ac->mode = AcMode::selective;
  cfg.model.ac->targets = {"routed_experts"};
  const auto every = plan::make_plan(cfg, s, a);
  cfg.model.ac->freq = 2;
  const auto half = plan::make_plan(cfg, s, a);
  const std::int64_t per_block = 1024 * (8 * (2048 * 2 + 4 * 768 * 2 + 2048 * 2 + 20) - 8 * 12);
  const auto acts = [](const plan::Plan& p) { return p.mode(Offload::none).gpu.term("activations"); };
  CHECK(acts(none) - acts(every) == 48 * per_block);
  CHECK(acts(none) - acts(half) == 24 * per_block);
  CHECK(every.selective_experts);
  CHECK_FALSE(every.ac);
  // The experts stacked for the grouped GEMM (3 x 128 experts x 768 x 2048 in bf16) are held
  // only while a block runs, recomputed or not: by the block in forward, and with their
  // gradient by the block in backward. Its backward is fullest in the down projection's
  // GEMM backward: the gradient coming in (D a token), the product's (I a slot), the copy
  // stacked again and the down projection's third of its gradient. In `none` (on a GPU:
  // the gradients handed to the update as they come) that gradient is the experts' own,
  // counted once, by the stage.
  const std::int64_t stacked = 3LL * 128 * 768 * 2048 * 2;
  for (const auto* p : {&none, &every}) {
    CHECK(p->mode(Offload::none).gpu.term("block_in_use") == stacked);
    CHECK(p->activations.per_block_in_use == stacked);
  }
  CHECK(none.mode(Offload::none).gpu.term("block_recompute") -
            every.mode(Offload::none).gpu.term("block_recompute") ==
        0);
  auto handing = a;  // the fused AdamW on a GPU: `none` hands the gradients over
  handing.cuda = true;
  handing.fused_adamw = true;
  const auto handed = plan::make_plan(fake_config("Qwen/Qwen3-30B-A3B", 1024), s, handing);
  const auto& top_gpu = handed.mode(Offload::none).gpu;
  const std::int64_t top_acts = top_gpu.term("activations") - top_gpu.term("activations_below_top");
  // The last block's experts' gradients are the stages' (a third of them at the fullest),
  // not also grads_top's; in the first block's backward, not also grads_blocks'.
  CHECK(top_gpu.term("grads_top") > 0);
  CHECK(top_gpu.term("grads_top") < stacked / 3);
  CHECK(top_gpu.term("grads_blocks") - top_gpu.term("grads_blocks_but_running") == stacked);
  CHECK(top_gpu.term("block_recompute") == top_acts);
  const std::int64_t down_stage = 1024LL * (2048 + 8 * 768) * 2;
  CHECK(top_gpu.term("backward_temps") == down_stage + stacked + stacked / 3);
  CHECK(handed.mode(Offload::full).gpu.term("backward_temps") == down_stage + stacked + stacked / 3);
  CHECK(none.mode(Offload::none).gpu.term("backward_temps") == down_stage + stacked + stacked / 3);
  // The recompute costs time: some, and less than recomputing whole blocks.
  const auto& t_sel = every.mode(Offload::none).time;
  cfg.model.ac->mode = AcMode::full;
  cfg.model.ac->freq = 1;
  const auto full = plan::make_plan(cfg, s, a);
  REQUIRE(t_sel);
  REQUIRE(full.mode(Offload::none).time);
  CHECK(t_sel->recompute > 0);
  CHECK(t_sel->recompute < full.mode(Offload::none).time->recompute);
}

// Expert parallelism (model.ep), by hand for Qwen3-30B-A3B (48 blocks, each routed: 128
// experts of 3 x 768 x 2048, top-8) on 8 ranks. Per rank the FP32 state is the same
// bytes (FSDP splits every expert in 8; ep = 8 gives each rank 16 experts whole, neither
// padded), but a block gathered for the forward holds 16 experts instead of 128, and the
// experts' stacked copy that a running block holds is of those 16.
TEST_CASE("planner: expert parallelism gathers and stacks a rank's experts only; its rules name model.ep") {
  const auto s = plan::preset_shape("Qwen/Qwen3-30B-A3B").value();
  auto cfg = fake_config("Qwen/Qwen3-30B-A3B", 1024);
  auto a = exact();
  a.world = 8;
  cfg.model.ep = 1;
  const auto fsdp = plan::make_plan(cfg, s, a).mode(Offload::none).gpu;
  cfg.model.ep = 8;
  const auto ep = plan::make_plan(cfg, s, a).mode(Offload::none).gpu;
  for (const char* term : {"masters", "moments", "weight_shard"}) {
    INFO(term);
    CHECK(fsdp.term(term) == ep.term(term));
  }
  const std::int64_t expert = 3LL * 768 * 2048 * 2;  // bf16, one expert's three projections
  CHECK(fsdp.term("blocks_whole") - ep.term("blocks_whole") == 2 * 112 * expert);
  CHECK(fsdp.term("activations") == ep.term("activations"));  // at balanced routing
  CHECK(fsdp.term("block_in_use") - ep.term("block_in_use") == 112 * expert);
  CHECK(fsdp.term("block_recompute") == ep.term("block_recompute"));
  CHECK(fsdp.term("backward_temps") - ep.term("backward_temps") == 112 * expert * 4 / 3);
  // The exchange: a block's received rows and their regrouped copy, 1024 tokens x 8 slots.
  CHECK(ep.term("ep_exchange") == 2LL * 1024 * 8 * 2048 * 2);
  CHECK(fsdp.term("ep_exchange") == 0);
  CHECK(ep.peak < fsdp.peak);
  // "auto" is min(ranks / dp_replicate, 8), as prime-rl resolves it: the same plan as 8.
  cfg.model.ep = ExpertParallel::auto_;
  CHECK(plan::make_plan(cfg, s, a).mode(Offload::none).gpu.peak == ep.peak);
  // 3 divides neither 8 ranks nor 128 experts; 16 is more than the ranks of a replica.
  for (const std::int64_t bad : {3, 16}) {
    cfg.model.ep = bad;
    CHECK_THROWS_WITH_AS(plan::make_plan(cfg, s, a), doctest::Contains("model.ep"), plan::plan_error);
  }
}
