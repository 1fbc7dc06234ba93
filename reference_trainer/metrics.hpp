// What the run reports per step: metrics.jsonl (one JSON object a line), the
// progress line or bar on stderr, and the optional profiler trace of the last steps.
// Used by trainer.cpp only.
#pragma once

#include "base/device_streams.hpp"
#include "base/run_error.hpp"
#include "base/strict_json.hpp"
#include "checkpoint/dir.hpp"
#include "options.hpp"

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>
#if defined(PRIMECFG_WITH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/cuda/memory_snapshot.h>
#endif

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace primecfg::train {

namespace fs = std::filesystem;

inline double rss_bytes(const char* field) {  // VmRSS / VmHWM from /proc/self/status
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field, 0) == 0) return std::stod(line.substr(std::strlen(field))) * 1024.0;
  return 0;
}

inline constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

// Peak dense bf16 FLOP/s of the device for MFU: `tflops` (--peak-tflops) when given,
// else known GPUs'; nullopt when unknown.
inline std::optional<double> peak_flops(torch::Device d, std::optional<double> tflops) {
  if (tflops) return *tflops * 1e12;
  const std::string name = dev::device_name(d);
  if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) return 989e12;
  return std::nullopt;
}

inline double peak_device_bytes(torch::Device d) {
#if defined(PRIMECFG_WITH_CUDA)
  if (d.is_cuda()) {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(d.index() < 0 ? 0 : d.index());
    return static_cast<double>(stats.allocated_bytes[0].peak);
  }
#endif
  (void)d;
  return rss_bytes("VmHWM:");  // CPU run: the device is the host
}

struct StepMetrics {
  std::int64_t step = 0, max_steps = 0;
  double loss = 0, lr = 0, grad_norm = 0, step_time = 0, tokens_per_s = 0;
  std::optional<double> mfu;
  double peak_device = 0, host_rss = 0;
  double peak_host = 0;  // VmHWM: the process's resident peak so far (what --plan's host peak predicts)
  std::vector<double> peak_device_ranks;  // several ranks: each one's peak, in rank order
  std::map<std::string, double> host_state;
  // Routed experts (prime-rl's load-balance figures): the mean over routed blocks of
  // max_vio and of the routing confidence, averaged over the step's micro-batches, max_vio
  // the largest of the ranks', the confidence their mean; the slots each expert got in
  // the step, summed over blocks and ranks.
  std::optional<double> moe_max_vio, moe_routing_confidence;
  std::vector<double> moe_tokens_per_expert;
  std::map<std::string, double> pipeline;
  std::int64_t tokens = 0;
};

// A figure for metrics.jsonl, rounded to the digits of format f. NaN and infinity
// stay: JSON has none, and strict_json::dump writes them as null.
inline double rounded(double v, std::string_view f) {
  return std::isfinite(v) ? std::strtod(fmt::vformat(f, fmt::make_format_args(v)).c_str(), nullptr) : v;
}

class Reporter {
 public:
  Reporter(const fs::path& out_dir, bool print, std::string_view mode)
      : path_(out_dir / "metrics.jsonl"), print_(print), mode_(mode) {
    fs::create_directories(out_dir);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw run_error(fmt::format("{}: cannot open for writing: {}", path_.string(), std::strerror(errno)));
    tty_ = ::isatty(::fileno(stderr));
  }
  Reporter(const Reporter&) = delete;
  Reporter& operator=(const Reporter&) = delete;
  ~Reporter() {
    if (fd_ >= 0) ::close(fd_);
    if (tty_ && print_ && bar_shown_) std::fputc('\n', stderr);
  }

