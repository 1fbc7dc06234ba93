// The offload strategies on a CUDA device: the copy streams, staging rings, CPU
// worker and moment window must give the same training as NoOffload. Skips (and
// passes) where LibTorch has no usable CUDA device.
//
// Tolerances: FP32 compute (so that differences come from the update alone), 6
// AdamW steps with lr = 2e-3. OptimizerOffload runs the same fused GPU AdamW on
// moments that went through host memory: 1e-6 absolute on weights. FullOffload runs
// the CPU kernel (different evaluation order, ~1 ulp per step) and GPU kernels
// (reductions in atomics) may order sums differently from run to run: 1e-4 absolute
// on weights, 1e-4 relative on the loss, which is still 20x below one update (lr):
// a skipped, repeated or stale update, or a weight uploaded too late, is caught.
// Its weights are compared with its loss walking token chunks as NoOffload's does
// (test seam): the vocabulary walk rounds gradients differently, which Adam's first
// update magnifies by up to lr/eps where a gradient is about 0 (tests/trainer/
// test_training.cpp derives it); the walk as run is held on the losses.
#include "base/device_graph.hpp"
#include "test_seams.hpp"
#include "trainer.hpp"

#include <doctest/doctest.h>
#include <torch/cuda.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

namespace fs = std::filesystem;
using namespace primecfg;

namespace {

fs::path out_dir(const std::string& name) {
  return fs::temp_directory_path() / ("primecfg-gpu-test-" + std::to_string(::getpid())) / name;
}

SFTConfig config(Offload mode, const std::string& name, OptimizerConfig optim, int micro) {
  SFTConfig c;
  c.model.name = "primecfg/tiny";
  c.model.offload = mode;
  c.model.compile = std::nullopt;
  SFTDataConfig d;
  d.seq_len = 64;
  d.batch_size = 4;
  d.micro_batch_size = micro;
  d.seed = 11;
  c.data = d;
  c.optim = optim;
  c.max_steps = 6;
  c.output_dir = out_dir(name);
  c.clean = true;  // the cases reuse one folder per mode
  return c;
}

train::RunOptions gpu(bool bf16) {
  train::RunOptions o;
  o.print = false;
  o.collect_weights = true;
  o.device = "cuda";
  o.bf16 = bf16;
  return o;
}

struct Diff {
  double loss_rel = 0, weight_abs = 0;
};

Diff compare(const train::RunResult& a, const train::RunResult& b) {
  Diff d;
  REQUIRE(a.losses.size() == b.losses.size());
  for (std::size_t i = 0; i < a.losses.size(); ++i)
    d.loss_rel = std::max(d.loss_rel, std::fabs(a.losses[i] - b.losses[i]) / std::fabs(b.losses[i]));
  REQUIRE(a.weights.size() == b.weights.size());
  for (std::size_t i = 0; i < a.weights.size(); ++i)
    for (std::size_t k = 0; k < a.weights[i].second.size(); ++k)
      d.weight_abs = std::max(
          d.weight_abs, static_cast<double>(std::fabs(a.weights[i].second[k] - b.weights[i].second[k])));
  return d;
}

bool have_cuda() {
  if (torch::cuda::is_available()) return true;
  MESSAGE("no CUDA device: GPU tests skipped");
  return false;
}

}  // namespace

