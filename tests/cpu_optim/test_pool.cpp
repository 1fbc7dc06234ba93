// ThreadPool tests (no LibTorch): sizing from the CPU affinity, coverage of the range, exceptions,
// nesting, binding, and the parallel kernels against the single-threaded ones.
#include <doctest/doctest.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "optim/cpu/cpu_optim.hpp"

namespace cpu = primecfg::train::cpu;

TEST_CASE("ThreadPool sizes itself from the CPU affinity, not OMP_NUM_THREADS") {
  setenv("OMP_NUM_THREADS", "1", 1);
  cpu::ThreadPool pool(0);
  CHECK(pool.size() == static_cast<int>(cpu::allowed_cpus().size()));
  cpu::ThreadPool three(3);
  CHECK(three.size() == 3);
  unsetenv("OMP_NUM_THREADS");
}

TEST_CASE("parallel_for covers the range exactly once, in grain-aligned pieces") {
  cpu::ThreadPool pool(4);  // more threads than this machine may have cores: still correct
  for (std::int64_t n : {0, 1, 5, 63, 64, 65, 1000, 100003}) {
    for (std::int64_t grain : {0, 1, 16, 64, 1000}) {
      CAPTURE(n);
      CAPTURE(grain);
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
      std::atomic<bool> misaligned{false};
      pool.parallel_for(n, grain, [&](std::int64_t b, std::int64_t e) {
        if (grain > 0 && b % grain != 0) misaligned = true;
        for (std::int64_t i = b; i < e; ++i) hits[static_cast<std::size_t>(i)].fetch_add(1);
      });
      CHECK_FALSE(misaligned.load());
      std::int64_t wrong = 0;
      for (auto& h : hits) wrong += h.load() != 1;
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("parallel_for uses the workers and survives many back-to-back calls") {
  cpu::ThreadPool pool(3);
  std::mutex mu;
  std::set<std::thread::id> seen;
  std::int64_t total = 0;
  for (int call = 0; call < 2000; ++call) {
    std::atomic<std::int64_t> sum{0};
    pool.parallel_for(4096, 64, [&](std::int64_t b, std::int64_t e) {
      sum += e - b;
      if (call % 100 == 0) {
        std::lock_guard<std::mutex> lock(mu);
        seen.insert(std::this_thread::get_id());
      }
    });
    total += sum.load();
  }
  CHECK(total == 2000 * 4096);
  CHECK(seen.size() >= 1);  // which threads get pieces is up to the scheduler
}

TEST_CASE("parallel_for rethrows the first exception and stays usable") {
  cpu::ThreadPool pool(3);
  CHECK_THROWS_AS(pool.parallel_for(10000, 10,
                                    [](std::int64_t b, std::int64_t) {
                                      if (b >= 5000) throw std::runtime_error("piece failed");
                                    }),
                  std::runtime_error);
  std::atomic<std::int64_t> sum{0};
  pool.parallel_for(10000, 10, [&](std::int64_t b, std::int64_t e) { sum += e - b; });
  CHECK(sum.load() == 10000);
}

TEST_CASE("nested parallel_for runs inline instead of deadlocking") {
  cpu::ThreadPool pool(2);
  std::atomic<std::int64_t> sum{0};
  pool.parallel_for(1000, 10, [&](std::int64_t b, std::int64_t e) {
    pool.parallel_for(e - b, 1, [&](std::int64_t ib, std::int64_t ie) { sum += ie - ib; });
  });
  CHECK(sum.load() == 1000);
}

TEST_CASE("a bound pool runs its workers on the given CPUs") {
  const std::vector<int> allowed = cpu::allowed_cpus();
  cpu::ThreadPoolOptions opt;
  opt.threads = 3;
  opt.cpus = {allowed.front()};
  cpu::ThreadPool pool(opt);
  CHECK(pool.bound_cpus() == std::vector<int>{allowed.front()});
  std::atomic<bool> wrong{false};
  const std::thread::id caller = std::this_thread::get_id();
  for (int round = 0; round < 20; ++round) {
    pool.parallel_for(64, 1, [&](std::int64_t, std::int64_t) {
      if (std::this_thread::get_id() != caller && sched_getcpu() != allowed.front()) wrong = true;
    });
  }
  CHECK_FALSE(wrong.load());

  // CPUs the process may not use are dropped; none left -> unbound.
  cpu::ThreadPoolOptions bad;
  bad.threads = 2;
  bad.cpus = {1 << 19};
  cpu::ThreadPool unbound(bad);
  CHECK(unbound.bound_cpus().empty());
  CHECK(unbound.size() == 2);
}

TEST_CASE("parallel kernels equal the single-threaded kernels bit for bit") {
  const std::int64_t n = 1000003;
  const std::size_t un = static_cast<std::size_t>(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> p0(un), m0(un), v0(un, 1e-6f);
  std::vector<std::uint16_t> g(un);
  for (std::size_t i = 0; i < un; ++i) {
    p0[i] = d(rng);
    m0[i] = 0.01f * d(rng);
    g[i] = cpu::float_to_bf16(d(rng));
  }
  cpu::ThreadPool pool(3);
  const cpu::AdamWStep s{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 4, 1.0f};
  std::vector<float> pa = p0, ma = m0, va = v0, pb = p0, mb = m0, vb = v0;
  std::vector<std::uint16_t> oa(un), ob(un);
  cpu::adamw(pa.data(), ma.data(), va.data(), g.data(), oa.data(), n, s);
  cpu::parallel_adamw(pool, pb.data(), mb.data(), vb.data(), g.data(), ob.data(), n, s, 1024);
  CHECK(std::memcmp(pa.data(), pb.data(), un * 4) == 0);
  CHECK(std::memcmp(ma.data(), mb.data(), un * 4) == 0);
  CHECK(std::memcmp(va.data(), vb.data(), un * 4) == 0);
  CHECK(oa == ob);
  std::vector<float> sa = p0, sb = p0;
  cpu::sign_sgd(sa.data(), g.data(), oa.data(), n, {1e-3f, 0.1f, 1.0f});
  cpu::parallel_sign_sgd(pool, sb.data(), g.data(), ob.data(), n, {1e-3f, 0.1f, 1.0f});
  CHECK(std::memcmp(sa.data(), sb.data(), un * 4) == 0);
  CHECK(oa == ob);
}
