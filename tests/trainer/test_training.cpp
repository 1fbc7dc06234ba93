// Training runs on the CPU: the three offload strategies agree, resume is exact,
// checkpoints cross modes, model-only resume keeps weights bit-identical, and
// an HF-style directory loads.
#include "base/remove_tree.hpp"
#include "base/safetensors.hpp"
#include "base/strict_json.hpp"
#include "bit_identical.hpp"
#include "test_seams.hpp"
#include "trainer.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;
using namespace primecfg;
using train::run_sft;
using train::RunOptions;
using train::RunResult;

namespace {

fs::path temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("primecfg-trainer-test-" + std::to_string(::getpid())) / name;
  primecfg::train::remove_tree(d);
  fs::create_directories(d);
  return d;
}

// The tiny model on reverse-text, two micro-batches per step (gradient accumulation).
SFTConfig small_config(Offload mode, const fs::path& out, OptimizerConfig optim) {
  SFTConfig c;
  c.model.name = "primecfg/tiny";
  c.model.offload = mode;
  c.model.compile = std::nullopt;
  SFTDataConfig d;
  d.seq_len = 48;
  d.batch_size = 4;
  d.micro_batch_size = 2;
  d.seed = 3;
  c.data = d;
  c.optim = optim;
  c.max_steps = 20;
  c.output_dir = out;
  return c;
}

AdamWConfig adamw_no_clip() {
  AdamWConfig a;
  a.lr = 2e-3;
  a.weight_decay = 0.01;
  a.max_norm = std::nullopt;  // full offload cannot clip; compare like with like
  return a;
}

SignSGDConfig sign_no_clip() {
  SignSGDConfig s;
  s.lr = 1e-3;
  s.weight_decay = 0.01;
  s.max_norm = std::nullopt;
  return s;
}

RunOptions quiet() {
  RunOptions o;
  o.print = false;
  o.collect_weights = true;
  o.device = "cpu";
  return o;
}

struct Diff {
  double loss_rel = 0;    // max |a - b| / |b| over steps
  double weight_abs = 0;  // max |a - b| over all master weights
};

// Losses of the first `steps` steps (all by default), and every weight.
Diff compare(const RunResult& a, const RunResult& b, std::size_t steps = SIZE_MAX) {
  Diff d;
  REQUIRE(a.losses.size() == b.losses.size());
  for (std::size_t i = 0; i < std::min(steps, a.losses.size()); ++i)
    d.loss_rel = std::max(d.loss_rel, std::fabs(a.losses[i] - b.losses[i]) / std::fabs(b.losses[i]));
  REQUIRE(a.weights.size() == b.weights.size());
  for (std::size_t i = 0; i < a.weights.size(); ++i) {
    REQUIRE(a.weights[i].first == b.weights[i].first);
    REQUIRE(a.weights[i].second.size() == b.weights[i].second.size());
    for (std::size_t k = 0; k < a.weights[i].second.size(); ++k)
      d.weight_abs = std::max(
          d.weight_abs, static_cast<double>(std::fabs(a.weights[i].second[k] - b.weights[i].second[k])));
  }
  return d;
}

// Each step's "grad_norm" in out_dir's metrics.jsonl.
std::vector<double> grad_norms(const fs::path& out_dir) {
  std::ifstream in(out_dir / "metrics.jsonl");
  std::vector<double> out;
  for (std::string line; std::getline(in, line);)
    if (const auto at = line.find("\"grad_norm\":"); at != std::string::npos)
      out.push_back(std::stod(line.substr(at + 12)));
  return out;
}

}  // namespace

