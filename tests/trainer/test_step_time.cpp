// The planner's step-time model (planner/step_time.cpp) on a fixed machine profile:
// its arithmetic by hand, each mode's overlaps, the profile's reader, and
// --calibrate on the CPU writing a profile that --plan reads back.
#include "base/remove_tree.hpp"
#include "calibrate.hpp"
#include "hand_shape.hpp"
#include "offload/full/step_replay.hpp"
#include "offload/optimizer/step_replay.hpp"
#include "options.hpp"
#include "planner/planner.hpp"
#include "planner/profile.hpp"
#include "planner/step_time.hpp"
#include "unfused_assumptions.hpp"

#include <primecfg/cli.hpp>
#include <primecfg/report.hpp>

#include <nlohmann/json.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>

namespace fs = std::filesystem;
using namespace primecfg;
namespace plan = primecfg::train::plan;

namespace {

// Causal attention FLOPs of one block's forward at 1024 tokens: 2 x 1024^2 x 2 x 4.
constexpr double kAttnFlops = 2.0 * 1024 * 1024 * 2 * 4;

// The block measured at 1024 tokens: forward 10 ms (2 ms of it attention), backward
// 20 ms (5 ms attention); the head 3 ms and 6 ms. PCIe and the CPU as the test sets.
constexpr const char* kProfile = R"(
[provenance]
device = "test GPU"
machine = "test host"
measured_at = "2026-12-03"
commit = "test"
torch = "test"
command = "by hand"

[gpu]
peak_tflops = 1.0
memory_gbs = 1000.0
adamw_params_per_s = 1e6

[[gpu.blocks]]
hidden = 8
intermediate = 16
heads = 2
kv_heads = 1
head_dim = 4
qk_norm = true
tokens = 1024
forward_s = 0.010
backward_s = 0.020

[[gpu.heads]]
hidden = 8
vocab = 16
tied = true
tokens = 1024
forward_s = 0.003
backward_s = 0.006

[[gpu.attention]]
seq_len = 1024
head_dim = 4
forward_tflops = 0.008388608
backward_tflops = 0.008388608

[link]
h2d_gbs = 1e-6
d2h_gbs = 1e-6
h2d_both_gbs = 1e-6
d2h_both_gbs = 1e-6

[host]
cores = 4
threads = 3
memory_gbs = 10.0
adamw_params_per_s = 1e6
adamw_busy_params_per_s = 1e6
sign_sgd_params_per_s = 2e6
sign_sgd_busy_params_per_s = 2e6

[collectives]
intra_node_gbs = 100.0
inter_node_gbs = 10.0
source = "test"
)";

SFTConfig config(std::int64_t seq_len, const std::vector<std::string>& more = {}) {
  std::vector<std::string> args = {"--model.name=Qwen/Qwen3-0.6B",
                                   "--data.type=fake",
                                   "--data.seq-len=" + std::to_string(seq_len),
                                   "--data.batch-size=1",
                                   "--data.micro-batch-size=1",
                                   "--model.ac=None",
                                   "--model.ac-offloading=None",
                                   "--optim.max-norm=None"};
  args.insert(args.end(), more.begin(), more.end());
  auto cfg = load_command_line<SFTConfig>(args);
  REQUIRE_MESSAGE(cfg.ok(), format_text(cfg.diagnostics, "SFTConfig"));
  return cfg.value;
}

plan::Plan planned(const plan::MachineProfile& prof, const SFTConfig& cfg,
                   std::optional<double> deferred_share = std::nullopt) {
  plan::Assumptions a = unfused_assumptions();
  a.deferred_share = deferred_share;
  a.profile = &prof;
  a.profile_source = "test";
  a.gpu_capacity = std::int64_t{139} << 30;
  a.host_capacity = std::int64_t{125} << 30;
  return plan::make_plan(cfg, hand_shape(), a);
}

double params() { return static_cast<double>(hand_shape().total_params()); }

}  // namespace

TEST_CASE("step time: none is forward, backward and the update, from the measured block and head") {
  const auto prof = plan::read_profile_text("test", kProfile);
  const auto p = planned(prof, config(1024));
  const auto& t = *p.mode(Offload::none).time;
  CHECK(t.forward == doctest::Approx(2 * 0.010 + 0.003));
  CHECK(t.backward == doctest::Approx(2 * 0.020 + 0.006));
  CHECK(t.recompute == 0);
  CHECK(t.gpu_update == doctest::Approx(params() / 1e6));
  CHECK(t.step == doctest::Approx(t.forward + t.backward + t.gpu_update));
  CHECK(t.bound == "GPU compute");
  CHECK(t.tokens_per_s == doctest::Approx(1024 / t.step));
  CHECK(t.unsure.empty());
}

TEST_CASE("step time: gradients summed into FP32 accumulators on the device cost their bytes") {
  // Without the fused AdamW's hand-over, none sums each parameter's gradients into an FP32
  // accumulator (offload/shared/device_update.hpp): the first copied in (6 bytes a
  // parameter), each later one added (10), during backward.
  auto prof = plan::read_profile_text("test", kProfile);
  prof.gpu.memory_gbs = 6 * params() / 0.1 / 1e9;  // the copy of the first takes 0.1 s
  const auto one = *planned(prof, config(1024)).mode(Offload::none).time;
  CHECK(one.backward == doctest::Approx(2 * 0.020 + 0.006 + 0.1));
  CHECK(one.step == doctest::Approx(one.forward + one.backward + one.gpu_update));
  const auto three = *planned(prof, config(1024, {"--data.batch-size=3"})).mode(Offload::none).time;
  CHECK(three.backward == doctest::Approx(3 * (2 * 0.020 + 0.006) + 0.1 * (6 + 10 + 10) / 6));
  // optimizer's hooks sum into its device accumulators too; full sums on the host.
  const auto opt = *planned(prof, config(1024)).mode(Offload::optimizer).time;
  CHECK(opt.backward == doctest::Approx(one.backward));
  const auto full = *planned(prof, config(1024)).mode(Offload::full).time;
  CHECK(full.backward == doctest::Approx(2 * 0.020 + 0.006));
}

// The same block timed with FP8 linears (model.quantization), the rest outside attention
// faster: forward 6 ms (2 of it attention), backward 12.5 ms (5 attention).
constexpr const char* kFp8Block = R"(
[[gpu.blocks]]
hidden = 8
intermediate = 16
heads = 2
kv_heads = 1
head_dim = 4
qk_norm = true
fp8 = true
tokens = 1024
forward_s = 0.006
backward_s = 0.0125
)";

