#include "optim/cpu/thread_pool.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace primecfg::train::cpu {
namespace {

// The pool whose piece the current thread is running (nested calls run inline).
thread_local const ThreadPool* t_running_pool = nullptr;

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Calls f(cpu_set_t*, size) with a CPU set big enough for this machine.
template <class F>
bool with_affinity_set(F&& f) {
  for (int ncpus = 1024; ncpus <= (1 << 20); ncpus *= 2) {
    cpu_set_t* set = CPU_ALLOC(ncpus);
    if (set == nullptr) return false;
    const std::size_t size = CPU_ALLOC_SIZE(ncpus);
    CPU_ZERO_S(size, set);
    const int rc = f(set, size, ncpus);
    CPU_FREE(set);
    if (rc == 0) return true;
    if (rc != EINVAL) return false;
  }
  return false;
}

bool bind_thread_to(pthread_t thread, const std::vector<int>& cpus) {
  if (cpus.empty()) return true;
  const int max_cpu = *std::max_element(cpus.begin(), cpus.end());
  const int ncpus = std::max(1024, max_cpu + 1);
  cpu_set_t* set = CPU_ALLOC(ncpus);
  if (set == nullptr) return false;
  const std::size_t size = CPU_ALLOC_SIZE(ncpus);
  CPU_ZERO_S(size, set);
  for (int cpu : cpus) CPU_SET_S(static_cast<std::size_t>(cpu), size, set);
  const int rc = pthread_setaffinity_np(thread, size, set);
  CPU_FREE(set);
  return rc == 0;
}

}  // namespace

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  with_affinity_set([&](cpu_set_t* set, std::size_t size, int ncpus) -> int {
    if (sched_getaffinity(0, size, set) != 0) return errno;
    for (int cpu = 0; cpu < ncpus; ++cpu) {
      if (CPU_ISSET_S(static_cast<std::size_t>(cpu), size, set)) cpus.push_back(cpu);
    }
    return 0;
  });
  if (cpus.empty()) {
    const unsigned hc = std::max(1u, std::thread::hardware_concurrency());
    for (unsigned i = 0; i < hc; ++i) cpus.push_back(static_cast<int>(i));
  }
  return cpus;
}

ThreadPool::ThreadPool(int threads) : ThreadPool(ThreadPoolOptions{threads, {}, false, 4000, 4}) {}

ThreadPool::ThreadPool(const ThreadPoolOptions& options)
    : spin_iterations_(std::max(0, options.spin_iterations)),
      pieces_per_thread_(std::max(1, options.pieces_per_thread)) {
  const std::vector<int> allowed = allowed_cpus();
  if (!options.cpus.empty()) {
    for (int cpu : options.cpus) {
      if (std::find(allowed.begin(), allowed.end(), cpu) != allowed.end() &&
          std::find(bound_cpus_.begin(), bound_cpus_.end(), cpu) == bound_cpus_.end()) {
        bound_cpus_.push_back(cpu);
      }
    }
    std::sort(bound_cpus_.begin(), bound_cpus_.end());
  }
  int total = options.threads;
  if (total <= 0) total = static_cast<int>(bound_cpus_.empty() ? allowed.size() : bound_cpus_.size());
  total = std::max(1, total);

  workers_.reserve(static_cast<std::size_t>(total - 1));
  for (int i = 0; i < total - 1; ++i) {
    workers_.emplace_back([this, i] { worker_main(i); });
    if (!bound_cpus_.empty()) {
      if (options.pin_each_worker) {
        // Worker i gets CPU i+1 of the list (the caller usually sits on or near the first one).
        const int cpu = bound_cpus_[static_cast<std::size_t>(i + 1) % bound_cpus_.size()];
        bind_thread_to(workers_.back().native_handle(), {cpu});
      } else {
        bind_thread_to(workers_.back().native_handle(), bound_cpus_);
      }
    }
  }
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_main(int /*index*/) {
  t_running_pool = this;
  std::uint64_t seen = 0;
  for (;;) {
    std::uint64_t g = generation_.load(std::memory_order_acquire);
    for (int k = 0; g == seen && k < spin_iterations_; ++k) {
      cpu_relax();
      g = generation_.load(std::memory_order_acquire);
    }
    while (g == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load(std::memory_order_relaxed)) return;
    run_pieces();
    if (busy_workers_.fetch_sub(1, std::memory_order_acq_rel) == 1) busy_workers_.notify_one();
  }
}

void ThreadPool::run_pieces() {
  const ThreadPool* outer = t_running_pool;
  t_running_pool = this;
  for (;;) {
    const std::int64_t i = next_piece_.fetch_add(1, std::memory_order_relaxed);
    if (i >= pieces_) break;
    if (failed_.load(std::memory_order_relaxed)) continue;
    const std::int64_t begin = i * piece_;
    const std::int64_t end = std::min(n_, begin + piece_);
    try {
      (*fn_)(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
    }
  }
  t_running_pool = outer;
}

void ThreadPool::parallel_for(std::int64_t n, std::int64_t grain,
                              const std::function<void(std::int64_t, std::int64_t)>& fn) {
  if (n <= 0) return;
  if (grain <= 0) grain = 1;
  if (n <= grain || workers_.empty() || t_running_pool == this) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mutex_);
  // A few pieces per thread balance the load when a core is disturbed (DMA, other threads) while
  // keeping pieces long enough for the hardware prefetchers.
  const std::int64_t grains = (n + grain - 1) / grain;
  const std::int64_t want =
      std::min<std::int64_t>(grains, static_cast<std::int64_t>(size()) * pieces_per_thread_);
  const std::int64_t grains_per_piece = (grains + want - 1) / want;
  piece_ = grains_per_piece * grain;
  pieces_ = (n + piece_ - 1) / piece_;
  n_ = n;
  fn_ = &fn;
  error_ = nullptr;
  failed_.store(false, std::memory_order_relaxed);
  next_piece_.store(0, std::memory_order_relaxed);
  busy_workers_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();

  run_pieces();

  int busy = busy_workers_.load(std::memory_order_acquire);
  for (int k = 0; busy != 0 && k < spin_iterations_ + 1000; ++k) {
    cpu_relax();
    busy = busy_workers_.load(std::memory_order_acquire);
  }
  while (busy != 0) {
    busy_workers_.wait(busy, std::memory_order_acquire);
    busy = busy_workers_.load(std::memory_order_acquire);
  }
  fn_ = nullptr;
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace primecfg::train::cpu