// What each comparison holds, and why.
//
// NoOffload and OptimizerOffload run the identical LibTorch update on the CPU (the
// moment copies are no-ops there): they must agree bit for bit.
//
// FullOffload differs from them in two ways: its update is the fused CPU kernel
// instead of at::_fused_adamw_ (the same formula evaluated in another order, about
// one FP32 ulp of a weight per step), and with a tied embedding its loss walks the
// vocabulary in chunks instead of the tokens (other GEMM blockings, so gradients
// that differ in their last bits). The second is not a strategy's business and Adam
// magnifies it without bound where it matters least: the first update is
// lr * g / (|g| + eps), so for an element whose true gradient is about 0 (measured:
// -8e-10) a rounding difference d in g moves the weight by up to lr * d / eps, i.e.
// up to 2 * lr. Weights are therefore compared like with like: FullOffload with the
// token walk (test seam), where only the update code differs; 20 steps of ulp-level
// differences fed back through the gradients measured 2.1e-7 (AVX-512) and 2.4e-7
// (ATEN_CPU_CAPABILITY=avx2) on the weights. We allow 2e-5 absolute (lr = 2e-3: a strategy that
// skipped, repeated or misordered an update is off by about lr, 100 times more).
//
// FullOffload as it runs (the vocabulary walk) is compared on the losses: an element
// that Adam moved far from the other run is one whose gradient is about 0, so the
// loss is insensitive to it to first order (dL = sum_i g_i dw_i); the loss moves
// only by the rounding of the walk itself, about 1e-7 relative. We allow 1e-5.
//
// SignSGD takes the sign of each gradient element, a discontinuous function: an element
// whose gradient is about 0 may get the other sign from the other walk, and its weight
// moves 2 lr the other way. Step 2's loss is still insensitive to it (first order, as
// above), but from then on the runs follow different trajectories, whose gradients
// differ everywhere by more than rounding, and later flips compound. Measured on the
// GPU machine's Xeon (AVX-512): 0.78% apart at step 20, where this machine showed no flip.
// So SignSGD's vocabulary walk is held to its first two losses (the walk's forward, and
// its gradient through one update); its update code to every weight by the token walk.
TEST_CASE("equivalence: the three strategies give the same losses and weights (AdamW, SignSGD)") {
  for (int opt = 0; opt < 2; ++opt) {
    OptimizerConfig o = opt == 0 ? OptimizerConfig{adamw_no_clip()} : OptimizerConfig{sign_no_clip()};
    CAPTURE(opt);
    const fs::path none_dir = temp_dir("eq-none"), tokens_dir = temp_dir("eq-full-tokens");
    auto none = run_sft(small_config(Offload::none, none_dir, o), quiet());
    auto optim = run_sft(small_config(Offload::optimizer, temp_dir("eq-opt"), o), quiet());
    auto full = run_sft(small_config(Offload::full, temp_dir("eq-full"), o), quiet());
    RunResult full_token_walk;
    {
      train::TestSeams seams({.vocabulary_loss = false});
      full_token_walk = run_sft(small_config(Offload::full, tokens_dir, o), quiet());
    }
    REQUIRE(none.losses.size() == 20);
    // The run learns at all (otherwise agreement would be cheap).
    CHECK(none.losses.back() < none.losses.front() - 0.5);
    CHECK(none.losses == optim.losses);
    CHECK(bit_identical(none.weights, optim.weights));
    Diff same_walk = compare(full_token_walk, none);
    MESSAGE("full (token walk) vs none: max loss rel diff " << same_walk.loss_rel << ", max weight abs diff "
                                                            << same_walk.weight_abs);
    CHECK(same_walk.loss_rel < 1e-5);
    CHECK(same_walk.weight_abs < 2e-5);
    // The gradient norm: summed on the host over two micro-batches in full, on the device
    // in none. metrics.jsonl keeps 6 significant digits: the runs agree to the last one or
    // differ by a unit of it (seen: 2 of 20 steps, on AVX-512 and AVX2), which is 1e-5 at
    // most for norms of 1 to 10; Approx allows 1e-5 x (1 + |norm|).
    const auto norms = grad_norms(none_dir), full_norms = grad_norms(tokens_dir);
    REQUIRE(norms.size() == 20);
    REQUIRE(full_norms.size() == 20);
    for (std::size_t i = 0; i < norms.size(); ++i)
      CHECK(full_norms[i] == doctest::Approx(norms[i]).epsilon(1e-5));
    Diff as_run = compare(full, none, opt == 0 ? SIZE_MAX : 2);
    MESSAGE("full (vocabulary walk) vs none: max loss rel diff " << as_run.loss_rel);
    CHECK(as_run.loss_rel < 1e-5);
  }
}

