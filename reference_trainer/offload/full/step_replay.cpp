// The replay of step_replay.hpp: two actors, the GPU (its forward, then its backward
// handing gradients over) and the CPU worker (one job at a time), each advanced only
// as far as what it depends on is known, the one behind in time first.
#include "offload/full/step_replay.hpp"

#include <algorithm>
#include <cstddef>
#include <limits>

namespace primecfg::train::plan::detail {

namespace {

constexpr int kSteps = 6;  // the period is read between the last two backwards
constexpr double kNever = std::numeric_limits<double>::infinity();

struct Job {
  int group = 0;
  double landed = 0;  // its copy is in host memory
  double work = 0;    // seconds of update
  double done = kNever;
  bool filler = false;
};

// The gradient staging ring: ranges taken in hand-over order and given back oldest
// first, each once it and every older one were read (worker.cpp, release_in_order_locked).
class Ring {
 public:
  explicit Ring(double capacity) : capacity_(capacity) {}
  void take(std::size_t job, double bytes) {
    jobs_.push_back(job);
    taken_.push_back((taken_.empty() ? 0 : taken_.back()) + bytes);
  }
  // Jobs done so far (done[j] of the replay's jobs): extends the prefix given back.
  void advance(const std::vector<Job>& all) {
    while (given_back_.size() < jobs_.size() && all[jobs_[given_back_.size()]].done != kNever)
      given_back_.push_back(
          std::max(given_back_.empty() ? 0 : given_back_.back(), all[jobs_[given_back_.size()]].done));
  }
  // The earliest time from `now` with `bytes` free, from what is given back so far;
  // kNever while that depends on jobs not done yet.
  double room_at(double now, double bytes) const {
    const double need = (taken_.empty() ? 0 : taken_.back()) + bytes - capacity_;
    if (need <= 0) return now;
    const auto k =
        static_cast<std::size_t>(std::lower_bound(taken_.begin(), taken_.end(), need) - taken_.begin());
    return k < given_back_.size() ? std::max(now, given_back_[k]) : kNever;
  }

 private:
  double capacity_;
  std::vector<std::size_t> jobs_;   // in hand-over order
  std::vector<double> taken_;       // bytes taken up to and including each
  std::vector<double> given_back_;  // per job of the done prefix: when its range is free
};

// One GPU operation: a group's forward (after its last update's upload), a backward
// (compute only), or handing a group's gradients over (ring room first).
struct Op {
  enum class Kind { forward, backward, hand_over } kind;
  int group = 0;
};

class Replay {
 public:
  explicit Replay(const ReplayInputs& in)
      : in_(in), ring_(in.ring_bytes), ready_(in.groups.size(), 0.0), pending_(in.groups.size(), 0) {
    const int G = static_cast<int>(in.groups.size());
    for (int g = 0; g < G; ++g) ops_.push_back({Op::Kind::forward, g});
    for (int g = G - 1; g >= 0; --g) {
      ops_.push_back({Op::Kind::backward, g});
      ops_.push_back({Op::Kind::hand_over, g});
    }
  }

  ReplayResult run() {
    // Read at the start of each backward (its first op never waits).
    const std::size_t first_backward = in_.groups.size();
    std::vector<double> starts, busy_at, wait_at, ring_at;
    while (step_ < kSteps) {
      if (!gpu_blocked_ && gpu_t_ <= worker_t_) {
        if (op_ == first_backward) {
          starts.push_back(gpu_t_);
          busy_at.push_back(cpu_busy_), wait_at.push_back(forward_wait_), ring_at.push_back(ring_wait_);
        }
        if (gpu_step()) continue;
        gpu_blocked_ = true;
      }
      if (worker_step()) {
        gpu_blocked_ = false;  // what the GPU waited for may be known now
        continue;
      }
      if (gpu_blocked_) return {};  // neither can move: inputs it cannot replay
      worker_t_ = gpu_t_;           // nothing handed over: the worker waits for the GPU
    }
    const std::size_t n = starts.size();
    ReplayResult r;
    if (n < 2) return r;
    r.replayed = true;
    r.step = starts[n - 1] - starts[n - 2];
    r.cpu_busy = busy_at[n - 1] - busy_at[n - 2];
    r.forward_wait = wait_at[n - 1] - wait_at[n - 2];
    r.ring_wait = ring_at[n - 1] - ring_at[n - 2];
    return r;
  }