TEST_CASE("step time: model.quantization's steps from the FP8 blocks, the others from bf16's") {
  const std::string fp8_flag = "--model.quantization.type=fp8";
  const auto both = plan::read_profile_text("test", std::string(kProfile) + kFp8Block);
  const auto bf16 = *planned(both, config(1024)).mode(Offload::none).time;
  CHECK(bf16.forward == doctest::Approx(2 * 0.010 + 0.003));
  CHECK(bf16.unsure.empty());
  const auto fp8 = *planned(both, config(1024, {fp8_flag})).mode(Offload::none).time;
  CHECK(fp8.forward == doctest::Approx(2 * 0.006 + 0.003));
  CHECK(fp8.backward == doctest::Approx(2 * 0.0125 + 0.006));
  CHECK(fp8.unsure.empty());
  // A profile of one kind times the other kind's runs, and says so.
  auto has = [](const std::vector<std::string>& lines, const std::string& what) {
    return std::any_of(lines.begin(), lines.end(),
                       [&](const auto& l) { return l.find(what) != std::string::npos; });
  };
  const auto only_bf16 = plan::read_profile_text("test", kProfile);
  const auto fp8_on_bf16 = *planned(only_bf16, config(1024, {fp8_flag})).mode(Offload::none).time;
  CHECK(fp8_on_bf16.forward == doctest::Approx(bf16.forward));
  CHECK(has(fp8_on_bf16.unsure, "timed in bf16"));
  std::string fp8_only = kProfile;
  fp8_only.replace(fp8_only.find("qk_norm = true\ntokens"), std::string("qk_norm = true\n").size(),
                   "qk_norm = true\nfp8 = true\n");
  const auto bf16_on_fp8 =
      *planned(plan::read_profile_text("test", fp8_only), config(1024)).mode(Offload::none).time;
  CHECK(bf16_on_fp8.forward == doctest::Approx(bf16.forward));
  CHECK(has(bf16_on_fp8.unsure, "timed with FP8"));
}

TEST_CASE("step time: a longer sequence scales attention by its square, the rest by its length") {
  const auto prof = plan::read_profile_text("test", kProfile);
  const auto p = planned(prof, config(2048));
  const auto& t = *p.mode(Offload::none).time;
  // Block forward: 8 ms of the rest x 2 + 2 ms of attention x 4; backward 15 x 2 + 5 x 4.
  CHECK(t.forward == doctest::Approx(2 * (0.016 + 0.008) + 2 * 0.003));
  CHECK(t.backward == doctest::Approx(2 * (0.030 + 0.020) + 2 * 0.006));
}

TEST_CASE("step time: a block shape not measured runs at a throughput interpolated by its FLOPs") {
  auto prof = plan::read_profile_text("test", kProfile);
  // A second, larger block: 4,352 matmul FLOPs a token (the profile's has 1,152); forward
  // 20 ms of which 4 ms attention, backward 40 ms of which 10 ms attention.
  plan::BlockTiming big = prof.gpu.blocks[0];
  big.hidden = 16, big.intermediate = 32, big.heads = 4;
  big.forward_s = 0.020, big.backward_s = 0.040;
  prof.gpu.blocks.push_back(big);
  // Outside attention: 1,152 x 1,024 / 8 ms and 4,352 x 1,024 / 16 ms forward;
  // 1,152 x 1,024 / 15 ms and 4,352 x 1,024 / 30 ms backward (FLOP/s).
  const double rate_f[] = {1152 * 1024 / 0.008, 4352 * 1024 / 0.016};
  const double rate_b[] = {1152 * 1024 / 0.015, 4352 * 1024 / 0.030};
  // Between them: intermediate 48, 2,688 FLOPs a token.
  auto s = hand_shape();
  s.intermediate = 48;
  plan::Assumptions a = unfused_assumptions();
  a.profile = &prof;
  const auto p = plan::make_plan(config(1024), s, a);
  const auto& t = *p.mode(Offload::none).time;
  const double f = std::log(2688.0 / 1152) / std::log(4352.0 / 1152);
  const double block_f = 2688 * 1024 / (rate_f[0] + f * (rate_f[1] - rate_f[0])) + 0.002;
  const double block_b = 2688 * 1024 / (rate_b[0] + f * (rate_b[1] - rate_b[0])) + 0.005;
  CHECK(t.forward == doctest::Approx(2 * block_f + 0.003));
  CHECK(t.backward == doctest::Approx(2 * block_b + 0.006));
  auto says = [](const plan::StepTime& st, const char* what) {
    return std::any_of(st.unsure.begin(), st.unsure.end(),
                       [&](const std::string& u) { return u.find(what) != std::string::npos; });
  };
  CHECK(says(t, "interpolated"));
  // A block with heads twice as wide, between the two and three times as fast: its time outside
  // attention rests on attention at another width's rate, so it is not interpolated from.
  plan::BlockTiming wide = prof.gpu.blocks[0];
  wide.head_dim = 8, wide.intermediate = 40;
  wide.forward_s = 0.004, wide.backward_s = 0.008;
  prof.gpu.blocks.push_back(wide);
  const auto pw = plan::make_plan(config(1024), s, a);
  const auto& w = *pw.mode(Offload::none).time;
  CHECK(w.forward == doctest::Approx(2 * block_f + 0.003));
  CHECK(w.backward == doctest::Approx(2 * block_b + 0.006));
  CHECK(says(w, "of the blocks with heads of 4"));
  prof.gpu.blocks.pop_back();
  // Beyond the largest: the largest's throughput, said so.
  s.intermediate = 4096;
  const auto q = plan::make_plan(config(1024), s, a);
  const double x = 2.0 * (8 * 4 * 4 + 2 * 4 * 8 + 3 * 8 * 4096);
  CHECK(q.mode(Offload::none).time->forward == doctest::Approx(2 * (x * 1024 / rate_f[1] + 0.002) + 0.003));
  CHECK(says(*q.mode(Offload::none).time, "larger than any measured block"));
}

TEST_CASE("step time: checkpointing adds one forward of every block") {
  const auto prof = plan::read_profile_text("test", kProfile);
  const auto p = planned(prof, config(1024, {"--model.ac"}));
  const auto& t = *p.mode(Offload::none).time;
  CHECK(t.recompute == doctest::Approx(2 * 0.010));
  CHECK(t.step == doctest::Approx(t.forward + t.recompute + t.backward + t.gpu_update));
  // The plan with model.ac toggled carries its own step.
  CHECK(p.mode(Offload::none, true).time->recompute == 0);
}

TEST_CASE("step time: optimizer streams the moments beside the backward, not after it") {
  auto prof = plan::read_profile_text("test", kProfile);
  // Moments: 2 FP32 each way. At 1 kB/s the link takes seconds: it sets the step. The
  // uploads start with the forward, so the step is every moment's upload and what the
  // last of them waits for, far less than the forward, backward and uploads in a row.
  // (Without deferral: planned, it holds every write-back of this small model to the step's
  // end and the uploads wait for them; the pipeline would do the same.)
  const double up = 4 * 2 * params() / 1e3;
  {
    const auto p = planned(prof, config(1024), 0.0);
    const auto& t = *p.mode(Offload::optimizer).time;
    CHECK(t.step >= up);
    CHECK(t.step < up + 0.1 * (t.forward + t.backward + t.gpu_update));
    CHECK(t.bound == "PCIe");
  }
  // A fast link: the step is none's.
  prof.link.h2d_both_gbs = prof.link.d2h_both_gbs = prof.link.h2d_gbs = prof.link.d2h_gbs = 1e3;
  const auto p = planned(prof, config(1024));
  CHECK(p.mode(Offload::optimizer).time->step == doctest::Approx(p.mode(Offload::none).time->step));
  CHECK(p.mode(Offload::optimizer).time->bound == "GPU compute");
}

// optimizer's step on a GPU is replayed (offload/optimizer/step_replay.hpp), by hand here:
// two groups of 100 bytes of moments in hook order, 100 bytes a second each way, updates
// taking no time; a forward of 0.5 s, each group's backward 0.1 s.
namespace {
plan::detail::MomentReplayInputs two_groups(double window) {
  plan::detail::MomentReplayInputs in;
  in.groups.resize(2);
  for (auto& g : in.groups) g.bytes = 100, g.backward_s = 0.1;
  in.forward_s = 0.5;
  in.window_bytes = window;
  in.h2d_bytes_per_s = in.d2h_bytes_per_s = 100;
  in.update_params_per_s = 1;
  return in;
}
}  // namespace