TEST_CASE(
    "GPU: the three strategies agree (FP32 compute; AdamW and SignSGD; one and two micro-batches; "
    "clipping)") {
  if (!have_cuda()) return;
  AdamWConfig a;
  a.lr = 2e-3;
  a.weight_decay = 0.01;
  a.max_norm = std::nullopt;
  SignSGDConfig s;
  s.lr = 1e-3;
  s.weight_decay = 0.01;
  s.max_norm = std::nullopt;
  for (int k = 0; k < 3; ++k) {
    OptimizerConfig o = k == 1 ? OptimizerConfig{s} : OptimizerConfig{a};
    const int micro = k == 2 ? 2 : 4;
    CAPTURE(k);
    auto none = train::run_sft(config(Offload::none, "none", o, micro), gpu(false));
    auto opt = train::run_sft(config(Offload::optimizer, "opt", o, micro), gpu(false));
    // Half the moment window's write-backs held for the next forward (offload.deferred_share).
    auto deferring = gpu(false);
    deferring.offload.deferred_share = 0.5;
    auto opt_deferred = train::run_sft(config(Offload::optimizer, "opt-deferred", o, micro), deferring);
    auto full = train::run_sft(config(Offload::full, "full", o, micro), gpu(false));
    train::RunResult full_token_walk;
    {
      train::TestSeams seams({.vocabulary_loss = false});
      full_token_walk = train::run_sft(config(Offload::full, "full-tokens", o, micro), gpu(false));
    }
    CHECK(none.losses.back() < none.losses.front());
    Diff d1 = compare(opt, none), d2 = compare(full_token_walk, none), d3 = compare(full, none);
    MESSAGE("optimizer vs none: loss " << d1.loss_rel << ", weights " << d1.weight_abs
                                       << "; full (token walk) vs none: loss " << d2.loss_rel << ", weights "
                                       << d2.weight_abs << "; full (as run) vs none: loss " << d3.loss_rel);
    CHECK(d1.weight_abs < 1e-6);
    CHECK(d1.loss_rel < 1e-6);
    const Diff dd = compare(opt_deferred, none);
    MESSAGE("optimizer with deferred write-backs vs none: loss " << dd.loss_rel << ", weights "
                                                                 << dd.weight_abs);
    CHECK(dd.weight_abs < 1e-6);
    CHECK(dd.loss_rel < 1e-6);
    CHECK(d2.weight_abs < 1e-4);
    CHECK(d2.loss_rel < 1e-4);
    CHECK(d3.loss_rel < 1e-4);
  }
  // With clipping, OptimizerOffload updates after backward (the norm must be known).
  a.max_norm = 0.05;
  auto none = train::run_sft(config(Offload::none, "clip-none", a, 2), gpu(false));
  auto tight = gpu(false);
  tight.offload.ring_mib = 1e-6;  // one byte, clamped up to the largest tensor
  auto opt = train::run_sft(config(Offload::optimizer, "clip-opt", a, 2), tight);
  Diff d = compare(opt, none);
  MESSAGE("clipped: optimizer vs none: loss " << d.loss_rel << ", weights " << d.weight_abs);
  CHECK(d.weight_abs < 1e-6);
  CHECK(d.loss_rel < 1e-6);
}

TEST_CASE("GPU: bf16 full offload with staging rings that hold one tensor learns like NoOffload") {
  if (!have_cuda()) return;
  AdamWConfig a;
  a.lr = 2e-3;
  a.max_norm = std::nullopt;
  auto none = train::run_sft(config(Offload::none, "bf16-none", a, 4), gpu(true));
  auto tight = gpu(true);
  tight.offload.ring_mib = 1e-6;  // one byte, clamped up to the largest tensor
  auto full = train::run_sft(config(Offload::full, "bf16-full", a, 4), tight);
  auto opt = train::run_sft(config(Offload::optimizer, "bf16-opt", a, 4), tight);
  Diff d1 = compare(full, none), d2 = compare(opt, none);
  MESSAGE("bf16 full vs none: loss " << d1.loss_rel << ", masters " << d1.weight_abs
                                     << "; optimizer vs none: loss " << d2.loss_rel << ", masters "
                                     << d2.weight_abs);
  // bf16 forward weights round each update differently: loose, but far below a lost step.
  CHECK(d1.loss_rel < 2e-2);
  CHECK(d2.loss_rel < 1e-6);
  CHECK(full.losses.back() < full.losses.front());
}

