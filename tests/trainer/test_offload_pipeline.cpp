// The FullOffload host pipeline on the CPU (the same code that runs beside a GPU):
// the staging ring's allocation order, and a run whose staging ring holds only one
// gradient at a time, which makes the backward hooks wait for the CPU worker at
// almost every parameter. The result must not change, bit for bit.
#include "base/remove_tree.hpp"
#include "base/staging_ring.hpp"
#include "base/strict_json.hpp"
#include "base/task_thread.hpp"
#include "offload/full/host_grads.hpp"
#include "optim/update_groups.hpp"
#include "test_seams.hpp"
#include "trainer.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using namespace primecfg;
using primecfg::train::StagingRing;

TEST_CASE("staging ring: FIFO ranges, wrap-around, never overlapping, released in order") {
  StagingRing ring(1024, 64);
  auto a = ring.try_acquire(300);  // [0, 320)
  auto b = ring.try_acquire(300);  // [320, 640)
  auto c = ring.try_acquire(300);  // [640, 960)
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE(c);
  CHECK(a->offset == 0);
  CHECK(b->offset == 320);
  CHECK(c->offset == 640);
  CHECK_FALSE(ring.try_acquire(100));                   // 64 bytes left at the end, nothing at the start
  CHECK_THROWS_AS(ring.release(*b), std::logic_error);  // out of order
  ring.release(*a);
  auto d = ring.try_acquire(200);  // wraps to the start
  REQUIRE(d);
  CHECK(d->offset == 0);
  CHECK_FALSE(ring.try_acquire(200));  // [256, 320) is only 64 bytes
  ring.release(*b);
  auto e = ring.try_acquire(300);  // [256, 576): between d and c
  REQUIRE(e);
  CHECK(e->offset == 256);
  CHECK_THROWS_AS(ring.try_acquire(2000), std::length_error);
  ring.release(*c);
  ring.release(*d);
  ring.release(*e);
  CHECK(ring.empty());
  CHECK(ring.in_use() == 0);

  // Random sizes: live ranges never overlap and stay inside the buffer.
  StagingRing r2(10000, 16);
  std::deque<StagingRing::Range> live;
  unsigned x = 12345;
  for (int i = 0; i < 20000; ++i) {
    x = x * 1103515245u + 12345u;
    std::size_t want = 1 + (x >> 8) % 4000;
    if (auto got = r2.try_acquire(want)) {
      CHECK(got->offset + want <= 10000);
      for (const auto& l : live) {
        const bool apart = got->offset + want <= l.offset || l.offset + l.bytes <= got->offset;
        if (!apart) FAIL("overlap");
      }
      live.push_back(*got);
    } else {
      REQUIRE_FALSE(live.empty());  // an empty ring always has room for <= capacity
      r2.release(live.front());
      live.pop_front();
    }
  }
}

// The tiny model under FullOffload on reverse-text, 4 rows of 48 tokens per step in
// micro-batches of `micro`, AdamW without clipping (FullOffload cannot clip).
static SFTConfig tiny_full(int micro, std::int64_t seed, int steps, const fs::path& out) {
  SFTConfig c;
  c.model.name = "primecfg/tiny";
  c.model.offload = Offload::full;
  c.model.compile = std::nullopt;
  c.clean = true;  // variants of one run share folders
  SFTDataConfig d;
  d.seq_len = 48;
  d.batch_size = 4;
  d.micro_batch_size = micro;
  d.seed = seed;
  c.data = d;
  AdamWConfig a;
  a.lr = 2e-3;
  a.max_norm = std::nullopt;
  c.optim = a;
  c.max_steps = steps;
  c.output_dir = out;
  return c;
}