TEST_CASE("resume reproduces the uninterrupted run's losses exactly, and resumes across modes") {
  auto o = OptimizerConfig{adamw_no_clip()};
  // Uninterrupted: 20 steps, checkpoint every 10.
  auto dir = temp_dir("resume");
  auto cfg = small_config(Offload::none, dir, o);
  cfg.ckpt = CheckpointConfig{};
  cfg.ckpt->interval = 10;
  auto whole = run_sft(cfg, quiet());
  REQUIRE(fs::exists(dir / "checkpoints" / "step_10" / "model.safetensors"));
  REQUIRE(fs::exists(dir / "checkpoints" / "step_10" / "optimizer.safetensors"));
  CHECK_FALSE(fs::exists(dir / "checkpoints" / ".step_10.tmp"));

  for (Offload mode : offload_modes) {
    CAPTURE(static_cast<int>(mode));
    auto rc = cfg;
    rc.model.offload = mode;
    rc.output_dir = temp_dir("resume-out");
    rc.ckpt->output_dir = dir / "checkpoints";
    rc.ckpt->interval = std::nullopt;
    rc.resume = ResumeConfig{10};
    auto tail = run_sft(rc, quiet());
    REQUIRE(tail.first_step == 10);
    REQUIRE(tail.losses.size() == 10);
    std::vector<double> expected(whole.losses.begin() + 10, whole.losses.end());
    if (mode != Offload::full) {
      CHECK(tail.losses == expected);  // exact: same update code, same data, same state
    } else {
      // Other update code and (tied embedding) the vocabulary walk: the losses, as in
      // the equivalence case above and for the reason given there.
      for (std::size_t i = 0; i < 10; ++i)
        CHECK(std::fabs(tail.losses[i] - expected[i]) <= 1e-5 * expected[i]);
    }
  }
}

TEST_CASE("model-only resume with lr = 0 keeps the weights bit-identical (full offload, bf16 and fp32)") {
  for (bool bf16 : {false, true}) {
    CAPTURE(bf16);
    auto dir = temp_dir("model-only");
    auto cfg = small_config(Offload::full, dir, OptimizerConfig{adamw_no_clip()});
    cfg.max_steps = 3;
    cfg.ckpt = CheckpointConfig{};
    auto opts = quiet();
    opts.bf16 = bf16;
    auto first = run_sft(cfg, opts);  // writes step_3
    auto rc = cfg;
    rc.max_steps = 6;
    rc.ckpt->skip_optimizer = true;
    rc.ckpt->output_dir = dir / "checkpoints";
    rc.output_dir = temp_dir("model-only-2");
    auto a = adamw_no_clip();
    a.lr = 0.0;
    rc.optim = a;
    rc.resume = ResumeConfig{3};
    auto second = run_sft(rc, opts);
    REQUIRE(second.losses.size() == 3);
    CHECK(bit_identical(first.model_weights, second.model_weights));
  }
}