// offload = "none" on the fused AdamW (kernels.adamw, the default) against ATen's update
// (--no-kernels.adamw), bf16: with one micro-batch a step the update reads autograd's
// bf16 gradients (no FP32 accumulator), with two it sums them in FP32 accumulators made
// for it. Without clipping the arithmetic is the same, bit for bit (measured on the
// H200): a gradient handed over late, twice or not at all, or a stale weight, shows.
// With clipping the factor comes from norms summed in another order (1e-7 apart), which
// flips some bf16 weight roundings and then, where a gradient is about 0, Adam's update
// (up to lr): the check there is looser, the arithmetic itself is held to 1e-7 in
// test_adamw_gpu.cpp.
TEST_CASE(
    "GPU: offload = none on the fused AdamW trains as on ATen's update (bf16; 1 and 2 micro-batches; "
    "clipping)") {
  if (!have_cuda()) return;
  AdamWConfig a;
  a.lr = 2e-3;
  a.weight_decay = 0.01;
  for (int k = 0; k < 3; ++k) {
    CAPTURE(k);
    a.max_norm = k == 2 ? std::optional<double>(0.05) : std::nullopt;
    const int micro = k == 1 ? 2 : 4;
    auto aten_opts = gpu(true);
    aten_opts.kernels.adamw = false;
    auto fused = train::run_sft(config(Offload::none, "adamw-fused", a, micro), gpu(true));
    auto aten = train::run_sft(config(Offload::none, "adamw-aten", a, micro), aten_opts);
    Diff d = compare(fused, aten);
    MESSAGE("fused AdamW vs ATen's: loss " << d.loss_rel << ", masters " << d.weight_abs);
    if (a.max_norm) {
      CHECK(d.loss_rel < 1e-4);
      CHECK(d.weight_abs < 2.5 * a.lr);
    } else {
      CHECK(d.loss_rel == 0);
      CHECK(d.weight_abs == 0);
    }
    CHECK(fused.losses.back() < fused.losses.front());
  }
}