TEST_CASE("optimizer's step replay: the uploads from the forward's start, the window's room, by hand") {
  // A window for both: each step uploads g0 [0, 1] and g1 [1, 2] from its forward's start,
  // each after its own write-back of the step before; g0's update waits from 0.6 to 1, g1's
  // from 1.1 to 2, where the step ends (its write-back runs into the next).
  auto r = plan::detail::replay_optimizer_step(two_groups(1000));
  REQUIRE(r.replayed);
  CHECK(r.step == doctest::Approx(2.0));
  CHECK(r.update_wait == doctest::Approx(1.3));
  CHECK(r.room_wait == doctest::Approx(0.0));
  // Room for one group: g1's upload waits for g0's write-back [1, 2], and the next step's
  // g0 for g1's: uploads [4, 5] and [6, 7] after a start at 3, 4 s a step, 2 of them the
  // uploads waiting for room; the updates wait 5 - 3.6 and 7 - 5.1.
  r = plan::detail::replay_optimizer_step(two_groups(100));
  REQUIRE(r.replayed);
  CHECK(r.step == doctest::Approx(4.0));
  CHECK(r.room_wait == doctest::Approx(2.0));
  CHECK(r.update_wait == doctest::Approx(3.3));
  // A group larger than the window cannot be replayed.
  CHECK_FALSE(plan::detail::replay_optimizer_step(two_groups(99)).replayed);
}

TEST_CASE("step time: optimizer's streams count each copy's cost beyond its bytes (link.copy_us)") {
  auto prof = plan::read_profile_text("test", kProfile);
  const auto cfg = config(1024);
  const auto without = *planned(prof, cfg, 0.0).mode(Offload::optimizer).time;
  CHECK(std::any_of(without.unsure.begin(), without.unsure.end(),
                    [](const std::string& u) { return u.find("link.copy_us") != std::string::npos; }));
  // One second a copy: each parameter's two moments are one copy each way (all far below
  // 64 MiB), the embedding's beside the forward and the rest in the streams, both ways at
  // once: the step grows by a second per parameter and moment.
  prof.link.copy_us = 1e6;
  const auto with = *planned(prof, cfg, 0.0).mode(Offload::optimizer).time;
  CHECK(with.step - without.step == doctest::Approx(2.0 * static_cast<double>(hand_shape().params().size())));
  CHECK(std::none_of(with.unsure.begin(), with.unsure.end(),
                     [](const std::string& u) { return u.find("link.copy_us") != std::string::npos; }));
}

TEST_CASE(
    "optimizer's pipeline: deferred write-backs and a wider window where the moment copies bound the step") {
  auto prof = plan::read_profile_text("test", kProfile);
  const auto window = [](const plan::Plan& p) {
    return p.mode(Offload::optimizer).gpu.term("moment_window");
  };
  // The slow link bounds the step: half the window deferred, the window widened.
  const auto slow = planned(prof, config(1024));
  const auto& c = slow.mode(Offload::optimizer).pipeline;
  CHECK(slow.mode(Offload::optimizer).time->bound == "PCIe");
  CHECK(c.chosen);
  CHECK(c.deferred_share == plan::kDeferredShare);
  CHECK(c.ring_bytes == plan::kDeferredWindow);
  CHECK(window(slow) >= plan::kDeferredWindow);
  // ... and the toggled-ac plan chooses for itself, by the same rule.
  CHECK(slow.mode(Offload::optimizer, true).pipeline.deferred_share == plan::kDeferredShare);

  // A device without room for the wider window keeps the automatic one, still deferring.
  {
    plan::Assumptions a = unfused_assumptions();
    a.profile = &prof;
    a.gpu_capacity =
        slow.mode(Offload::optimizer).gpu_total - plan::kDeferredWindow + (std::int64_t{1} << 30);
    const auto p = plan::make_plan(config(1024), hand_shape(), a);
    CHECK(p.mode(Offload::optimizer).pipeline.deferred_share == plan::kDeferredShare);
    CHECK_FALSE(p.mode(Offload::optimizer).pipeline.ring_bytes);
    CHECK(window(p) < (std::int64_t{1} << 20));
    CHECK(p.mode(Offload::optimizer).gpu_fits == true);
    CHECK(p.mode(Offload::optimizer).pipeline.why.find("does not fit") != std::string::npos);
  }
  // What the user gave is kept as given.
  {
    plan::Assumptions a = unfused_assumptions();
    a.profile = &prof;
    a.deferred_share = 0.25;
    a.ring_bytes = std::int64_t{1} << 30;
    const auto p = plan::make_plan(config(1024), hand_shape(), a);
    CHECK_FALSE(p.mode(Offload::optimizer).pipeline.chosen);
    CHECK(p.mode(Offload::optimizer).pipeline.deferred_share == 0.25);
    CHECK(p.mode(Offload::optimizer).pipeline.ring_bytes == std::int64_t{1} << 30);
  }
  // Clipping waits for the whole gradient: nothing to defer.
  CHECK(planned(prof, config(1024, {"--optim.max-norm=1.0"}))
            .mode(Offload::optimizer)
            .pipeline.deferred_share == 0);
  // Planned beside a GPU the profile was not measured on: a run there has no profile of its
  // own to choose by (main.cpp's choose_pipeline), so the plan defers nothing, as it will.
  {
    plan::Assumptions a = unfused_assumptions();
    a.profile = &prof;
    a.gpu_name = "NVIDIA H100 80GB HBM3";
    a.profile_chooses_here = false;
    const auto p = plan::make_plan(config(1024), hand_shape(), a);
    CHECK(p.mode(Offload::optimizer).time->bound == "PCIe");
    CHECK(p.mode(Offload::optimizer).pipeline.deferred_share == 0);
    CHECK_FALSE(p.mode(Offload::optimizer).pipeline.ring_bytes);
    CHECK(window(p) < (std::int64_t{1} << 20));
    CHECK(p.mode(Offload::optimizer).pipeline.why.find("NVIDIA H100 80GB HBM3") != std::string::npos);
  }
  // Without a profile nothing is chosen by time.
  {
    plan::Assumptions a = unfused_assumptions();
    const auto p = plan::make_plan(config(1024), hand_shape(), a);
    CHECK(p.mode(Offload::optimizer).pipeline.deferred_share == 0);
    CHECK(p.mode(Offload::optimizer).pipeline.why.find("no machine profile") != std::string::npos);
  }
  // A fast link: the GPU bounds the step, where deferring costs; the window is ring_capacity's.
  prof.link.h2d_both_gbs = prof.link.d2h_both_gbs = prof.link.h2d_gbs = prof.link.d2h_gbs = 1e3;
  const auto fast = planned(prof, config(1024));
  CHECK(fast.mode(Offload::optimizer).time->bound == "GPU compute");
  CHECK(fast.mode(Offload::optimizer).pipeline.deferred_share == 0);
  CHECK_FALSE(fast.mode(Offload::optimizer).pipeline.ring_bytes);
  CHECK(window(fast) < (std::int64_t{1} << 20));
}