TEST_CASE("an HF-style directory (config.json + safetensors) loads exactly") {
  auto dir = temp_dir("hf");
  // Train briefly, which leaves a checkpoint that is also an HF directory.
  auto cfg = small_config(Offload::none, dir, OptimizerConfig{adamw_no_clip()});
  cfg.max_steps = 2;
  cfg.ckpt = CheckpointConfig{};
  auto trained = run_sft(cfg, quiet());
  auto hf = dir / "checkpoints" / "step_2";
  REQUIRE(fs::exists(hf / "config.json"));
  // Split the weights over two shard files, as HF does for big models.
  {
    auto f = train::safetensors::file::open(hf / "model.safetensors");
    std::vector<train::safetensors::entry> a, b;
    for (const auto& t : f.tensors())
      (t.name.find("layers.1.") == std::string::npos ? a : b)
          .push_back({t.name, t.type, t.shape, t.data, t.nbytes});
    auto shard = temp_dir("hf-sharded");
    train::safetensors::write(shard / "model-00001-of-00002.safetensors", a);
    train::safetensors::write(shard / "model-00002-of-00002.safetensors", b);
    fs::copy_file(hf / "config.json", shard / "config.json");
    // The index HF writes beside shards names the file of every tensor.
    std::string map;
    for (const auto& t : f.tensors())
      map += fmt::format("{}\"{}\": \"model-0000{}-of-00002.safetensors\"", map.empty() ? "" : ", ", t.name,
                         t.name.find("layers.1.") == std::string::npos ? 1 : 2);
    std::ofstream(shard / "model.safetensors.index.json")
        << "{\"metadata\": {}, \"weight_map\": {" << map << "}}";
    // A safetensors file the index does not name is not weights (a checkpoint's optimizer state).
    fs::copy_file(hf / "optimizer.safetensors", shard / "optimizer.safetensors");
    hf = shard;
  }
  auto load = small_config(Offload::none, temp_dir("hf-out"), OptimizerConfig{adamw_no_clip()});
  load.model.name = hf.string();
  load.max_steps = 1;
  auto a = adamw_no_clip();
  a.lr = 0.0;
  load.optim = a;
  auto loaded = run_sft(load, quiet());
  CHECK(bit_identical(trained.model_weights, loaded.model_weights));
  // A directory whose weights do not fit the config fails with the weight's name.
  std::ofstream(hf / "config.json") << R"({"model_type": "qwen3", "vocab_size": 260, "hidden_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "intermediate_size": 384, "tie_word_embeddings": true})";
  load.clean = true;
  CHECK_THROWS_WITH(run_sft(load, quiet()), doctest::Contains("model.embed_tokens.weight"));
}

// model.quantization where there is no FP8 GEMM: an error that says why, before any step.
TEST_CASE("training: model.quantization on the CPU is an error naming it and what it needs") {
  auto cfg = small_config(Offload::none, temp_dir("fp8-cpu"), OptimizerConfig{adamw_no_clip()});
  cfg.model.quantization = QuantizationConfig{};
  CHECK_THROWS_WITH(run_sft(cfg, quiet()),
                    doctest::Contains("model.quantization: the device is cpu: FP8 training needs an NVIDIA "
                                      "Hopper GPU (compute capability 9.x"));
}

// Qwen3-MoE (primecfg/tiny-moe: 8 experts, top-2, the second block dense): the three
// strategies train it with the same numbers, for the reasons the equivalence case above
// gives, every expert included; a checkpoint resumes in another mode.
TEST_CASE("Qwen3-MoE: the three strategies give the same losses and weights, and resume across modes") {
  auto o = OptimizerConfig{adamw_no_clip()};
  auto moe = [&](Offload mode, const char* dir) {
    auto c = small_config(mode, temp_dir(dir), o);
    c.model.name = "primecfg/tiny-moe";
    return c;
  };
  auto none = run_sft(moe(Offload::none, "moe-none"), quiet());
  auto optim = run_sft(moe(Offload::optimizer, "moe-opt"), quiet());
  RunResult full_token_walk;
  {
    train::TestSeams seams({.vocabulary_loss = false});
    full_token_walk = run_sft(moe(Offload::full, "moe-full-tokens"), quiet());
  }
  auto full = run_sft(moe(Offload::full, "moe-full"), quiet());
  REQUIRE(none.losses.size() == 20);
  CHECK(none.losses.back() < none.losses.front() - 0.5);
  CHECK(none.losses == optim.losses);
  CHECK(bit_identical(none.weights, optim.weights));
  const Diff same_walk = compare(full_token_walk, none);
  MESSAGE("MoE full (token walk) vs none: loss " << same_walk.loss_rel << ", weights "
                                                 << same_walk.weight_abs);
  CHECK(same_walk.loss_rel < 1e-5);
  CHECK(same_walk.weight_abs < 2e-5);
  CHECK(compare(full, none).loss_rel < 1e-5);
  // The experts are parameters like any other: every one of them trained, in every mode.
  std::size_t experts = 0;
  for (const auto& [name, w] : none.model_weights)
    if (name.find(".mlp.experts.") != std::string::npos) ++experts;
  CHECK(experts == 8 * 3);  // block 0 routes, block 1 is dense

  // Resume: 10 steps in none, the rest in full.
  auto dir = temp_dir("moe-resume");
  auto cfg = moe(Offload::none, "moe-resume");
  cfg.output_dir = dir;
  cfg.ckpt = CheckpointConfig{};
  cfg.ckpt->interval = 10;
  auto whole = run_sft(cfg, quiet());
  auto rc = cfg;
  rc.model.offload = Offload::full;
  rc.output_dir = temp_dir("moe-resume-out");
  rc.ckpt->output_dir = dir / "checkpoints";
  rc.ckpt->interval = std::nullopt;
  rc.resume = ResumeConfig{10};
  auto tail = run_sft(rc, quiet());
  REQUIRE(tail.losses.size() == 10);
  for (std::size_t i = 0; i < 10; ++i)
    CHECK(std::fabs(tail.losses[i] - whole.losses[10 + i]) <= 1e-5 * whole.losses[10 + i]);
}