// offload = "none" with its forward and backward replayed from one CUDA graph (captured
// at the third step; --cuda-graph) against the same run eager, on random inputs: bit for
// bit. Inputs not copied into the captured tensors, gradients the update did not take
// from the replay, or a weight the graph read stale, show.
TEST_CASE("GPU: the forward and backward replayed from a CUDA graph train as eagerly (bf16; checkpointing)") {
  if (!have_cuda()) return;
  AdamWConfig a;
  a.lr = 2e-3;
  a.max_norm = std::nullopt;
  for (bool ac : {false, true}) {
    CAPTURE(ac);
    auto cfg = [&](const std::string& name) {
      SFTConfig c = config(Offload::none, name, a, 1);
      FakeDataConfig d;
      d.seq_len = 64;
      d.batch_size = 1;
      d.micro_batch_size = 1;
      d.input_ids = FakeInputIds::random;
      d.seed = 3;
      c.data = d;
      c.model.ac =
          ac ? std::optional<ActivationCheckpointConfig>(ActivationCheckpointConfig{}) : std::nullopt;
      c.model.ac_offloading = std::nullopt;  // its copies are waited for on the host: eager
      return c;
    };
    auto graph_opts = gpu(true), eager_opts = gpu(true);
    graph_opts.cuda_graph = true;
    eager_opts.cuda_graph = false;
    const auto graphed = train::run_sft(cfg("graph"), graph_opts);
    const auto eager = train::run_sft(cfg("eager"), eager_opts);
    const Diff d = compare(graphed, eager);
    MESSAGE("graph vs eager: loss " << d.loss_rel << ", masters " << d.weight_abs);
    CHECK(d.loss_rel == 0);
    CHECK(d.weight_abs == 0);
    // Steps 3 to 6 were replays (the metrics say so).
    std::ifstream metrics(out_dir("graph") / "metrics.jsonl");
    int replays = 0;
    for (std::string line; std::getline(metrics, line);)
      replays += line.find("\"cuda_graph_replayed\":1") != std::string::npos;
    CHECK(replays == 4);
  }
  // One document a row, whole rows (a row with padding has a mask), each step's loss tokens
  // set by its record's loss mask: the same count for the warm-up, the capture and the next
  // step, then another, then the captured count again. The loss's 1 / tokens is a constant
  // of the captured kernels, so the step with the other count runs eagerly (a replay would
  // scale its loss and gradients by the captured count): the same numbers as without the
  // graph, with the other steps from the capture on replayed.
  {
    const fs::path records = out_dir("graph-records") / "records.jsonl";
    fs::create_directories(records.parent_path());
    {
      std::ofstream f(records);
      for (const int prompt : {5, 5, 5, 5, 9, 5}) {  // tokens without loss at each row's start
        std::string ids, mask;
        for (int i = 0; i < 70; ++i) {
          ids += (i ? "," : "") + std::to_string((i * 37 + prompt) % 256);
          mask += (i ? "," : "") + std::string(i < prompt ? "0" : "1");
        }
        f << "{\"input_ids\": [" << ids << "], \"loss_mask\": [" << mask << "]}\n";
      }
    }
    auto rows = [&](const std::string& name) {
      SFTConfig c = config(Offload::none, name, a, 1);
      auto& d = std::get<SFTDataConfig>(c.data);
      d.path = records;
      d.pack = false;
      d.shuffle = false;
      d.batch_size = 1;
      c.model.ac_offloading = std::nullopt;  // which alone keeps the graph off
      return c;
    };
    auto graph_opts = gpu(true), eager_opts = gpu(true);
    graph_opts.cuda_graph = std::nullopt;  // where it applies
    eager_opts.cuda_graph = false;
    const auto graphed = train::run_sft(rows("graph-rows"), graph_opts);
    const auto eager = train::run_sft(rows("eager-rows"), eager_opts);
    const Diff d = compare(graphed, eager);
    MESSAGE("rows of other loss-token counts, graph where it applies vs eager: loss "
            << d.loss_rel << ", masters " << d.weight_abs);
    CHECK(d.loss_rel == 0);
    CHECK(d.weight_abs == 0);
    std::ifstream metrics(out_dir("graph-rows") / "metrics.jsonl");
    std::vector<int> replayed;
    for (std::string line; std::getline(metrics, line);)
      replayed.push_back(line.find("\"cuda_graph_replayed\":1") != std::string::npos);
    CHECK(replayed == std::vector<int>{0, 0, 1, 1, 0, 1});
    // Asked for outright, the step it cannot replay is an error that says why.
    graph_opts.cuda_graph = true;
    CHECK_THROWS_WITH_AS(train::run_sft(rows("graph-rows"), graph_opts), doctest::Contains("loss tokens"),
                         train::run_error);
  }
  // Where it does not apply, asking for it is an error that says why.
  auto o = gpu(true);
  o.cuda_graph = true;
  CHECK_THROWS_WITH_AS(train::run_sft(config(Offload::optimizer, "graph-optimizer", a, 4), o),
                       doctest::Contains("cuda_graph = true"), train::run_error);
}

// A capture the run was not asked for that runs out of memory lets the run go on eagerly;
// any other failure of a capture stays an error (trainer.cpp, from_graph). Which is which
// is read from the error, on any device.
TEST_CASE("A capture that ran out of device memory is told apart from work a graph cannot hold") {
  using train::dev::DeviceGraph;
  const c10::OutOfMemoryError oom(
      {__func__, __FILE__, __LINE__},
      "CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity "
      "of 79.18 GiB of which 2.19 MiB is free.");
  CHECK(DeviceGraph::out_of_memory(oom));
  // Passed on by autograd's engine as another type, with the allocator's words.
  CHECK(DeviceGraph::out_of_memory(std::runtime_error(oom.what())));
  CHECK_FALSE(DeviceGraph::out_of_memory(
      c10::Error({__func__, __FILE__, __LINE__}, "operation not permitted when stream is capturing")));
  CHECK_FALSE(DeviceGraph::out_of_memory(std::runtime_error("host memory exhausted")));
}