TEST_CASE("step time: a step that replays the CUDA graph says its gain is not in the prediction") {
  const auto prof = plan::read_profile_text("test", kProfile);
  plan::Assumptions a = unfused_assumptions();
  a.profile = &prof;
  a.fused_adamw = true;  // the hand-over, whose steps replay
  auto said = [](const plan::ModePlan& m) {
    const auto& u = m.time->unsure;
    return std::any_of(u.begin(), u.end(),
                       [](const std::string& s) { return s.find("CUDA graph") != s.npos; });
  };
  CHECK(said(plan::make_plan(config(1024), hand_shape(), a).mode(Offload::none)));
  CHECK_FALSE(said(plan::make_plan(config(1024), hand_shape(), a).mode(Offload::optimizer)));
  a.cuda_graph = false;
  CHECK_FALSE(said(plan::make_plan(config(1024), hand_shape(), a).mode(Offload::none)));
}

TEST_CASE("optimizer's pipeline on the shipped H200 profile: deferred at Llama-3.2-3B, not at Qwen3-0.6B") {
  // The measured cases (docs/performance.md): deferral took Llama-3.2-3B/8192 from 1.13x
  // to 1.08x of its PCIe bound, and cost Qwen3-0.6B 7%.
  const auto& prof = plan::shipped_profile();
  REQUIRE(prof);
  for (auto [model, share] :
       {std::pair{"meta-llama/Llama-3.2-3B", plan::kDeferredShare}, std::pair{"Qwen/Qwen3-0.6B", 0.0}}) {
    plan::Assumptions a = unfused_assumptions();
    a.profile = &*prof;
    a.gpu_capacity = std::int64_t{139} << 30;
    const auto p = plan::make_plan(config(8192, {std::string("--model.name=") + model}), a);
    CAPTURE(model);
    CHECK(p.mode(Offload::optimizer).pipeline.deferred_share == share);
  }
}

// full's one micro-batch on a GPU is replayed (offload/full/step_replay.hpp), by hand
// here: a lookup, two blocks and a head of 10, 490, 490 and 10 parameters, updated at
// 1000 a second; blocks of 10 ms forward and 20 ms backward, a head of 3 and 6 ms.
namespace {
plan::detail::ReplayInputs two_blocks() {
  plan::detail::ReplayInputs in;
  in.cpu_params_per_s = 1000;
  in.d2h_bytes_per_s = in.h2d_bytes_per_s = 1e12;
  in.ring_bytes = 1e9;
  auto group = [](double params, double fwd, double bwd) {
    plan::detail::ReplayGroup g;
    g.jobs = {params};
    g.copy_bytes = 2;
    g.forward_s = fwd, g.backward_s = bwd;
    return g;
  };
  in.groups = {group(10, 0, 0), group(490, 0.010, 0.020), group(490, 0.010, 0.020), group(10, 0.003, 0.006)};
  return in;
}
}  // namespace

TEST_CASE("full's step replay: the worker's order and idle time, by hand") {
  // The worker idles until the head's gradient lands (6 ms), updates it (10 ms) and
  // idles again until block 1's lands (26 ms). Then block 1 (490 ms), the lookup and
  // block 0, which landed meanwhile: done at 1016 ms. The forward has waited for them
  // and runs both blocks and the head after the last (23 ms): 1039 ms a step.
  auto in = two_blocks();
  auto r = plan::detail::replay_full_step(in);
  CHECK(r.replayed);
  CHECK(r.step == doctest::Approx(1.039));
  CHECK(r.cpu_busy == doctest::Approx(1.0));
  CHECK(r.ring_wait == 0);
  // A ring that holds one block's gradient (980 bytes) and the head's: block 0's hook
  // waits until block 1 is read (516 ms); the worker then takes the oldest. The same step.
  in.ring_bytes = 1000;
  r = plan::detail::replay_full_step(in);
  CHECK(r.step == doctest::Approx(1.039));
  CHECK(r.ring_wait == doctest::Approx(0.516 - 0.046));
  // A CPU 1000 times faster: the GPU's 69 ms, the forward waiting only for the last
  // gradients' updates (the lookup's and block 0's, 0.5 ms).
  in.ring_bytes = 1e9;
  in.cpu_params_per_s = 1e6;
  r = plan::detail::replay_full_step(in);
  CHECK(r.step == doctest::Approx(0.069 + 0.0005));
  CHECK(r.forward_wait == doctest::Approx(0.0005));
  // A gradient the ring cannot hold at all: not replayed, never a step of zero.
  in.ring_bytes = 500;
  r = plan::detail::replay_full_step(in);
  CHECK(!r.replayed);
  CHECK(r.step == 0);
}

TEST_CASE("step time: full's CPU update runs at the rate under copies, and the GPU's time bounds it below") {
  auto prof = plan::read_profile_text("test", kProfile);
  prof.link.h2d_both_gbs = prof.link.d2h_both_gbs = prof.link.h2d_gbs = prof.link.d2h_gbs = 1e3;
  prof.host.adamw_params_per_s = 1e12;                 // alone: not what full runs at
  prof.host.adamw_busy_params_per_s = params() / 1.0;  // one second of CPU update
  {
    // The second, and what the GPU runs while the worker has nothing: at most a step's
    // compute.
    const auto p = planned(prof, config(1024));
    const auto& t = *p.mode(Offload::full).time;
    CHECK(t.cpu_update == doctest::Approx(1.0));
    CHECK(t.step > 1.0 + 0.003 + 0.006);
    CHECK(t.step < 1.0 + t.forward + t.backward);
    CHECK(t.bound == "CPU update");
  }
  // A fast CPU: the GPU's compute alone (no update on the GPU).
  prof.host.adamw_busy_params_per_s = 1e12;
  const auto p = planned(prof, config(1024));
  const auto& t = *p.mode(Offload::full).time;
  CHECK(t.step == doctest::Approx(t.forward + t.backward).epsilon(1e-3));
  CHECK(t.bound == "GPU compute");
  // Two ranks on the node each get half the cores, less one thread: 1 of 3 calibrated.
  plan::Assumptions a = unfused_assumptions();
  a.profile = &prof;
  a.world = 2;
  a.process_group = true;
  prof.host.adamw_busy_params_per_s = params();
  const auto q = plan::make_plan(config(1024), hand_shape(), a);
  CHECK(q.mode(Offload::full).time->cpu_update == doctest::Approx(0.5 * 3.0));
}

TEST_CASE("step time: full's CPU update at the rate a full run measured, when the profile has one") {
  auto prof = plan::read_profile_text("test", kProfile);
  prof.link.h2d_both_gbs = prof.link.d2h_both_gbs = prof.link.h2d_gbs = prof.link.d2h_gbs = 1e3;
  prof.host.adamw_params_per_s = 1e12;
  prof.host.adamw_busy_params_per_s = params() / 1.0;
  prof.host.adamw_full_params_per_s = params() / 0.8;  // what --calibrate's full run measured
  const auto p = planned(prof, config(1024));
  const auto& t = *p.mode(Offload::full).time;
  CHECK(t.cpu_update == doctest::Approx(0.8));
  CHECK(t.step > 0.8);
  CHECK(t.bound == "CPU update");
  // SignSGD has no such figure: its rate under copies.
  const auto q = planned(prof, config(1024, {"--optim.type=sign_sgd", "--optim.max-norm=None"}));
  CHECK(q.mode(Offload::full).time->cpu_update ==
        doctest::Approx(params() / prof.host.sign_sgd_busy_params_per_s));
}