// Selective checkpointing of the routed experts (ac.mode = "selective", targets =
// ["routed_experts"]): the backward runs the experts again on the rows it gathers anew,
// so the gradients are those of the forward that ran; on the CPU the recompute is the
// same arithmetic, so the losses and weights are those of a run without checkpointing
// to the bit, in `none` and in `full`, and the router counts each token once.
TEST_CASE("Qwen3-MoE: selective checkpointing of routed_experts trains as without checkpointing") {
  auto moe = [&](Offload mode, const char* dir, bool selective) {
    auto c = small_config(mode, temp_dir(dir), OptimizerConfig{adamw_no_clip()});
    c.model.name = "primecfg/tiny-moe";
    c.model.ac_offloading = std::nullopt;
    c.model.ac = std::nullopt;
    if (selective) {
      c.model.ac = ActivationCheckpointConfig{};
      c.model.ac->mode = AcMode::selective;
      c.model.ac->targets = {"routed_experts"};
    }
    return c;
  };
  auto tokens = [](const SFTConfig& c) {
    std::ifstream in(c.output_dir / "metrics.jsonl");
    std::string line, last;
    while (std::getline(in, line)) last = line;
    return train::strict_json::parse(last).at("tokens_per_expert").dump();
  };
  for (Offload mode : {Offload::none, Offload::full}) {
    const auto plain_cfg = moe(mode, "moe-no-ac", false), sel_cfg = moe(mode, "moe-selective", true);
    auto plain = run_sft(plain_cfg, quiet());
    auto selective = run_sft(sel_cfg, quiet());
    REQUIRE(plain.losses.size() == 20);
    CHECK(plain.losses == selective.losses);
    CHECK(bit_identical(plain.weights, selective.weights));
    CHECK(tokens(plain_cfg) == tokens(sel_cfg));
  }
}

// model.freeze_moe_router (prime-rl's freeze_moe_router): each routed block's router
// (mlp.gate.weight) keeps the weights it started with, in every mode, while everything else
// trains; the modes agree as they do without it (none == optimizer to the bit).
TEST_CASE("Qwen3-MoE: freeze_moe_router keeps the routers as loaded in every mode") {
  auto moe = [&](Offload mode, const char* dir, bool freeze, std::int64_t steps) {
    auto c = small_config(mode, temp_dir(dir), OptimizerConfig{adamw_no_clip()});
    c.model.name = "primecfg/tiny-moe";
    c.model.freeze_moe_router = freeze;
    c.max_steps = steps;
    return c;
  };
  const auto start = run_sft(moe(Offload::none, "moe-start", false, 0), quiet()).model_weights;
  auto weights_of = [](const RunResult& r, const std::string& name) {
    for (const auto& [n, w] : r.model_weights)
      if (n == name) return w;
    FAIL("no weight " << name);
    return std::vector<float>{};
  };
  const std::string router = "model.layers.0.mlp.gate.weight",
                    expert = "model.layers.0.mlp.experts.3.up_proj.weight";
  std::vector<float> router0, expert0;
  for (const auto& [n, w] : start) {
    if (n == router) router0 = w;
    if (n == expert) expert0 = w;
  }
  REQUIRE(!router0.empty());
  // Without the setting the router trains (so the checks below can fail).
  CHECK(weights_of(run_sft(moe(Offload::none, "moe-free", false, 5), quiet()), router) != router0);
  std::vector<RunResult> runs;
  for (Offload mode : {Offload::none, Offload::optimizer, Offload::full}) {
    runs.push_back(run_sft(moe(mode, "moe-frozen", true, 5), quiet()));
    INFO("offload " << static_cast<int>(mode));
    CHECK(weights_of(runs.back(), router) == router0);
    CHECK(weights_of(runs.back(), expert) != expert0);
  }
  CHECK(runs[0].losses == runs[1].losses);
  CHECK(bit_identical(runs[0].weights, runs[1].weights));
  CHECK(compare(runs[2], runs[0]).loss_rel < 1e-5);
}

