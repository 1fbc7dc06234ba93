// --profile.host-trace=trace.json: what the offload pipeline's host threads did and
// when (the CPU worker's jobs, its waits for gradient copies, the forward's waits
// for deferred updates), as Chrome trace events. Timestamps are Unix time in
// microseconds, the clock the Kineto profiler writes, so the two traces of one run
// (--profile.trace) lie on one time axis: bench/trainer/pipeline_timeline.py draws
// them side by side. Off (and free) without a path.
#pragma once

#include "base/strict_json.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace primecfg::train {

class HostTrace {
 public:
  using clock = std::chrono::system_clock;

  // Off without a path (profile.host_trace).
  explicit HostTrace(const std::optional<std::filesystem::path>& path) {
    if (path) path_ = path->string();
  }
  HostTrace(const HostTrace&) = delete;
  HostTrace& operator=(const HostTrace&) = delete;
  ~HostTrace() { write(); }

  bool on() const { return !path_.empty(); }
  static clock::time_point now() { return clock::now(); }

  // A span on the row `thread` ("worker", "hooks", "main"), with the step it belongs to.
  void span(const char* thread, std::string name, clock::time_point t0, clock::time_point t1,
            std::int64_t step) {
    if (!on()) return;
    std::lock_guard lk(mu_);
    events_.push_back(Event{thread, std::move(name), micros(t0), micros(t1) - micros(t0), step});
  }

 private:
  struct Event {
    const char* thread;
    std::string name;
    std::int64_t ts_us, dur_us, step;
  };

  static std::int64_t micros(clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  }

  void write() {
    if (!on()) return;
    std::lock_guard lk(mu_);
    // One JSON writer for the whole trainer (base/strict_json.hpp): names are escaped and
    // checked as UTF-8 there.
    strict_json::ordered events = strict_json::ordered::array();
    for (const Event& e : events_)
      events.push_back({{"ph", "X"},
                        {"cat", "host_pipeline"},
                        {"pid", "primecfg host"},
                        {"tid", e.thread},
                        {"name", e.name},
                        {"ts", e.ts_us},
                        {"dur", e.dur_us},
                        {"args", {{"step", e.step}}}});
    try {  // from the destructor: a failure is reported, never thrown
      std::ofstream f(path_);
      f << strict_json::dump(strict_json::ordered{{"traceEvents", events}}) << "\n";
      if (!f) std::fprintf(stderr, "primecfg-train: could not write the host trace %s\n", path_.c_str());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "primecfg-train: could not write the host trace %s: %s\n", path_.c_str(),
                   e.what());
    }
  }

  std::string path_;
  std::mutex mu_;
  std::vector<Event> events_;
};

}  // namespace primecfg::train
