// The replay of step_replay.hpp: the groups in hook order, each one's upload, update and
// write-back timed from what it waits for. Every wait points back to a group already
// timed (an upload waits for room that older groups free), so one pass a step suffices.
#include "offload/optimizer/step_replay.hpp"

#include <algorithm>
#include <cstddef>

namespace primecfg::train::plan::detail {

namespace {

// The period: the mean of the last kRead steps (a few groups can alternate between two
// step lengths; a model's hundreds settle).
constexpr int kSteps = 8, kRead = 4;

// The window's ranges, taken in fetch order across steps and given back oldest first
// (OptimizerOffloadPipeline::fetch waits for the oldest entry's write-back).
class Window {
 public:
  explicit Window(double capacity) : capacity_(capacity) {}
  // When `bytes` more fit: once every range older than the room needed is given back.
  // Takes the range; its free time comes later (free()).
  double take(double bytes) {
    const double end = (taken_.empty() ? 0 : taken_.back()) + bytes;
    const double need = end - capacity_;
    double at = 0;
    for (; given_ < taken_.size() && (given_ == 0 ? 0 : taken_[given_ - 1]) < need; ++given_)
      latest_ = std::max(latest_, free_[given_]);
    if (need > 0) at = latest_;
    taken_.push_back(end);
    free_.push_back(0);
    return at;
  }
  void free(std::size_t entry, double at) { free_[entry] = at; }
  std::size_t entries() const { return taken_.size(); }

 private:
  double capacity_;
  std::vector<double> taken_;  // bytes taken up to and including each range
  std::vector<double> free_;   // when each range is given back
  std::size_t given_ = 0;      // ranges given back for earlier takes
  double latest_ = 0;          // the latest free time among them
};

}  // namespace

MomentReplayResult replay_optimizer_step(const MomentReplayInputs& in) {
  MomentReplayResult r;
  if (in.groups.empty() || in.h2d_bytes_per_s <= 0 || in.d2h_bytes_per_s <= 0 || in.update_params_per_s <= 0)
    return r;
  for (const auto& g : in.groups)
    if (g.bytes > in.window_bytes) return r;
  auto up_s = [&](const MomentGroup& g) { return g.bytes / in.h2d_bytes_per_s + g.copies * in.copy_s; };
  auto down_s = [&](const MomentGroup& g) { return g.bytes / in.d2h_bytes_per_s + g.copies * in.copy_s; };

  Window window(in.window_bytes);
  std::vector<std::size_t> entry(in.groups.size());
  std::vector<double> written(in.groups.size(), 0);  // each group's last write-back landed
  double start = 0;                                  // this step's forward
  double h2d = 0, d2h = 0;                           // each direction busy until
  std::vector<double> starts, update_wait, room_wait;
  double waited = 0, roomed = 0;
  bool tail_pending = false;  // the tail's write-back of the step before is due
  for (int step = 0; step < kSteps; ++step) {
    starts.push_back(start), update_wait.push_back(waited), room_wait.push_back(roomed);
    // The write-backs held by the step before, queued at its end: the tail's first.
    d2h = std::max(d2h, start);
    double tail_written = start;
    if (tail_pending) tail_written = d2h += down_s(in.tail);
    if (step > 0)
      for (std::size_t g = 0; g < in.groups.size(); ++g)
        if (in.groups[g].deferred) window.free(entry[g], written[g] = d2h += down_s(in.groups[g]));
    // The uploads, from the forward's start, in hook order; the tail's on a stream of its
    // own, sharing the link: it goes in as soon as its write-back has landed.
    h2d = std::max(h2d, start);
    bool tail_up = in.tail.bytes <= 0;
    double tail_ready = start;
    auto upload_tail = [&](double at) {
      tail_ready = h2d = std::max(h2d, at) + up_s(in.tail);
      tail_up = true;
    };
    double gpu = start + in.forward_s;
    for (std::size_t g = 0; g < in.groups.size(); ++g) {
      const MomentGroup& grp = in.groups[g];
      // Host moments are read only once their last write-back has landed.
      const double room = window.take(grp.bytes), at = std::max(room, written[g]);
      entry[g] = window.entries() - 1;
      if (!tail_up && tail_written <= std::max(h2d, at)) upload_tail(tail_written);
      const double begin = std::max(h2d, at);
      roomed += std::max(0.0, room - h2d);
      h2d = begin + up_s(grp);
      // Its update in the hook of its last gradient, once its moments are in.
      gpu += grp.backward_s;
      waited += std::max(0.0, h2d - gpu);
      gpu = std::max(gpu, h2d) + grp.params / in.update_params_per_s;
      if (!grp.deferred) window.free(entry[g], written[g] = d2h = std::max(d2h, gpu) + down_s(grp));
    }
    if (!tail_up) upload_tail(tail_written);
    if (in.tail.bytes > 0) {
      gpu += in.tail.backward_s;
      waited += std::max(0.0, tail_ready - gpu);
      gpu = std::max(gpu, tail_ready) + in.tail.params / in.update_params_per_s;
      tail_pending = true;
    }
    start = gpu;  // the step's end: its loss and norm read, the next forward queued
  }
  starts.push_back(start), update_wait.push_back(waited), room_wait.push_back(roomed);
  const std::size_t n = starts.size() - 1, k = n - kRead;
  r.replayed = true;
  r.step = (starts[n] - starts[k]) / kRead;
  r.update_wait = (update_wait[n] - update_wait[k]) / kRead;
  r.room_wait = (room_wait[n] - room_wait[k]) / kRead;
  return r;
}

}  // namespace primecfg::train::plan::detail