 private:
  const ReplayInputs& in_;
  Ring ring_;
  std::vector<Op> ops_;
  std::size_t op_ = 0;
  int step_ = 0;
  double gpu_t_ = 0, worker_t_ = 0, d2h_t_ = 0, h2d_t_ = 0;
  bool gpu_blocked_ = false;
  double ring_blocked_since_ = kNever;  // a hook waits for staging room from then on
  std::vector<Job> jobs_;               // every step's, in hand-over order
  std::vector<std::size_t> open_;       // jobs not done, in hand-over order
  std::vector<double> ready_;           // per group: its last update uploaded
  std::vector<int> pending_;            // per group: jobs of the last backward not done
  std::size_t handed_ = 0;              // jobs of the group being handed over so far
  double cpu_busy_ = 0, forward_wait_ = 0, ring_wait_ = 0;

  bool gpu_step() {
    const Op& op = ops_[op_];
    const auto gi = static_cast<std::size_t>(op.group);
    const ReplayGroup& g = in_.groups[gi];
    switch (op.kind) {
      case Op::Kind::forward: {
        if (pending_[gi] > 0) return false;  // its deferred updates are not all done
        const double start = std::max(gpu_t_, ready_[gi]);
        forward_wait_ += start - gpu_t_;
        gpu_t_ = start + g.forward_s;
        break;
      }
      case Op::Kind::backward:
        gpu_t_ += g.backward_s;
        break;
      case Op::Kind::hand_over:
        if (!hand_over(gi)) return false;
        break;
    }
    if (++op_ == ops_.size()) {
      op_ = 0;
      ++step_;
    }
    return true;
  }

  // The hooks of a group's parameters, one after the other: each takes ring room
  // (waiting for it) and queues its copy. False while the next one's room is not
  // known; the ones before it stay handed over.
  bool hand_over(std::size_t gi) {
    const ReplayGroup& g = in_.groups[gi];
    if (handed_ == 0) ready_[gi] = 0;
    for (; handed_ < g.jobs.size(); ++handed_) {
      const double params = g.jobs[handed_];
      if (g.in_ring) {
        const double room = ring_.room_at(gpu_t_, params * g.copy_bytes);
        if (room == kNever) {
          ring_blocked_since_ = std::min(ring_blocked_since_, gpu_t_);
          return false;
        }
        ring_wait_ += room - gpu_t_;
        gpu_t_ = room;
        ring_blocked_since_ = kNever;
        ring_.take(jobs_.size(), params * g.copy_bytes);
      }
      d2h_t_ = std::max(gpu_t_, d2h_t_) + params * g.copy_bytes / in_.d2h_bytes_per_s;
      open_.push_back(jobs_.size());
      jobs_.push_back(Job{static_cast<int>(gi), d2h_t_, params / in_.cpu_params_per_s, kNever, g.filler});
      ++pending_[gi];
    }
    handed_ = 0;
    return true;
  }

  // The worker's next job (worker.cpp, next_work_locked): the oldest when a hook waits
  // for ring room; else, of the landed ones, the one the next forward reads first;
  // the filler only when nothing else has landed. False when it cannot choose yet.
  bool worker_step() {
    // Its choice at worker_t_ needs every hand-over up to then.
    if (!gpu_blocked_ && gpu_t_ < worker_t_) return false;
    const bool ring_waits = ring_blocked_since_ <= worker_t_;
    std::size_t pick = 0;
    bool found = false;
    double next_landing = kNever;
    for (std::size_t k = 0; k < open_.size(); ++k) {
      const Job& j = jobs_[open_[k]];
      if (ring_waits && !j.filler) {
        pick = k, found = true;  // the oldest, landed or not
        break;
      }
      if (j.landed > worker_t_) {
        next_landing = std::min(next_landing, j.landed);
        continue;
      }
      const Job* p = found ? &jobs_[open_[pick]] : nullptr;
      if (!p || (p->filler && !j.filler) || (p->filler == j.filler && j.group < p->group))
        pick = k, found = true;
    }
    if (!found) {
      if (next_landing == kNever) return false;
      worker_t_ = next_landing;
      return true;
    }
    Job& j = jobs_[open_[pick]];
    open_.erase(open_.begin() + static_cast<std::ptrdiff_t>(pick));
    j.done = std::max(worker_t_, j.landed) + j.work;
    cpu_busy_ += j.work;
    worker_t_ = j.done;
    ring_.advance(jobs_);
    // Its upload queues behind the others on the one host-to-device stream.
    const auto g = static_cast<std::size_t>(j.group);
    h2d_t_ = std::max(h2d_t_, j.done) +
             j.work * in_.cpu_params_per_s * in_.groups[g].upload_bytes / in_.h2d_bytes_per_s;
    ready_[g] = std::max(ready_[g], h2d_t_);
    --pending_[g];
    return true;
  }
};

}  // namespace

ReplayResult replay_full_step(const ReplayInputs& in) {
  if (in.groups.empty() || in.cpu_params_per_s <= 0 || in.d2h_bytes_per_s <= 0 || in.h2d_bytes_per_s <= 0)
    return {};
  return Replay(in).run();
}

}  // namespace primecfg::train::plan::detail