// The upload thread of FullOffload: a job counts as done only when the task that
// says so runs after its upload, so the order of posting must be the order of running.
TEST_CASE("task thread: runs tasks in posting order, goes on after a throwing task, drains when destroyed") {
  std::vector<int> ran;  // written only by the task thread until it is joined
  std::vector<std::string> errors;
  std::atomic<bool> started{false};
  {
    train::TaskThread t(
        [&](std::exception_ptr e) {
          try {
            std::rethrow_exception(e);
          } catch (const std::exception& x) {
            errors.push_back(x.what());
          }
        },
        [&] { started = true; });
    for (int i = 0; i < 200; ++i) {
      if (i == 50) t.post([] { throw std::runtime_error("task 50 failed"); });
      t.post([&ran, i] {
        if (i % 64 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // let posts pile up
        ran.push_back(i);
      });
    }
  }  // the destructor runs what is left
  CHECK(started);
  REQUIRE(ran.size() == 200);
  for (int i = 0; i < 200; ++i) CHECK(ran[static_cast<std::size_t>(i)] == i);
  REQUIRE(errors.size() == 1);
  CHECK(errors[0] == "task 50 failed");
}

// OptimizerOffload's update groups (the GPU test checks the grouped update itself
// against NoOffload bit for bit).
TEST_CASE("update groups: a block's consecutive parameters, closed at the byte limit") {
  using G = std::vector<std::vector<std::size_t>>;
  // embedding, two blocks of three, final norm
  CHECK(train::update_groups({-1, 0, 0, 0, 1, 1, 1, -1}, {10, 10, 10, 10, 10, 10, 10, 10}, 100) ==
        G{{0}, {1, 2, 3}, {4, 5, 6}, {7}});
  // the limit closes a group; a parameter over the limit stands alone
  CHECK(train::update_groups({0, 0, 0}, {40, 40, 40}, 100) == G{{0, 1}, {2}});
  CHECK(train::update_groups({0, 0, 0}, {10, 150, 10}, 100) == G{{0}, {1}, {2}});
  CHECK(train::update_groups({0, 0, 0}, {50, 50, 1}, 100) == G{{0, 1}, {2}});
  // a block that is not consecutive, parameters outside blocks, nothing at all
  CHECK(train::update_groups({0, 1, 0}, {1, 1, 1}, 100) == G{{0}, {1}, {2}});
  CHECK(train::update_groups({-1, -1}, {1, 1}, 100) == G{{0}, {1}});
  CHECK(train::update_groups({}, {}, 100).empty());

  // Random layouts: a partition into runs of consecutive indices of one block, within
  // the limit unless alone.
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t n = rng() % 40;
    std::vector<int> block(n);
    std::vector<std::size_t> bytes(n);
    int b = -1;
    for (std::size_t i = 0; i < n; ++i) {
      if (rng() % 4 == 0) b = static_cast<int>(rng() % 5) - 1;
      block[i] = b;
      bytes[i] = rng() % 60;
    }
    const auto groups = train::update_groups(block, bytes, 100);
    std::size_t next = 0;
    for (const auto& g : groups) {
      REQUIRE(!g.empty());
      std::size_t sum = 0;
      for (std::size_t k = 0; k < g.size(); ++k) {
        CHECK(g[k] == next++);
        CHECK(block[g[k]] == block[g.front()]);
        sum += bytes[g[k]];
      }
      if (g.size() > 1) {
        CHECK(block[g.front()] >= 0);
        CHECK(sum <= 100);
      }
    }
    CHECK(next == n);
  }
}

TEST_CASE("full offload: a staging ring that holds one gradient gives the same run, bit for bit") {
  auto dir = fs::temp_directory_path() / ("primecfg-pipeline-test-" + std::to_string(::getpid()));
  auto config = [&](const std::string& name, int micro) { return tiny_full(micro, 5, 6, dir / name); };
  train::RunOptions o;
  o.print = false;
  o.collect_weights = true;
  o.device = "cpu";
  for (int micro : {4, 2}) {  // one micro-batch per step, then gradient accumulation
    CAPTURE(micro);
    auto roomy = train::run_sft(config("roomy", micro), o);
    auto t = o;
    t.offload.ring_mib = 1e-6;  // one byte, clamped up to the largest gradient
    t.offload.cpu_threads = 2;
    auto tight = train::run_sft(config("tight", micro), t);
    CHECK(roomy.losses == tight.losses);
    REQUIRE(roomy.weights.size() == tight.weights.size());
    for (std::size_t i = 0; i < roomy.weights.size(); ++i) {
      CAPTURE(roomy.weights[i].first);
      CHECK(roomy.weights[i].second == tight.weights[i].second);
    }
    CHECK(roomy.losses.back() < roomy.losses.front());
  }
  primecfg::train::remove_tree(dir);
}