  void log(const StepMetrics& m) {
    strict_json::ordered host = {{"rss", rounded(m.host_rss / GiB, "{:.4f}")}};
    for (const auto& [k, v] : m.host_state) host[k] = rounded(v / GiB, "{:.6f}");
    strict_json::ordered line = {
        {"step", m.step},
        {"loss", rounded(m.loss, "{:.6f}")},
        {"lr", rounded(m.lr, "{:.6g}")},
        {"grad_norm", rounded(m.grad_norm, "{:.6g}")},
        {"tokens", m.tokens},
        {"tokens_per_s", rounded(m.tokens_per_s, "{:.2f}")},
        {"mfu", m.mfu ? strict_json::ordered(rounded(*m.mfu, "{:.4f}")) : strict_json::ordered(nullptr)},
        {"step_time_s", rounded(m.step_time, "{:.4f}")},
        {"peak_device_mem_gib", rounded(m.peak_device / GiB, "{:.4f}")},
        {"host_mem_gib", host},
        {"peak_host_mem_gib", rounded(m.peak_host / GiB, "{:.4f}")},
        {"offload", mode_},
    };
    if (m.moe_max_vio) {
      line["max_vio"] = rounded(*m.moe_max_vio, "{:.6g}");
      line["routing_confidence"] = rounded(*m.moe_routing_confidence, "{:.6g}");
      strict_json::ordered& per = line["tokens_per_expert"] = strict_json::ordered::array();
      for (double v : m.moe_tokens_per_expert) per.push_back(static_cast<std::int64_t>(v));
    }
    if (!m.peak_device_ranks.empty()) {
      strict_json::ordered& ranks = line["peak_device_mem_gib_ranks"] = strict_json::ordered::array();
      for (double v : m.peak_device_ranks) ranks.push_back(rounded(v / GiB, "{:.4f}"));
    }
    if (!m.pipeline.empty()) {
      strict_json::ordered& pipe = line["pipeline"] = strict_json::ordered::object();
      for (const auto& [k, v] : m.pipeline) pipe[k] = rounded(v, "{:.6g}");
    }
    append_line(strict_json::dump(line) + '\n');
    if (!print_) return;
    std::string mfu = m.mfu ? fmt::format(" mfu {:.1f}%", *m.mfu * 100) : "";
    std::string stats =
        fmt::format("loss {:.4f} | lr {:.2e} | {:.0f} tok/s{} | {:.3f} s/step | peak {:.2f} GiB", m.loss,
                    m.lr, m.tokens_per_s, mfu, m.step_time, m.peak_device / GiB);
    if (tty_) {
      const int width = 24;
      int filled = m.max_steps ? static_cast<int>(width * m.step / m.max_steps) : 0;
      std::fprintf(stderr, "\r\033[K[%s%s] %lld/%lld %s", std::string(filled, '#').c_str(),
                   std::string(width - filled, '.').c_str(), static_cast<long long>(m.step),
                   static_cast<long long>(m.max_steps), stats.c_str());
      bar_shown_ = true;
    } else {
      std::fprintf(stderr, "step %lld/%lld | %s\n", static_cast<long long>(m.step),
                   static_cast<long long>(m.max_steps), stats.c_str());
    }
    std::fflush(stderr);
  }

 private:
  // One line, whole or not at all: a write that fails part-way (disk full, file-size
  // limit) is cut back to the last whole line, so that the file stays one JSON object
  // a line and a later resume does not carry a torn line along.
  void append_line(const std::string& text) {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw run_error(fmt::format("{}: {}", path_.string(), std::strerror(errno)));
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = n < 0 ? errno : EIO;
        const bool cut = ::ftruncate(fd_, st.st_size) == 0;
        throw run_error(fmt::format("{}: write failed: {}; {}", path_.string(), std::strerror(err),
                                    cut ? "the file ends with the last whole line"
                                        : "the last line may be cut (cutting it back failed too)"));
      }
      done += static_cast<std::size_t>(n);
    }
  }

  fs::path path_;
  int fd_ = -1;
  bool print_, tty_ = false, bar_shown_ = false;
  std::string mode_;
};