// The load-balance figures in metrics.jsonl are prime-rl's (get_load_balance_stats), and
// model.debug.force_balanced_routing is honoured in the recomputed blocks of activation
// checkpointing as in the forward (a recompute that routed otherwise would backpropagate
// through another function than the one that ran).
TEST_CASE(
    "Qwen3-MoE: prime-rl's max_vio and routing confidence, force_balanced_routing under checkpointing") {
  auto moe = [&](const char* dir, bool ac, bool balanced) {
    auto c = small_config(Offload::none, temp_dir(dir), OptimizerConfig{adamw_no_clip()});
    c.model.name = "primecfg/tiny-moe";
    c.max_steps = 3;
    std::get<SFTDataConfig>(c.data).micro_batch_size = 4;  // one micro-batch: the step's figures are its own
    if (!ac) c.model.ac = std::nullopt, c.model.ac_offloading = std::nullopt;
    if (balanced) c.model.debug = ModelDebugConfig{}, c.model.debug->force_balanced_routing = true;
    return c;
  };
  auto last_metrics = [](const SFTConfig& c) {
    std::ifstream in(c.output_dir / "metrics.jsonl");
    std::string line, last;
    while (std::getline(in, line)) last = line;
    return train::strict_json::parse(last);
  };
  const auto routed = moe("moe-figures", false, false);
  run_sft(routed, quiet());
  const auto m = last_metrics(routed);
  // One routed block (block 1 is dense), 4 rows of 48 tokens, top-2: 384 slots.
  std::vector<double> counts;
  for (const auto& v : m.at("tokens_per_expert")) counts.push_back(v.get<double>());
  REQUIRE(counts.size() == 8);
  double total = 0;
  for (double v : counts) total += v;
  CHECK(total == 4 * 48 * 2);
  // max_vio by hand: the two most loaded left out, the largest of the rest over their mean, less 1.
  std::sort(counts.rbegin(), counts.rend());
  const double mean = (total - counts[0] - counts[1]) / 6;
  CHECK(m.at("max_vio").get<double>() == doctest::Approx((counts[2] - mean) / mean).epsilon(1e-5));
  // The top-2 probability mass before renormalisation (after it, every token's would be 1).
  CHECK(m.at("routing_confidence").get<double>() < 1.0);

  // One token a micro-batch: no slot beyond the top 2, so prime-rl's max_vio is 0 / 0, NaN
  // (null in JSON), not 0, which would mean perfectly balanced.
  auto one_token = moe("moe-one-token", false, false);
  std::get<SFTDataConfig>(one_token.data).seq_len = 1;
  std::get<SFTDataConfig>(one_token.data).micro_batch_size = 1;
  std::get<SFTDataConfig>(one_token.data).batch_size = 1;
  run_sft(one_token, quiet());
  CHECK(last_metrics(one_token).at("max_vio").is_null());

  // Balanced: every expert gets 48 slots, max_vio 0; with checkpointing, the same numbers.
  const auto balanced = moe("moe-balanced", false, true);
  auto plain = run_sft(balanced, quiet());
  const auto b = last_metrics(balanced);
  for (const auto& v : b.at("tokens_per_expert")) CHECK(v.get<double>() == 48);
  CHECK(b.at("max_vio").get<double>() == 0);
  auto checkpointed = run_sft(moe("moe-balanced-ac", true, true), quiet());
  CHECK(plain.losses == checkpointed.losses);
  CHECK(bit_identical(plain.weights, checkpointed.weights));
}