TEST_CASE("full offload: --profile.host-trace writes a Chrome trace of the pipeline's host threads") {
  auto dir = fs::temp_directory_path() / ("primecfg-host-trace-test-" + std::to_string(::getpid()));
  primecfg::train::remove_tree(dir);
  train::RunOptions o;
  o.print = false;
  o.device = "cpu";
  o.profile.host_trace = dir / "host.json";
  train::run_sft(tiny_full(4, 3, 2, dir / "run"), o);
  std::ifstream in(dir / "host.json");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto trace = train::strict_json::parse(text);
  const auto& events = trace.at("traceEvents");
  REQUIRE(events.is_array());
  bool worker = false, hooks = false;
  for (const auto& e : events) {
    worker = worker || e.at("tid") == "worker";
    hooks = hooks || e.at("tid") == "hooks";
    CHECK(e.at("dur").get<std::int64_t>() >= 0);
  }
  CHECK(worker);
  CHECK(hooks);
  primecfg::train::remove_tree(dir);
}

static bool metrics_mention(const fs::path& out_dir, const std::string& text) {
  std::ifstream in(out_dir / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line))
    if (line.find(text) != std::string::npos) return true;
  return false;
}

// A figure of the last metrics line ("name":value), or -1 when absent.
static double last_figure(const fs::path& out_dir, const std::string& name) {
  std::ifstream in(out_dir / "metrics.jsonl");
  std::string line, last;
  while (std::getline(in, line)) last = line;
  const auto at = last.find("\"" + name + "\":");
  return at == std::string::npos ? -1 : std::stod(last.substr(at + name.size() + 3));
}

// With one micro-batch per step, FullOffload updates the tied embedding in two parts:
// the rows the batch's input ids do not touch as soon as backward starts (from the LM
// head's share of the gradient), the batch's rows after backward. Element-wise
// optimizers treat rows independently, so the split must not change a single bit, in
// FP32 and in bf16 (where the CPU writes the bf16 weights itself), for AdamW and
// SignSGD. The tiny model's batches touch most of its 260 rows; the fake data of the
// second config touches only a few, so both kinds of row runs are exercised.
// Deferring the updates that are left when backward ends into the next forward only
// changes when they run, never what they compute.
TEST_CASE(
    "full offload: the tied embedding updated in two parts, and updates deferred into the next forward, "
    "give the same run, bit for bit") {
  auto dir = fs::temp_directory_path() / ("primecfg-split-test-" + std::to_string(::getpid()));
  for (int k = 0; k < 4; ++k) {
    CAPTURE(k);
    SFTConfig c;
    c.model.name = "primecfg/tiny";
    c.model.offload = Offload::full;
    c.model.compile = std::nullopt;
    if (k % 2 == 0) {
      SFTDataConfig d;
      d.seq_len = 48;
      d.batch_size = 4;
      d.micro_batch_size = 4;
      d.seed = 9;
      c.data = d;
    } else {
      FakeDataConfig d;  // increasing ids from 0: a handful of rows, one contiguous run
      d.seq_len = 24;
      d.batch_size = 1;
      d.micro_batch_size = 1;
      c.data = d;
    }
    if (k < 2) {
      AdamWConfig a;
      a.lr = 2e-3;
      a.max_norm = std::nullopt;
      c.optim = a;
    } else {
      SignSGDConfig s;
      s.lr = 1e-3;
      s.max_norm = std::nullopt;
      c.optim = s;
    }
    c.max_steps = 5;
    for (bool bf16 : {false, true}) {
      CAPTURE(bf16);
      train::RunOptions o;
      o.print = false;
      o.collect_weights = true;
      o.device = "cpu";
      o.bf16 = bf16;
      o.offload.cpu_threads = 3;
      primecfg::train::remove_tree(dir);
      c.output_dir = dir / "split";
      train::RunResult split, deferred, held, whole;
      {
        train::TestSeams seams({.defer = false});
        split = train::run_sft(c, o);
      }
      // Deferred: what the CPU has not updated when backward ends is updated beside
      // the next forward, in reverse order, which waits block by block. With a
      // staging ring of one gradient the hooks also wait for the worker all the time.
      c.output_dir = dir / "deferred";
      {
        train::TestSeams seams({.defer = true});
        auto d = o;
        d.offload.ring_mib = 1e-6;
        deferred = train::run_sft(c, d);
      }
      // Held: the head share (the embedding rows outside the batch) waits each step
      // until the next forward names the rows its lookup reads; those are updated
      // first, the forward's lookup waits only for them, and the rest waits until the
      // loss asks for its rows, chunk by chunk (a loss that did not wait would read
      // them before their update).
      c.output_dir = dir / "held";
      {
        train::TestSeams seams({.defer = true, .hold_head_share = true});
        held = train::run_sft(c, o);
      }
      c.output_dir = dir / "whole";
      {
        train::TestSeams seams({.defer = false, .split_tied = false});
        whole = train::run_sft(c, o);
      }
      REQUIRE(split.losses.size() == 5);
      CHECK(split.losses == whole.losses);
      CHECK(deferred.losses == whole.losses);
      CHECK(held.losses == whole.losses);
      REQUIRE(split.weights.size() == whole.weights.size());
      REQUIRE(held.weights.size() == whole.weights.size());
      REQUIRE(deferred.weights.size() == whole.weights.size());
      for (std::size_t i = 0; i < split.weights.size(); ++i) {
        CAPTURE(split.weights[i].first);
        CHECK(split.weights[i].second == whole.weights[i].second);
        CHECK(split.model_weights[i].second == whole.model_weights[i].second);
        CHECK(deferred.weights[i].second == whole.weights[i].second);
        CHECK(deferred.model_weights[i].second == whole.model_weights[i].second);
        CHECK(held.weights[i].second == whole.weights[i].second);
        CHECK(held.model_weights[i].second == whole.model_weights[i].second);
      }
      CHECK(split.losses.back() < split.losses.front());
      // The split did happen: the metrics name the rows left for after backward.
      CHECK(metrics_mention(dir / "split", "\"tied_batch_rows\":"));
      CHECK_FALSE(metrics_mention(dir / "whole", "\"tied_batch_rows\":"));
      // The deferral did happen: from the second step on, the forward found updates
      // of the step before still pending and waited for them.
      CHECK(last_figure(dir / "deferred", "defer_wait_s") > 0);
      CHECK(last_figure(dir / "split", "defer_wait_s") == 0);
      // The lookup path did run: the SFT batches read rows the step before did not
      // (the fake data reads the same rows every step, so none are left for it).
      if (k % 2 == 0) CHECK(last_figure(dir / "held", "lookup_rows") > 0);
    }
  }
  primecfg::train::remove_tree(dir);
}