// Activation offloading: the block inputs go to pinned host memory on one copy stream
// and come back on another, ordered by events only. An input used before it arrived,
// or released while its copy still read it, gives other numbers; the same run without
// offloading is the reference, in every mode, FP32 and bf16. Six blocks (the tiny
// preset has two), so that windows of one and two blocks leave inputs to move.
namespace {

// `c` on a six-block model (random weights) with checkpointing, and with activation
// offloading when a window is given.
SFTConfig on_six_blocks(SFTConfig c, std::optional<std::int64_t> window) {
  const fs::path model_dir = out_dir("six-blocks");
  fs::create_directories(model_dir);
  std::ofstream(model_dir / "config.json") << R"({"model_type": "qwen3", "vocab_size": 260, "hidden_size": 64,
    "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "intermediate_size": 96, "tie_word_embeddings": true})";
  c.model.name = model_dir.string();
  c.model.debug = ModelDebugConfig{.random_init = true};
  c.model.ac = ActivationCheckpointConfig{};
  c.model.ac_offloading = std::nullopt;
  if (window) c.model.ac_offloading = ActivationOffloadConfig{.max_inflight_activations = *window};
  return c;
}

}  // namespace

TEST_CASE("GPU: activation offloading trains as checkpointing alone does, in every offload mode") {
  if (!have_cuda()) return;
  AdamWConfig a;
  a.lr = 2e-3;
  a.max_norm = std::nullopt;
  for (bool bf16 : {false, true})
    for (Offload mode : offload_modes) {
      CAPTURE(bf16);
      CAPTURE(mode);
      auto cfg = [&](const std::string& name, std::optional<std::int64_t> window) {
        return on_six_blocks(config(mode, name, a, 2), window);
      };
      auto alone = train::run_sft(cfg("ac-alone", std::nullopt), gpu(bf16));
      for (std::int64_t window : {1, 2}) {
        CAPTURE(window);
        auto offloaded = train::run_sft(cfg("ac-offloaded", window), gpu(bf16));
        Diff d = compare(offloaded, alone);
        MESSAGE("offloaded vs alone: loss " << d.loss_rel << ", weights " << d.weight_abs);
        // GPU reductions may order sums differently from run to run (see the top).
        CHECK(d.loss_rel < (bf16 ? 1e-3 : 1e-5));
        CHECK(d.weight_abs < (bf16 ? 1e-3 : 1e-5));
        std::ifstream metrics(cfg("ac-offloaded", window).output_dir / "metrics.jsonl");
        std::string line, last;
        while (std::getline(metrics, line)) last = line;
        CHECK(last.find("\"ac_offload_to_host_gib\":0,") == std::string::npos);
        CHECK(last.find("\"ac_offload_to_host_gib\"") != std::string::npos);
      }
    }
}