TEST_CASE("step time: full with several micro-batches: the host sums the gradients through its memory") {
  auto prof = plan::read_profile_text("test", kProfile);
  prof.link.h2d_both_gbs = prof.link.d2h_both_gbs = prof.link.h2d_gbs = prof.link.d2h_gbs = 1e3;
  prof.host.adamw_full_params_per_s = params() / 1.0;
  // 14 bytes a parameter before the last updates (its add and the squares) take 0.7 s.
  prof.host.memory_gbs = 14 * params() / 0.7 / 1e9;
  const auto two = planned(prof, config(1024, {"--data.batch-size=2"}));
  const auto& t = *two.mode(Offload::full).time;
  CHECK(t.cpu_update == doctest::Approx(1.0 + 0.7));
  CHECK(t.bound == "CPU update");
  // The earlier micro-batches' sums (6 bytes a parameter for the first, 10 for each
  // other: 0.3 s, then 0.5 s more) run beside the GPU's next micro-batches; longer than
  // them, they set the pace: a third micro-batch adds 0.5 s, its GPU work hidden but for
  // its loss's extra pass (a tied head: nn/loss_chunking.hpp).
  const auto three = planned(prof, config(1024, {"--data.batch-size=3"}));
  const auto& u = *three.mode(Offload::full).time;
  const double added = u.step - t.step;
  CHECK(added >= 0.5);
  CHECK(added < 0.5 + (u.forward - t.forward));
}

TEST_CASE("step time: full with several micro-batches: the CPU update slows with the copies") {
  auto prof = plan::read_profile_text("test", kProfile);
  // Alone 1 s, 2 s under the calibration's copies both ways at the link's full rate.
  prof.host.adamw_params_per_s = params() / 1.0;
  prof.host.adamw_busy_params_per_s = params() / 2.0;
  // One process moves bf16 gradients down and bf16 weights up: 4 bytes a parameter.
  // A link at which those bytes take 0.75 s both ways at once: t^2 - t - 0.75 = 0.
  const double bytes = 4 * params();
  prof.link.h2d_both_gbs = prof.link.d2h_both_gbs = bytes / 0.75 / 2 / 1e9;
  prof.link.h2d_gbs = prof.link.d2h_gbs = prof.link.h2d_both_gbs;
  const auto p = planned(prof, config(1024, {"--data.batch-size=2"}));
  const auto& t = *p.mode(Offload::full).time;
  CHECK(t.cpu_update == doctest::Approx(1.5));
  // The first micro-batch's passes, then the last's forward, its head's backward and
  // the update after it.
  CHECK(t.step == doctest::Approx(t.forward + t.backward / 2 + 0.006 + 1.5));
  CHECK(t.bound == "CPU update");
  // The model's edges: no copies is the rate alone; a busy rate above it changes nothing.
  CHECK(plan::detail::cpu_update_under_copies(1.0, 2.0, 0, 1e9) == 1.0);
  CHECK(plan::detail::cpu_update_under_copies(1.0, 0.5, 1e9, 1e9) == 1.0);
  CHECK(plan::detail::cpu_update_under_copies(1.0, 2.0, 1e12, 1e9) == 2.0);  // beyond the calibration's load
}

TEST_CASE("step time: full's gradients cross PCIe in bf16 on one rank, as in one process") {
  auto prof = plan::read_profile_text("test", kProfile);
  const auto alone = planned(prof, config(1024));
  plan::Assumptions a = unfused_assumptions();
  a.profile = &prof;
  a.world = 1;
  a.process_group = true;  // torchrun with one process: sharded over one rank, FP32 reductions
  const auto rank = plan::make_plan(config(1024), hand_shape(), a);
  REQUIRE(rank.mode(Offload::full).time);
  // FP32 pieces coming down would take twice the bf16 weights going up.
  CHECK(rank.mode(Offload::full).time->link == doctest::Approx(alone.mode(Offload::full).time->link));
}

TEST_CASE("step time: the recommendation is the fastest mode that fits, with what the others cost") {
  auto prof = plan::read_profile_text("test", kProfile);
  prof.link.h2d_both_gbs = prof.link.d2h_both_gbs = prof.link.h2d_gbs = prof.link.d2h_gbs = 1e3;
  prof.host.adamw_params_per_s = params() / 1.0;
  const SFTConfig cfg = config(1024);
  const auto p = planned(prof, cfg);
  const auto advice = plan::advise(cfg, p);
  REQUIRE(advice.mode);
  CHECK(*advice.mode == Offload::none);
  CHECK(advice.summary.find("full: saves") != std::string::npos);
  CHECK(advice.summary.find("step time") != std::string::npos);
  const std::string text = plan::format_text(p, &advice);
  CHECK(text.find("Step time, predicted") != std::string::npos);
  CHECK(text.find("profile: test GPU") != std::string::npos);
  const std::string json = plan::format_json(p, &advice);
  CHECK(json.find("\"step_time_profile\"") != std::string::npos);
  CHECK(json.find("\"step_s\"") != std::string::npos);
}

TEST_CASE("step time: a shape or length outside the profile is said to be unsure") {
  const auto prof = plan::read_profile_text("test", kProfile);
  auto s = hand_shape();
  s.hidden = 16;
  plan::Assumptions a = unfused_assumptions();
  a.profile = &prof;
  const auto p = plan::make_plan(config(8192), s, a);
  const auto& u = p.mode(Offload::none).time->unsure;
  auto has = [&](std::string_view what) {
    return std::any_of(u.begin(), u.end(),
                       [&](const std::string& x) { return x.find(what) != std::string::npos; });
  };
  CHECK(has("not in the profile"));
  CHECK(has("beyond the longest length measured"));
}

TEST_CASE("step time: a profile measured with other fused kernels than the run's is said to be unsure") {
  std::string text = kProfile;
  text.replace(text.find("command = \"by hand\""), 19, "command = \"by hand\"\nkernels = [\"fused\"]");
  const auto prof = plan::read_profile_text("test", text);
  REQUIRE(prof.provenance.kernels);
  CHECK(*prof.provenance.kernels == std::vector<std::string>{"fused"});
  auto unsure_with = [&](std::optional<std::vector<std::string>> run) {
    plan::Assumptions a = unfused_assumptions();
    a.profile = &prof;
    a.kernels = std::move(run);
    const auto p = plan::make_plan(config(1024), hand_shape(), a);
    return p.mode(Offload::none).time->unsure;
  };
  train::KernelOptions all;  // the defaults: every kernel on
  const auto u = unsure_with(all.on());
  REQUIRE(u.size() == 1);
  CHECK(u[0].find("fused kernels fused and this run uses fused, norm_rope, cross_entropy, adamw") !=
        std::string::npos);
  CHECK(unsure_with(std::vector<std::string>{"fused"}).empty());
  CHECK(unsure_with(std::nullopt).empty());  // the run's kernels not known
  train::KernelOptions off;
  off.fused = false;
  CHECK(unsure_with(off.on()).at(0).find("this run uses none") != std::string::npos);
  // A profile that does not record them (written before the field) says nothing.
  const auto old = plan::read_profile_text("test", kProfile);
  plan::Assumptions a = unfused_assumptions();
  a.profile = &old;
  a.kernels = all.on();
  CHECK(plan::make_plan(config(1024), hand_shape(), a).mode(Offload::none).time->unsure.empty());

  // The same kernels from other sources (a kernel changed since the profile was measured).
  std::string with_sources = text;
  with_sources.replace(with_sources.find("kernels = [\"fused\"]"), 19,
                       "kernels = [\"fused\"]\nkernel_sources = \"0123456789abcdef\"");
  const auto measured = plan::read_profile_text("test", with_sources);
  REQUIRE(measured.provenance.kernel_sources == std::optional<std::string>("0123456789abcdef"));
  auto unsure_from = [&](std::optional<std::string> build) {
    plan::Assumptions b = unfused_assumptions();
    b.profile = &measured;
    b.kernels = std::vector<std::string>{"fused"};
    b.kernel_sources = std::move(build);
    return plan::make_plan(config(1024), hand_shape(), b).mode(Offload::none).time->unsure;
  };
  CHECK(unsure_from("0123456789abcdef").empty());
  CHECK(unsure_from(std::nullopt).empty());  // the build's not known
  const auto other = unsure_from(train::build_kernel_sources());
  REQUIRE(other.size() == 1);
  CHECK(other[0].find("other code of the same fused kernels (sources 0123456789abcdef, this build's " +
                      train::build_kernel_sources()) != std::string::npos);
}