// Sharded (one Gloo rank of a launcher: every collective of FSDP runs), the updates
// left when backward ends still run beside the next forward. They write this rank's
// pieces of the weights, and the forward gathers a block from the pieces, the next
// block's gather started ahead: both must wait for the pieces' update. A worker slowed
// down keeps the updates behind, so that the forward does find them pending block
// after block; a gather that did not wait would read the step before's weights.
TEST_CASE("full offload, sharded: deferred updates are in the pieces before the forward gathers them") {
  auto dir = fs::temp_directory_path() / ("primecfg-defer-fsdp-test-" + std::to_string(::getpid()));
  primecfg::train::remove_tree(dir);
  for (bool bf16 : {false, true}) {
    CAPTURE(bf16);
    train::RunOptions o;
    o.print = false;
    o.collect_weights = true;
    o.device = "cpu";
    o.bf16 = bf16;
    train::RunResult plain, ranked;
    {
      train::TestSeams seams({.defer = false});
      plain = train::run_sft(tiny_full(4, 17, 5, dir / "plain"), o);
    }
    {
      train::TestSeams seams({.defer = true, .worker_delay_ms = 2});
      auto r = o;
      r.launch.launched = true;
      r.launch.master_port = 0;  // one rank: the store listens on a port the kernel picks
      ranked = train::run_sft(tiny_full(4, 17, 5, dir / "ranked"), r);
    }
    // Held (as in one process above): the head share waits until the next forward
    // names its lookup rows, which go first; the lookup reads them gathered by rows
    // (of the union of the ranks' batches), and the rest waits until the LM head's
    // gather of the whole embedding asks for it. A lookup that did not wait for its
    // rows, or read other rows than it gathered, would change the numbers.
    train::RunResult held;
    {
      train::TestSeams seams({.defer = true, .hold_head_share = true});
      auto r = o;
      r.launch.launched = true;
      r.launch.master_port = 0;  // one rank: the store listens on a port the kernel picks
      held = train::run_sft(tiny_full(4, 17, 5, dir / "held"), r);
    }
    CHECK(held.losses == plain.losses);
    REQUIRE(held.weights.size() == plain.weights.size());
    for (std::size_t i = 0; i < plain.weights.size(); ++i) {
      CAPTURE(plain.weights[i].first);
      CHECK(held.weights[i].second == plain.weights[i].second);
      CHECK(held.model_weights[i].second == plain.model_weights[i].second);
    }
    CHECK(last_figure(dir / "held", "lookup_rows") > 0);
    CHECK(last_figure(dir / "held", "fsdp_lookup_rows") > 0);
    // A staging ring asked to be as small as it can: it still holds one gradient,
    // which here is an FP32 piece, twice the bf16 tensor.
    train::RunResult one_slot;
    {
      auto r = o;
      r.launch.launched = true;
      r.launch.master_port = 0;  // one rank: the store listens on a port the kernel picks
      r.offload.ring_mib = 1e-6;
      one_slot = train::run_sft(tiny_full(4, 17, 5, dir / "one-slot"), r);
    }
    CHECK(one_slot.losses == plain.losses);
    REQUIRE(plain.losses.size() == 5);
    CHECK(ranked.losses == plain.losses);
    REQUIRE(ranked.weights.size() == plain.weights.size());
    for (std::size_t i = 0; i < plain.weights.size(); ++i) {
      CAPTURE(plain.weights[i].first);
      CHECK(ranked.weights[i].second == plain.weights[i].second);
      CHECK(ranked.model_weights[i].second == plain.model_weights[i].second);
    }
    // The deferral did happen through the sharding: the forward waited for updates.
    CHECK(last_figure(dir / "ranked", "defer_wait_s") > 0);
    // One rank gathers by copies on the compute stream, nothing ahead (2 ranks do:
    // distributed_test.py).
    CHECK(last_figure(dir / "ranked", "fsdp_gathers_ahead") == 0);
  }
  primecfg::train::remove_tree(dir);
}

