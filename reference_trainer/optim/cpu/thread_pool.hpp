// A small persistent thread pool for memory-bound loops (the CPU optimizer of FullOffload).
//
// Workers are created once and sleep on a futex (std::atomic::wait) after a short spin; a call to
// parallel_for wakes them, hands out pieces of the range from an atomic counter, and returns when all
// pieces are done. The calling thread works too. Nothing is allocated per call.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace primecfg::train::cpu {

// The logical CPUs this process may run on (sched_getaffinity), in increasing order. Never empty: when
// the affinity cannot be read, falls back to 0 .. hardware_concurrency-1.
std::vector<int> allowed_cpus();

struct ThreadPoolOptions {
  // Total threads working in parallel_for, the caller included. <= 0: one per CPU the pool may use
  // (the `cpus` list when given, else the CPUs of allowed_cpus()). OMP_NUM_THREADS is ignored on
  // purpose (torchrun sets it to 1).
  int threads = 0;
  // When not empty: the workers run only on these OS CPU indices (e.g. the CPUs of the GPU's NUMA node
  // from numa::find_gpu_binding). CPUs the process may not use are dropped; if none remain, the pool
  // is left unbound.
  std::vector<int> cpus;
  // With `cpus` (or a bound pool): true pins worker i to one CPU (round robin over the list); false
  // lets every worker float over the whole list. The calling thread is never re-bound.
  bool pin_each_worker = false;
  // Pause-loop iterations a worker spins for new work before it sleeps (0: sleep at once).
  int spin_iterations = 4000;
  // parallel_for cuts a range into about this many pieces per thread (>= 1): more pieces balance the
  // load when a core is disturbed, fewer keep each thread's memory streams longer.
  int pieces_per_thread = 4;
};

class ThreadPool {
 public:
  // threads <= 0: one thread per CPU this process may run on (sched_getaffinity).
  explicit ThreadPool(int threads = 0);
  explicit ThreadPool(const ThreadPoolOptions& options);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Calls fn(begin, end) on disjoint pieces covering [0, n). Every `begin` is a multiple of `grain`
  // (grain <= 0 counts as 1) and every piece but the last holds a multiple of `grain` elements. Runs
  // inline when n <= grain, when the pool has one thread, or when called from inside one of this pool's
  // pieces (no nested parallelism). Calls from several threads are serialized. The first exception
  // thrown by fn is rethrown here after all pieces finished or were skipped.
  void parallel_for(std::int64_t n, std::int64_t grain,
                    const std::function<void(std::int64_t begin, std::int64_t end)>& fn);

  // Threads that work in parallel_for (workers + the caller).
  int size() const noexcept { return static_cast<int>(workers_.size()) + 1; }
  // The CPUs the workers are bound to (empty: unbound).
  const std::vector<int>& bound_cpus() const noexcept { return bound_cpus_; }

 private:
  void worker_main(int index);
  void run_pieces();

  std::vector<std::thread> workers_;
  std::vector<int> bound_cpus_;
  int spin_iterations_ = 0;
  int pieces_per_thread_ = 4;

  std::mutex call_mutex_;  // one parallel_for at a time
  // Job description, written by the caller before `generation_` is bumped (release).
  const std::function<void(std::int64_t, std::int64_t)>* fn_ = nullptr;
  std::int64_t n_ = 0;
  std::int64_t piece_ = 0;
  std::int64_t pieces_ = 0;
  alignas(64) std::atomic<std::int64_t> next_piece_{0};
  alignas(64) std::atomic<std::uint64_t> generation_{0};
  alignas(64) std::atomic<int> busy_workers_{0};
  std::atomic<bool> failed_{false};
  std::atomic<bool> stop_{false};
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

}  // namespace primecfg::train::cpu