TEST_CASE("host memory: the runtime is the profile's measured one, and the plan says where it came from") {
  const auto cfg = config(1024);
  plan::Assumptions a = unfused_assumptions();
  const auto without = plan::make_plan(cfg, hand_shape(), a);  // no profile: the fixed guess, said as such
  CHECK(without.assumptions.host_runtime == (std::int64_t{2} << 30));
  CHECK(without.assumptions.host_runtime_source.find("assumed") == 0);
  const auto old = plan::read_profile_text("test", kProfile);  // a profile that does not measure it
  a.profile = &old;
  CHECK(plan::make_plan(cfg, hand_shape(), a).assumptions.host_runtime == (std::int64_t{2} << 30));

  std::string text = kProfile;
  text.replace(text.find("[collectives]"), 13, "runtime_bytes = 700000000\n\n[collectives]");
  const auto measured = plan::read_profile_text("test", text);
  REQUIRE(measured.host.runtime_bytes == 700000000);
  a.profile = &measured;
  a.profile_source = "my.toml";
  const auto p = plan::make_plan(cfg, hand_shape(), a);
  CHECK(p.assumptions.host_runtime == 700000000);
  CHECK(p.assumptions.host_runtime_source == "measured by --calibrate on test GPU (my.toml)");
  // Every mode's host plan counts it, in place of the guess, and nothing else moves.
  for (Offload m : offload_modes) {
    CAPTURE(static_cast<int>(m));
    CHECK(p.mode(m).host.peak - without.mode(m).host.peak == 700000000 - (std::int64_t{2} << 30));
  }
  CHECK(plan::format_text(p).find(
            "runtime on host 667.6 MiB (measured by --calibrate on test GPU (my.toml))") !=
        std::string::npos);

  // Measured per architecture (routed experts load more kernels than a dense block): a
  // model takes its own architecture's, one the profile did not measure the largest.
  const auto moe_only = plan::read_profile_text(
      "test", text + "\n[[host.runtime_by_architecture]]\narchitecture = \"qwen3_moe\"\nbytes = 900000000\n");
  a.profile = &moe_only;
  CHECK(plan::make_plan(cfg, hand_shape(), a).assumptions.host_runtime == 700000000);
  const auto moe_shape = *plan::preset_shape("primecfg/tiny-moe");
  const auto moe = plan::make_plan(cfg, moe_shape, a);
  CHECK(moe.assumptions.host_runtime == 900000000);
  CHECK(moe.assumptions.host_runtime_source ==
        "measured by --calibrate on test GPU (my.toml), for qwen3_moe models");
  const auto both = plan::read_profile_text(
      "test", text + "\n[[host.runtime_by_architecture]]\narchitecture = \"llama\"\nbytes = 600000000\n");
  a.profile = &both;
  CHECK(plan::make_plan(cfg, hand_shape(), a).assumptions.host_runtime == 600000000);
}

TEST_CASE("a profile measured on another GPU than this machine's is named as such by the plan") {
  const auto prof = plan::read_profile_text("test", kProfile);
  auto notes = [&](std::optional<std::string> gpu) {
    plan::Assumptions a = unfused_assumptions();
    a.profile = &prof;
    a.profile_source = "my.toml";
    a.gpu_name = std::move(gpu);
    const auto n = plan::make_plan(config(1024), hand_shape(), a).notes;
    return std::count_if(n.begin(), n.end(), [](const std::string& s) {
      return s.find("was measured on test GPU, and this machine's GPU is NVIDIA A100") != std::string::npos;
    });
  };
  CHECK(notes("NVIDIA A100") == 1);
  CHECK(notes("test GPU") == 0);
  CHECK(notes(std::nullopt) == 0);  // planning from a machine without a GPU: nothing to compare
}

TEST_CASE("block coverage: measured, interpolated, or beyond the measured blocks on either side") {
  const auto& prof = plan::shipped_profile();
  REQUIRE(prof);
  auto of = [&](const char* name) { return plan::block_coverage(*prof, *plan::preset_shape(name)); };
  // The shipped profile measured Qwen3-0.6B, Qwen3-4B, the Llama-3.2s, Meta-Llama-3-8B and
  // Qwen3-30B-A3B's routed block.
  CHECK(of("Qwen/Qwen3-0.6B") == plan::Coverage::measured);
  CHECK(of("meta-llama/Meta-Llama-3-8B") == plan::Coverage::measured);
  CHECK(of("Qwen/Qwen3-30B-A3B") == plan::Coverage::measured);
  CHECK(of("Qwen/Qwen3-1.7B") == plan::Coverage::interpolated);
  CHECK(of("primecfg/tiny") == plan::Coverage::smaller);
  CHECK(of("meta-llama/Llama-3.1-70B") == plan::Coverage::larger);
}

TEST_CASE("machine profile: bad values and unknown keys are errors with file:line") {
  std::string bad = kProfile;
  bad.replace(bad.find("forward_s = 0.010"), 17, "forward_s = -1.0");
  bad += "\n[extra]\nkey = 1\n";
  try {
    (void)plan::read_profile_text("bad.toml", bad);
    FAIL("a bad profile was read");
  } catch (const plan::profile_error& e) {
    const std::string what = e.what();
    CHECK(what.find("bad.toml:23:") != std::string::npos);
    CHECK(what.find("gpu.blocks[0].forward_s") != std::string::npos);
    CHECK(what.find("extra") != std::string::npos);
  }
  CHECK_THROWS_AS(plan::read_profile_text("empty.toml", ""), plan::profile_error);
}

TEST_CASE("the shipped H200 profile was measured with this build's default kernels, from these sources") {
  // Its block times are those of the kernels the calibration ran: a default flipped or a
  // kernel's source changed makes every plan of a fused build use times of other code,
  // so such a change lands with a new --calibrate on an H200
  // (reference_trainer/planner/profiles/nvidia-h200.toml; docs/memory-planner.md).
  const auto& p = plan::shipped_profile();
  REQUIRE(p);
  REQUIRE(p->provenance.kernels);
  CHECK_MESSAGE(
      *p->provenance.kernels == train::KernelOptions{}.on(),
      "the shipped profile's kernels differ from the build's defaults (options.hpp, KernelOptions): "
      "run --calibrate on an H200 and ship its profile");
  CHECK_MESSAGE(p->provenance.kernel_sources == train::build_kernel_sources(),
                "the fused kernels' sources (nn/kernels/, optim/kernels/) changed since the shipped profile "
                "timed them: run --calibrate on an H200 and ship its profile");
}