// Deferred updates and checkpoints: a checkpoint taken right after a step whose updates
// were handed to the next forward must hold the state after them, and a run resumed
// from it (deferring again) goes on exactly as the uninterrupted one. On this tiny model
// the worker usually finishes before the files are written, so this checks mostly that
// the two work together (no wait left hanging, no update lost or repeated).
TEST_CASE("full offload: deferred updates finish before a checkpoint, and a resumed run continues exactly") {
  auto dir = fs::temp_directory_path() / ("primecfg-defer-ckpt-test-" + std::to_string(::getpid()));
  primecfg::train::remove_tree(dir);
  // One micro-batch per step: the updates are deferred.
  SFTConfig c = tiny_full(4, 13, 10, dir / "whole");
  c.ckpt = CheckpointConfig{};
  c.ckpt->interval = 5;
  c.ckpt->output_dir = dir / "checkpoints";
  train::RunOptions o;
  o.print = false;
  o.device = "cpu";
  o.bf16 = true;
  train::TestSeams seams({.defer = true});
  auto whole = train::run_sft(c, o);
  REQUIRE(whole.losses.size() == 10);

  auto r = c;
  r.output_dir = dir / "resumed";
  r.ckpt->interval = std::nullopt;
  r.resume = ResumeConfig{5};
  auto tail = train::run_sft(r, o);
  REQUIRE(tail.first_step == 5);
  std::vector<double> expected(whole.losses.begin() + 5, whole.losses.end());
  CHECK(tail.losses == expected);
  primecfg::train::remove_tree(dir);
}

// FullOffload's host arithmetic for several micro-batches goes through slices of a
// million elements: a gradient of a few slices, the last one short, against ATen
// on the whole tensor (the sum) and in FP64 (the sum of squares).
TEST_CASE("full offload's host gradient sum and squared norm, against torch") {
  torch::manual_seed(7);
  const std::int64_t n = 2 * (std::int64_t{1} << 20) + 4099;
  for (auto dtype : {torch::kBFloat16, torch::kFloat32}) {
    CAPTURE(dtype);
    torch::Tensor g = torch::randn({n / 1031, 1031}).to(dtype), acc = torch::randn({n / 1031, 1031});
    const torch::Tensor expected = acc + g.to(torch::kFloat32);
    train::accumulate_grad(acc, g);
    CHECK(torch::equal(acc, expected));  // the same FP32 add per element
    const double exact = g.to(torch::kFloat64).square().sum().item<double>();
    CHECK(train::squared_norm(g) == doctest::Approx(exact).epsilon(1e-6));
  }
}