// --profile.trace=trace.json records the last two steps of a run with the Kineto
// profiler (CPU ops and CUDA kernels, as torch.profiler does; only the latter with
// --no-profile.cpu-ops) and writes a Chrome trace: what bench/trainer/profile_gpu.sh
// compares with the PyTorch peer.
class StepProfiler {
 public:
  StepProfiler(std::int64_t last_step, const ProfileOptions& options) : cpu_ops_(options.cpu_ops) {
    if (!options.trace) return;
    path_ = options.trace->string();
    first_ = std::max<std::int64_t>(1, last_step - 1);
    last_ = last_step;
  }
  void before_step(std::int64_t step) {  // step counts from 1
    if (path_.empty() || step != first_) return;
    namespace prof = torch::autograd::profiler;
    prof::ProfilerConfig config(prof::ProfilerState::KINETO);
    // Without cpu_ops only the GPU's kernels and copies are recorded: recording every
    // host operator slows the host down enough to change what a host-bound step does.
    std::set<torch::profiler::impl::ActivityType> activities;
    if (cpu_ops_ || !torch::cuda::is_available()) activities.insert(torch::profiler::impl::ActivityType::CPU);
    if (torch::cuda::is_available()) activities.insert(torch::profiler::impl::ActivityType::CUDA);
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
    on_ = true;
  }
  void after_step(std::int64_t step) {
    if (!on_ || step != last_) return;
    on_ = false;
    torch::autograd::profiler::disableProfiler()->save(path_);
    std::fprintf(stderr, "primecfg-train: profile of steps %lld-%lld written to %s\n",
                 static_cast<long long>(first_), static_cast<long long>(last_), path_.c_str());
  }

 private:
  std::string path_;
  std::int64_t first_ = 0, last_ = 0;
  bool on_ = false;
  bool cpu_ops_ = true;
};

// --profile.memory=FILE records every allocation of the CUDA caching allocator, with its
// C++ stack, from before the model is loaded to the end of the run, and writes the
// allocator's snapshot (the pickle that torch.cuda.memory._snapshot() returns) there: what
// is live at the peak, by stack, is what --plan's terms are checked against
// (bench/trainer/memory_peak.py). Several ranks: rank r > 0 writes FILE.rank<r>. A run
// that fails (out of memory, most often the reason to record) writes it too, on its way out.
class MemoryRecorder {
 public:
  MemoryRecorder(const std::optional<fs::path>& path, torch::Device device, int rank) : rank_(rank) {
    if (!path) return;
    if (!device.is_cuda())
      throw run_error(
          fmt::format("profile.memory = \"{}\": the allocation record is the CUDA allocator's, and "
                      "this run is on the {}",
                      path->string(), device.str()));
#if defined(PRIMECFG_WITH_CUDA)
    path_ = *path;
    // Every event kept (the runs this is for are a few steps long), with C++ stacks ('all':
    // a process without Python has only those).
    torch::cuda::_record_memory_history(std::optional<std::string>("all"), std::optional<std::string>("all"),
                                        "all");
#endif
  }
  MemoryRecorder(const MemoryRecorder&) = delete;
  MemoryRecorder& operator=(const MemoryRecorder&) = delete;
  ~MemoryRecorder() {
#if defined(PRIMECFG_WITH_CUDA)
    if (path_.empty()) return;
    if (!written_ && std::uncaught_exceptions() > 0) {
      try {
        write();
      } catch (const std::exception& e) {  // the run's own error is the one to report
        std::fprintf(stderr, "primecfg-train: %s\n", e.what());
      }
    }
    torch::cuda::_record_memory_history(std::nullopt);
#endif
  }
  // Writes the snapshot (whole, or an error naming the file).
  void write() {
#if defined(PRIMECFG_WITH_CUDA)
    if (path_.empty()) return;
    written_ = true;
    fs::path out = path_;
    if (rank_ > 0) out += fmt::format(".rank{}", rank_);
    try {
      replace_file(out, torch::cuda::_memory_snapshot_pickled());
    } catch (const std::exception& e) {
      throw run_error(fmt::format("profile.memory: {}", e.what()));
    }
    std::fprintf(stderr, "primecfg-train: GPU allocations written to %s\n", out.c_str());
#endif
  }

 private:
  fs::path path_;
  int rank_ = 0;
  bool written_ = false;
};

}  // namespace primecfg::train