namespace {

// A step measured on a GPU machine, as bench/trainer/fake.toml runs it (one sequence, AdamW
// without clipping), for a profile measured on that machine kind.
struct MeasuredRow {
  const char* model;
  std::int64_t seq_len;
  Offload mode;
  bool ac;
  double measured_s;
  std::vector<std::string> more = {};
};

// Each row planned as a CUDA build plans its runs, with the fused kernels the profile
// timed, within 10% of its measured step.
void check_within_10_percent(const plan::MachineProfile& p, const std::vector<MeasuredRow>& rows) {
  for (const MeasuredRow& r : rows) {
    std::vector<std::string> args{std::string("--model.name=") + r.model,
                                  r.ac ? "--model.ac" : "--model.ac=None"};
    args.insert(args.end(), r.more.begin(), r.more.end());
    const auto cfg = config(r.seq_len, args);
    plan::Assumptions a;
    a.fused_swiglu = a.fused_cross_entropy = a.fused_adamw = true;
    a.kernels = train::KernelOptions{}.on();
    a.kernel_sources = train::build_kernel_sources();
    a.profile = &p;
    const auto plan = plan::make_plan(cfg, a);
    const auto& t = *plan.mode(r.mode).time;
    CAPTURE(std::string(r.model));
    CAPTURE(r.seq_len);
    CAPTURE(r.mode);
    // Relative to the measured step (doctest's Approx adds 1 to its scale: 17% at 0.68 s).
    CAPTURE(t.step);
    CHECK(std::abs(t.step / r.measured_s - 1) <= 0.10);
  }
}

}  // namespace

TEST_CASE("machine profile: the shipped H200 profile predicts the steps measured on the H200 within 10%") {
  const auto& p = plan::shipped_profile();
  REQUIRE(p);
  CHECK(p->provenance.device.find("H200") != std::string::npos);
  // Steps measured on the H200 at the profile's tree, each planned before it ran
  // (docs/memory-planner.md, "Accuracy on the H200": the blind rows of 2026-12-06 and the
  // Qwen3-MoE rows of docs/performance.md) and within 10% there; the model with the shipped
  // profile must stay within 10% of each, and of the rows brought within 10% since.
  check_within_10_percent(
      *p,
      {
          {"Qwen/Qwen3-1.7B", 4096, Offload::optimizer, false, 0.2827},
          {"meta-llama/Llama-3.2-1B", 32768, Offload::none, true, 1.2848},
          {"Qwen/Qwen3-4B", 16384, Offload::none, true, 1.5478},
          {"Qwen/Qwen3-8B", 16384, Offload::optimizer, true, 2.4178},
          {"Qwen/Qwen3-30B-A3B", 8192, Offload::none, false, 0.1106, {"--model.debug.num-layers=4"}},
          {"Qwen/Qwen3-30B-A3B", 16384, Offload::none, false, 0.2150, {"--model.debug.num-layers=4"}},
          // full, since its step is replayed (2026-12-07; before it they were 13 to 26% short).
          // Measured before the replay was written, so they check it rather than blind it.
          {"Qwen/Qwen3-4B", 4096, Offload::full, false, 0.6829},
          {"Qwen/Qwen3-8B", 8192, Offload::full, true, 1.6541},
          {"Qwen/Qwen3-30B-A3B", 8192, Offload::full, false, 0.6143, {"--model.debug.num-layers=4"}},
          {"Qwen/Qwen3-30B-A3B", 16384, Offload::full, false, 0.6553, {"--model.debug.num-layers=4"}},
          // Qwen3-1.7B since its block is interpolated between dense blocks only (it was +38%
          // and +23%, towards Qwen3-30B-A3B's routed block), Llama-3.2-1B in full since the
          // vocabulary-chunked loss is counted (-15%); measured before either change.
          {"Qwen/Qwen3-1.7B", 16384, Offload::none, false, 0.5246},
          {"Qwen/Qwen3-1.7B", 65536, Offload::none, true, 5.4867},
          {"meta-llama/Llama-3.2-1B", 16384, Offload::full, false, 0.4203},
          // Blind rows of 2026-12-07 (the same machine kind, another lease), within 10% as planned.
          {"meta-llama/Llama-3.2-1B", 4096, Offload::optimizer, true, 0.1986},
          {"Qwen/Qwen3-8B", 4096, Offload::none, false, 0.4097},
          {"Qwen/Qwen3-4B", 32768, Offload::optimizer, true, 4.3233},
          {"meta-llama/Llama-3.2-1B", 8192, Offload::none, false, 0.3182, {"--data.batch-size=2"}},
          {"Qwen/Qwen3-4B", 8192, Offload::optimizer, false, 1.1869, {"--data.batch-size=2"}},
          {"Qwen/Qwen3-8B", 16384, Offload::full, true, 2.3983},
          // optimizer on Qwen3-MoE since its step is replayed through the moment window (it was
          // -15% and -12%); measured before the replay was written.
          {"Qwen/Qwen3-30B-A3B", 8192, Offload::optimizer, false, 0.5785, {"--model.debug.num-layers=4"}},
          {"Qwen/Qwen3-30B-A3B", 16384, Offload::optimizer, false, 0.6130, {"--model.debug.num-layers=4"}},
      });
}

TEST_CASE("machine profile: an H100 profile predicts the steps of its own lease within 10%") {
  // docs/history/nvidia-h100-2026-12-07.toml, calibrated in the lease that then ran the 19
  // blind rows of docs/memory-planner.md ("Blind rows on an H100 with a fresh calibration").
  // Held: the 14 rows within 10% today. Not held: Qwen3-4B/8192 with AC in `optimizer`
  // (0.7916 s), -5.8% by the closed form and -13.1% since optimizer's step is replayed (the
  // replay keeps the link busier than this run did: docs/memory-planner.md). Not held:
  // three CPU-bound `full` rows (+12 to +23%: this profile predates the full-run AdamW rate,
  // with which a later lease's profile planned them within 1.4%) and `full` with two
  // micro-batches, measured before the trainer's fix of the host's gradient sums.
  const auto p =
      plan::read_profile(fs::path(PRIMECFG_SOURCE_ROOT) / "docs/history/nvidia-h100-2026-12-07.toml");
  REQUIRE(p.provenance.device.find("H100") != std::string::npos);
  const std::vector<std::string> off = {"--model.ac-offloading"}, two = {"--data.batch-size=2"};
  check_within_10_percent(p, {
                                 {"meta-llama/Llama-3.2-1B", 32768, Offload::none, true, 1.2852},
                                 {"meta-llama/Llama-3.2-1B", 16384, Offload::optimizer, false, 0.3911},
                                 {"Qwen/Qwen3-1.7B", 4096, Offload::none, false, 0.1094},
                                 {"Qwen/Qwen3-1.7B", 8192, Offload::optimizer, false, 0.4964, two},
                                 {"Qwen/Qwen3-1.7B", 16384, Offload::optimizer, true, 0.6821},
                                 {"Qwen/Qwen3-4B", 8192, Offload::none, true, 0.6641},
                                 {"Qwen/Qwen3-1.7B", 16384, Offload::none, true, 0.6657, off},
                                 {"Qwen/Qwen3-4B", 4096, Offload::optimizer, false, 0.7045},
                                 {"Qwen/Qwen3-4B", 12288, Offload::optimizer, true, 1.1404, off},
                                 {"Qwen/Qwen3-4B", 16384, Offload::none, true, 1.5582, off},
                                 {"Qwen/Qwen3-1.7B", 32768, Offload::full, true, 1.7952},
                                 {"meta-llama/Llama-3.2-1B", 65536, Offload::optimizer, true, 3.9911, off},
                                 {"Qwen/Qwen3-4B", 32768, Offload::optimizer, true, 4.3681},
                                 {"Qwen/Qwen3-8B", 32768, Offload::full, true, 5.8804},
                             });
}