// A launcher's one rank goes through the process group: on CUDA that is NCCL, and the
// sharded step runs over one member (the pieces at rest, the blocks gathered and freed
// around their use, the checkpoint's weights gathered one at a time, the start's
// broadcast and the checkpoint's rounds over the store). A sum or a gather over one
// member is the member's own, so those are copies or nothing there, never NCCL calls
// (ProcessGroup); the NCCL collectives themselves need two GPUs. The result must be one
// process's.
//
// Each variant runs in a process of its own, as a real run does (one process group per
// process: a second ProcessGroupNCCL in the same process crashed in LibTorch 2.13
// after the first was shut down), spawned from the last test case below (doctest
// filters split at commas: the names have none).
namespace {

// `offloaded`: six blocks with activation offloading (a window of one), against one
// process with the same.
void one_nccl_rank(Offload mode, int micro, bool clip, bool offloaded) {
  AdamWConfig a;
  a.lr = 2e-3;
  a.max_norm = clip ? std::optional<double>(0.05) : std::nullopt;
  SFTConfig plain_cfg = config(mode, "nccl-plain", a, micro);
  SFTConfig ranked_cfg = config(mode, "nccl-ranked", a, micro);
  if (offloaded) {
    plain_cfg = on_six_blocks(plain_cfg, 1);
    ranked_cfg = on_six_blocks(ranked_cfg, 1);
  }
  ranked_cfg.ckpt = CheckpointConfig{};
  ranked_cfg.ckpt->interval = 3;
  auto plain = train::run_sft(plain_cfg, gpu(false));
  auto o = gpu(false);
  o.launch.launched = true;
  o.launch.master_port = 0;  // one rank: the store listens on a port the kernel picks
  auto ranked = train::run_sft(ranked_cfg, o);
  Diff d = compare(ranked, plain);
  MESSAGE("one NCCL rank vs one process: loss " << d.loss_rel << ", weights " << d.weight_abs);
  CHECK(d.weight_abs < (mode == Offload::full ? 1e-4 : 1e-6));
  CHECK(d.loss_rel < (mode == Offload::full ? 1e-4 : 1e-6));
  CHECK(fs::exists(ranked_cfg.output_dir / "checkpoints" / "step_6" / "manifest.json"));
  if (offloaded) {  // the rank did move block inputs
    std::ifstream metrics(ranked_cfg.output_dir / "metrics.jsonl");
    std::string line, last;
    while (std::getline(metrics, line)) last = line;
    CHECK(last.find("\"ac_offload_to_host_gib\":") != std::string::npos);
    CHECK(last.find("\"ac_offload_to_host_gib\":0,") == std::string::npos);
  }
}

}  // namespace

#define NCCL_VARIANT(NAME, MODE, MICRO, CLIP, OFFLOADED)          \
  TEST_CASE("GPU NCCL rank: " NAME* doctest::skip()) {            \
    if (have_cuda()) one_nccl_rank(MODE, MICRO, CLIP, OFFLOADED); \
  }
NCCL_VARIANT("none - one micro-batch", Offload::none, 4, false, false)
NCCL_VARIANT("none - two micro-batches - clipping", Offload::none, 2, true, false)
NCCL_VARIANT("optimizer - one micro-batch - updates in the hooks", Offload::optimizer, 4, false, false)
NCCL_VARIANT("optimizer - two micro-batches - clipping", Offload::optimizer, 2, true, false)
NCCL_VARIANT("full - one micro-batch", Offload::full, 4, false, false)
NCCL_VARIANT("full - two micro-batches", Offload::full, 2, false, false)
NCCL_VARIANT("optimizer - six blocks - activation offloading", Offload::optimizer, 2, false, true)
NCCL_VARIANT("full - six blocks - activation offloading", Offload::full, 2, false, true)

TEST_CASE("GPU: one rank through NCCL trains as one process does, in every offload mode") {
  // Without CUDA the children skip: the spawning is still checked.
  const fs::path self = fs::read_symlink("/proc/self/exe");
  const char* variants[] = {"none - one micro-batch",
                            "none - two micro-batches - clipping",
                            "optimizer - one micro-batch - updates in the hooks",
                            "optimizer - two micro-batches - clipping",
                            "full - one micro-batch",
                            "full - two micro-batches",
                            "optimizer - six blocks - activation offloading",
                            "full - six blocks - activation offloading"};
  for (const char* v : variants) {
    CAPTURE(v);
    const std::string cmd = "'" + self.string() + "' --no-skip '-tc=GPU NCCL rank: " + v + "' >" +
                            (out_dir("nccl-log").string() + ".txt") + " 2>&1";
    fs::create_directories(out_dir(""));
    const int rc = std::system(cmd.c_str());
    std::ifstream log(out_dir("nccl-log").string() + ".txt");
    std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    MESSAGE(text.substr(text.find("MESSAGE") == std::string::npos ? 0 : text.find("MESSAGE")).substr(0, 400));
    CHECK(rc == 0);
    CHECK(text.find("test cases: 1 | 1 passed") != std::string::npos);  // the filter found it
  }
}