TEST_CASE("--plan in a build without CUDA plans the GPU build's run: the peaks an H100 measured") {
  // A plan for a cluster is often made where no GPU is (this CPU-only CI); the run it plans
  // is a CUDA build's, with the fused kernels on by default. Measured on an H100 80GB HBM3,
  // 2026-12-07 (docs/memory-planner.md, the blind rows on an H100): Qwen3-1.7B at 4,096
  // tokens, `none` 31.99 GiB, `optimizer` 31.87, `full` 12.15, planned there within 0.4%.
  const fs::path dir = fs::temp_directory_path() / "plan-for-gpu";
  fs::create_directories(dir);
  const std::string bin = PRIMECFG_TRAIN_BIN;
  const std::string root = PRIMECFG_SOURCE_ROOT;
  const fs::path out = dir / "plan.json";
  REQUIRE(std::system((bin + " @ " + root + "/bench/trainer/fake.toml --model.name=Qwen/Qwen3-1.7B" +
                       " --data.seq-len=4096 --plan --plan-format=json --plan-gpu-memory=79.18" +
                       " --plan-profile=" + root + "/docs/history/nvidia-h100-2026-12-07-1507.toml >" +
                       out.string())
                          .c_str()) == 0);
  std::ifstream in(out);
  const auto plan_json = nlohmann::json::parse(in);
  const std::map<std::string, double> measured = {{"none", 31.99}, {"optimizer", 31.87}, {"full", 12.15}};
  for (const auto& m : plan_json.at("modes")) {
    const std::string mode = m.at("offload");
    const double peak = std::stod(m.at("gpu").at("peak_gib").get<std::string>());
    INFO(mode, ": planned ", peak, " GiB, measured ", measured.at(mode));
    CHECK(std::abs(peak - measured.at(mode)) / measured.at(mode) < 0.01);
    for (const auto& u : m.at("step_time").at("unsure"))
      CHECK(u.get<std::string>().find("this run uses none") == std::string::npos);
  }
}

TEST_CASE("--calibrate on the CPU writes a profile that --plan reads back") {
  const fs::path dir = fs::temp_directory_path() / "calibrate";
  fs::create_directories(dir);
  const fs::path out = dir / "cpu.toml";
  const std::string bin = PRIMECFG_TRAIN_BIN;
  const std::string common = " --data.seq-len=64 --data.batch-size=1 --data.micro-batch-size=1";
  // A config that resumes a run still calibrates: the block runs start fresh.
  REQUIRE(std::system((bin + " --device=cpu --calibrate=" + out.string() + common +
                       " --ckpt.interval=5 --resume.step=5 2>" + (dir / "log").string())
                          .c_str()) == 0);
  const auto prof = plan::read_profile(out);
  REQUIRE(prof.gpu.blocks.size() == 1);
  CHECK(prof.gpu.blocks[0].hidden == 128);  // primecfg/tiny
  CHECK(prof.gpu.blocks[0].forward_s > 0);
  CHECK(prof.host.adamw_params_per_s > 0);
  // AdamW as a full run's pipeline ran it (the default config clips, which full refuses:
  // that run goes without).
  REQUIRE(prof.host.adamw_full_params_per_s);
  CHECK(*prof.host.adamw_full_params_per_s > 0);
  CHECK(prof.provenance.command.find("--calibrate=") != std::string::npos);
  CHECK(!prof.host.runtime_bytes);  // a CPU "device" holds the model in the same memory
  CHECK(prof.host.runtime_by_architecture.empty());
  {
    // It ends by saying what it measured, how the presets will be planned, and how to use it.
    std::ifstream in(dir / "log");
    const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(log.find("calibrate: wrote " + out.string()) != std::string::npos);
    CHECK(log.find("block: hidden 128, intermediate 384, 4/2 heads of 32, QK-norm, at 64 tokens") !=
          std::string::npos);
    CHECK(log.find("  measured: primecfg/tiny\n") != std::string::npos);
    CHECK(
        log.find("  larger than any measured block (the largest one's throughput: predicted steps likely too "
                 "long): Qwen/Qwen3-0.6B,") != std::string::npos);
    CHECK(log.find("--plan --plan-profile=" + out.string()) != std::string::npos);
  }
  REQUIRE(
      std::system((bin + " --plan --plan-profile=" + out.string() + common + " > " + (dir / "plan").string())
                      .c_str()) == 0);
  std::ifstream in(dir / "plan");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text.find("Step time, predicted") != std::string::npos);
  CHECK(text.find(out.string()) != std::string::npos);
}

TEST_CASE("--calibrate: a block run that fails is reported with its output, and no profile is written") {
  const fs::path dir = fs::temp_directory_path() / "calibrate-fails";
  primecfg::train::remove_tree(dir);
  fs::create_directories(dir);
  const fs::path out = dir / "cpu.toml";
  const std::string bin = PRIMECFG_TRAIN_BIN;
  const int rc =
      std::system((bin + " --device=cpu --calibrate=" + out.string() +
                   " --data.seq-len=64 --calibrate-models='[\"/no/such/model\"]' 2>" + (dir / "log").string())
                      .c_str());
  CHECK(rc != 0);
  std::ifstream in(dir / "log");
  const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(log.find("calibration run exited with 1") != std::string::npos);
  CHECK(log.find("--model.name=/no/such/model") != std::string::npos);
  CHECK(log.find("neither a preset") != std::string::npos);  // the child's own error
  CHECK(!fs::exists(out));
}

TEST_CASE(
    "--calibrate on the CPU times a Qwen3-MoE block under its own key, which --plan then finds measured") {
  const fs::path dir = fs::temp_directory_path() / "calibrate-moe";
  fs::create_directories(dir);
  const fs::path out = dir / "cpu.toml";
  const std::string bin = PRIMECFG_TRAIN_BIN;
  const std::string model =
      " --model.name=primecfg/tiny-moe --data.seq-len=64 --data.batch-size=1 --data.micro-batch-size=1";
  REQUIRE(
      std::system((bin + " --device=cpu --calibrate=" + out.string() + model + " 2>" + (dir / "log").string())
                      .c_str()) == 0);
  const auto prof = plan::read_profile(out);
  REQUIRE(prof.gpu.blocks.size() == 1);
  const auto& b = prof.gpu.blocks[0];
  CHECK(b.architecture == "qwen3_moe");
  CHECK(b.experts == 8);
  CHECK(b.top_k == 2);
  CHECK(b.moe_intermediate == 96);
  const auto tiny_moe = train::preset("primecfg/tiny-moe");
  REQUIRE(tiny_moe);
  CHECK(plan::block_coverage(prof, *tiny_moe) == plan::Coverage::measured);
  CHECK(plan::block_coverage(prof, *train::preset("primecfg/tiny")) != plan::Coverage::measured);
}
