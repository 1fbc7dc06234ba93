// --calibrate (calibrate.hpp): what the step-time model needs, measured here.
#include "calibrate.hpp"

#include "base/device_streams.hpp"
#include "base/remove_tree.hpp"
#include "base/run_error.hpp"
#include "model/config.hpp"
#include "nn/kernels/fused_ops.hpp"
#include "optim/cpu/cpu_optim.hpp"
#include "optim/cpu/thread_pool.hpp"
#include "planner/planner.hpp"
#include "primecfg_commit.h"
#include "primecfg_kernel_sources.h"
#include "trainer.hpp"

#include <primecfg/cli.hpp>
#include <primecfg/dump.hpp>
#include <primecfg/load.hpp>
#include <primecfg/report.hpp>

#include <ATen/ATen.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sched.h>
#include <spawn.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace primecfg::train {

namespace {

namespace fs = std::filesystem;
using plan::MachineProfile;
using Clock = std::chrono::steady_clock;

struct Sizes {
  std::int64_t copy_bytes;     // device and host memory, PCIe
  std::int64_t update_params;  // GPU and CPU optimizer updates
  std::vector<std::int64_t> attention_lengths;
  std::int64_t attention_heads;
  int reps;
};

Sizes sizes_for(torch::Device d) {
  if (d.is_cuda())
    return {1ll << 30, 1ll << 28, {1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072}, 16, 5};
  // A CPU "device": the same measurements, small enough for a test.
  return {16ll << 20, 1ll << 22, {64, 128, 256}, 2, 2};
}

// Seconds per call of fn: one call to warm up, then `reps` timed together.
template <class Fn>
double seconds_per_call(torch::Device d, int reps, Fn&& fn) {
  fn();
  if (d.is_cuda()) dev::synchronize(dev::current_stream(d));
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) fn();
  if (d.is_cuda()) dev::synchronize(dev::current_stream(d));
  return std::chrono::duration<double>(Clock::now() - t0).count() / reps;
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return std::max(1u, std::thread::hardware_concurrency());
  return std::max(1, CPU_COUNT(&set));
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      auto pos = line.find(':');
      return pos == std::string::npos ? line : line.substr(pos + 2);
    }
  return "unknown CPU";
}

double mem_total_gib() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemTotal:") return kb / (1024.0 * 1024.0);
  return 0;
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
  return buf;
}

// --- Microbenchmarks --------------------------------------------------------

double device_memory_gbs(torch::Device d, const Sizes& z) {
  auto a = torch::empty({z.copy_bytes}, torch::TensorOptions().dtype(torch::kUInt8).device(d));
  auto b = torch::empty_like(a);
  a.fill_(1);
  const double s = seconds_per_call(d, z.reps, [&] { b.copy_(a); });
  return 2.0 * static_cast<double>(z.copy_bytes) / s / 1e9;
}

double gpu_adamw_rate(torch::Device d, const Sizes& z, torch::ScalarType compute) {
  const int tensors = 16;
  const std::int64_t each = z.update_params / tensors;
  auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(d);
  std::vector<torch::Tensor> p, g, m, v, w;
  for (int i = 0; i < tensors; ++i) {
    p.push_back(torch::randn({each}, f32));
    g.push_back(torch::randn({each}, f32));
    m.push_back(torch::zeros({each}, f32));
    v.push_back(torch::zeros({each}, f32));
    w.push_back(torch::empty({each}, f32.dtype(compute)));
  }
  auto step = torch::full({}, 1.0, f32);
  std::vector<torch::Tensor> steps(tensors, step);
  // As offload/shared/device_update.cpp: one fused AdamW, then the compute weights.
  const double s = seconds_per_call(d, z.reps, [&] {
    at::_fused_adamw_(p, g, m, v, {}, steps, 1e-4, 0.9, 0.999, 0.01, 1e-8, false, false);
    for (int i = 0; i < tensors; ++i) w[i].copy_(p[i]);
  });
  return static_cast<double>(z.update_params) / s;
}

std::vector<plan::AttentionTiming> attention(torch::Device d, const Sizes& z, torch::ScalarType dtype,
                                             const std::function<void(const std::string&)>& say) {
  std::vector<plan::AttentionTiming> out;
  torch::AutoGradMode grad(true);
  for (std::int64_t dh : {std::int64_t{64}, std::int64_t{128}})
    for (std::int64_t T : z.attention_lengths) {
      auto o = torch::TensorOptions().dtype(dtype).device(d);
      auto q = torch::randn({1, z.attention_heads, T, dh}, o).requires_grad_();
      auto k = torch::randn({1, z.attention_heads, T, dh}, o).requires_grad_();
      auto v = torch::randn({1, z.attention_heads, T, dh}, o).requires_grad_();
      auto go = torch::randn({1, z.attention_heads, T, dh}, o);
      // Short lengths run for microseconds: more calls, so that launches do not dominate.
      const int reps = T >= 65536 ? 2 : z.reps * static_cast<int>(std::max<std::int64_t>(1, 16384 / T));
      const double f = seconds_per_call(d, reps, [&] {
        torch::NoGradGuard ng;
        (void)at::scaled_dot_product_attention(q, k, v, {}, 0.0, true);
      });
      const double fb = seconds_per_call(d, reps, [&] {
        auto y = at::scaled_dot_product_attention(q, k, v, {}, 0.0, true);
        y.backward(go);
      });
      const double flops =
          2.0 * static_cast<double>(T) * static_cast<double>(T) * static_cast<double>(z.attention_heads * dh);
      plan::AttentionTiming a;
      a.seq_len = T;
      a.head_dim = dh;
      a.forward_tflops = flops / f / 1e12;
      a.backward_tflops = 2.5 * flops / std::max(fb - f, 1e-9) / 1e12;
      out.push_back(a);
      if (say)
        say(fmt::format("attention T={} head_dim={}: forward {:.0f}, backward {:.0f} TFLOP/s", T, dh,
                        a.forward_tflops, a.backward_tflops));
    }
  return out;
}

// One tiny kernel in a stream of them, waited for at the end: the launch and the
// GPU's per-kernel overhead together.
double launch_us(torch::Device d) {
  auto x = torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat).device(d));
  const int n = 2000;
  return 1e6 * seconds_per_call(d, n, [&] { x.add_(1); });
}

// Copies between host (pinned) and device, alone and both ways at once.
void link(torch::Device d, const Sizes& z, plan::LinkProfile& l) {
  auto host_up = dev::exact_pinned(z.copy_bytes, d), host_down = dev::exact_pinned(z.copy_bytes, d);
  auto dev_a = torch::empty({z.copy_bytes}, torch::TensorOptions().dtype(torch::kUInt8).device(d));
  auto dev_b = torch::empty_like(dev_a);
  host_up.fill_(1);
  auto up_stream = dev::side_stream(d), down_stream = dev::side_stream(d);
  auto up = [&] {
    dev::StreamScope s(up_stream);
    dev_a.copy_(host_up, /*non_blocking=*/true);
  };
  auto down = [&] {
    dev::StreamScope s(down_stream);
    host_down.copy_(dev_b, /*non_blocking=*/true);
  };
  auto timed = [&](auto&& queue) {
    queue();
    dev::synchronize(up_stream);
    dev::synchronize(down_stream);
    const auto t0 = Clock::now();
    for (int i = 0; i < z.reps; ++i) queue();
    dev::synchronize(up_stream);
    dev::synchronize(down_stream);
    return std::chrono::duration<double>(Clock::now() - t0).count() / z.reps;
  };
  const double gb = static_cast<double>(z.copy_bytes) / 1e9;
  l.h2d_gbs = gb / timed(up);
  l.d2h_gbs = gb / timed(down);
  // Both at once: each direction's rate is its bytes over the time both took.
  const double both = timed([&] {
    up();
    down();
  });
  l.h2d_both_gbs = gb / both;
  l.d2h_both_gbs = gb / both;
  // The same bytes each way in pieces of 8 MiB (a routed expert's moment is 6 MiB in
  // Qwen3-30B-A3B): what a copy costs beyond its bytes.
  const std::int64_t piece = std::min<std::int64_t>(z.copy_bytes, 8ll << 20), pieces = z.copy_bytes / piece;
  auto in_pieces = [&](const torch::Tensor& dst, const torch::Tensor& src, const dev::MaybeStream& s) {
    dev::StreamScope on(s);
    for (std::int64_t i = 0; i < pieces; ++i)
      dst.narrow(0, i * piece, piece).copy_(src.narrow(0, i * piece, piece), /*non_blocking=*/true);
  };
  const double both_pieces = timed([&] {
    in_pieces(dev_a, host_up, up_stream);
    in_pieces(host_down, dev_b, down_stream);
  });
  if (d.is_cuda())
    l.copy_us = std::max(
        0.0,
        1e6 * (both_pieces - both * static_cast<double>(pieces * piece) / static_cast<double>(z.copy_bytes)) /
            static_cast<double>(pieces));
  // Pageable host memory: a plain tensor, synchronous.
  auto pageable = torch::empty({z.copy_bytes}, torch::kUInt8);
  pageable.fill_(1);
  const double s = seconds_per_call(d, z.reps, [&] { dev_a.copy_(pageable); });
  l.pageable_factor = std::min(1.0, gb / s / l.h2d_gbs);
}

// Keeps copies running both ways until stopped: what the CPU update competes with in
// offload = "full" (gradients landing, weights going up).
class CopyLoad {
 public:
  CopyLoad(torch::Device d, std::int64_t bytes) : d_(d) {
    if (!d.is_cuda()) {
      src_ = torch::empty({bytes}, torch::kUInt8).fill_(1);
      dst_ = torch::empty({bytes}, torch::kUInt8);
    } else {
      up_ = dev::exact_pinned(bytes, d), down_ = dev::exact_pinned(bytes, d);
      dev_ = torch::empty({bytes}, torch::TensorOptions().dtype(torch::kUInt8).device(d));
      up_stream_ = dev::side_stream(d), down_stream_ = dev::side_stream(d);
    }
    thread_ = std::thread([this] { loop(); });
  }
  ~CopyLoad() {
    stop_ = true;
    thread_.join();
  }

 private:
  void loop() {
    while (!stop_) {
      if (!d_.is_cuda()) {
        dst_.copy_(src_);
        continue;
      }
      {
        dev::StreamScope s(up_stream_);
        dev_.copy_(up_, true);
      }
      {
        dev::StreamScope s(down_stream_);
        down_.copy_(dev_, true);
      }
      dev::synchronize(up_stream_);
      dev::synchronize(down_stream_);
    }
  }
  torch::Device d_;
  torch::Tensor src_, dst_, up_, down_, dev_;
  dev::MaybeStream up_stream_, down_stream_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

void host(torch::Device d, const Sizes& z, const RunOptions& run, plan::HostProfile& h) {
  h.cores = usable_cores();
  h.threads = run.offload.cpu_threads ? *run.offload.cpu_threads : std::max(1, static_cast<int>(h.cores) - 1);
  cpu::ThreadPool pool(static_cast<int>(h.threads));
  const std::int64_t n = z.update_params / 4;
  std::vector<float> master(n, 0.5f), m(n, 0.f), v(n, 0.f);
  std::vector<std::uint16_t> grad(n, cpu::float_to_bf16(1e-3f)), out(n);
  const int reps = z.reps;
  auto rate = [&](auto&& update) {
    update();
    const auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) update();
    return static_cast<double>(n) * reps / std::chrono::duration<double>(Clock::now() - t0).count();
  };
  auto adamw = [&] {
    cpu::parallel_adamw(pool, master.data(), m.data(), v.data(), grad.data(), out.data(), n,
                        cpu::AdamWStep{});
  };
  auto sign = [&] {
    cpu::parallel_sign_sgd(pool, master.data(), grad.data(), out.data(), n, cpu::SignSGDStep{});
  };
  h.adamw_params_per_s = rate(adamw);
  h.sign_sgd_params_per_s = rate(sign);
  {
    CopyLoad load(d, std::min<std::int64_t>(z.copy_bytes, 256ll << 20));
    h.adamw_busy_params_per_s = rate(adamw);
    h.sign_sgd_busy_params_per_s = rate(sign);
  }
  // Host memory: a parallel copy of the three FP32 arrays' worth.
  std::vector<float> dst(n);
  const double s = [&] {
    auto copy = [&] {
      pool.parallel_for(n, 1 << 16, [&](std::int64_t b, std::int64_t e) {
        std::copy(master.begin() + b, master.begin() + e, dst.begin() + b);
      });
    };
    copy();
    const auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) copy();
    return std::chrono::duration<double>(Clock::now() - t0).count() / reps;
  }();
  h.memory_gbs = 2.0 * 4.0 * static_cast<double>(n) / s / 1e9;
}

// --- Blocks and heads, timed by the trainer -----------------------------------

// The tail of a child's log, for an error message.
std::string log_tail(const fs::path& log, std::size_t lines) {
  std::ifstream in(log);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  std::string out;
  for (std::size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i)
    out += "  | " + all[i] + "\n";
  return out;
}

// Runs req.trainer with `args`, its output to `log`; throws with the log's tail when it fails.
void run_child(const CalibrateRequest& req, const std::vector<std::string>& args, const fs::path& log) {
  std::vector<std::string> all = {req.trainer.string()};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&files, 1, 2);
  pid_t pid = 0;
  const int err = posix_spawn(&pid, argv[0], &files, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&files);
  if (err != 0)
    throw std::runtime_error(fmt::format("calibration: could not start {}: {}", all[0], std::strerror(err)));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
  std::string cmd;
  for (const auto& a : all) cmd += (cmd.empty() ? "" : " ") + a;
  const std::string how = WIFSIGNALED(status) ? fmt::format("was killed by signal {}", WTERMSIG(status))
                                              : fmt::format("exited with {}", WEXITSTATUS(status));
  throw std::runtime_error(
      fmt::format("calibration run {}:\n  {}\nits last lines:\n{}", how, cmd, log_tail(log, 15)));
}

// What one block run measured: its median step time (steps after the third) and its
// process's resident peak (VmHWM, peak_host_mem_gib in metrics.jsonl).
struct BlockRun {
  double step_s = 0;
  double host_peak_bytes = 0;
};

// A trainer process of its own on `model` with the user's config and `shape` (the run's
// mode and shape, as command-line flags, so the config rules see them as they would
// there): its metrics.jsonl, one object a line. A fresh device, allocator and pools, as a
// user's run would have, and a crash is reported instead of taking calibration with it.
std::vector<nlohmann::json> trainer_run(const CalibrateRequest& req, const std::string& model,
                                        const std::vector<std::string>& shape, const fs::path& dir) {
  remove_tree(dir);
  fs::create_directories(dir);
  const fs::path base = dir / "base.toml";
  {
    std::ofstream out(base);
    out << to_toml_table(req.config);
    if (!out.flush()) throw std::runtime_error("calibration: could not write " + base.string());
  }
  const fs::path output = dir / "run";
  std::vector<std::string> args = {"@", base.string(), "--model.name=" + model, "--model.debug.random-init"};
  args.insert(args.end(), shape.begin(), shape.end());
  for (const char* a :
       {"--max-steps=8", "--scheduler.warmup-steps=0", "--ckpt=None",
        // What would stop the run or time something else.
        "--resume=None", "--val=None", "--dry-run=false", "--trace-path=None", "--memory-profiler-path=None"})
    args.emplace_back(a);
  args.push_back("--output-dir=" + output.string());
  if (req.run.device) args.push_back("--device=" + *req.run.device);
  if (req.run.bf16) args.push_back(*req.run.bf16 ? "--compute-dtype=bf16" : "--compute-dtype=fp32");
  // The kernels the user's runs will use are the ones timed.
  if (!req.run.kernels.fused) args.push_back("--kernels.fused=false");
  if (!req.run.kernels.norm_rope) args.push_back("--kernels.norm-rope=false");
  if (!req.run.kernels.cross_entropy) args.push_back("--kernels.cross-entropy=false");
  if (!req.run.kernels.adamw) args.push_back("--kernels.adamw=false");
  try {
    run_child(req, args, dir / "log");
  } catch (...) {
    std::error_code ec;
    remove_tree(dir, ec);
    throw;
  }
  std::ifstream in(output / "metrics.jsonl");
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object()) lines.push_back(std::move(j));
  }
  remove_tree(dir);
  return lines;
}

// The median of `key` (a number, under `table` when given) over the steps after the
// third (the first ones warm the allocator and kernels).
double median_after_warmup(const std::vector<nlohmann::json>& lines, const char* key,
                           const char* table = nullptr) {
  std::vector<double> v;
  for (const auto& j : lines) {
    const nlohmann::json* t = table ? (j.contains(table) ? &j[table] : nullptr) : &j;
    if (t && t->contains(key) && (*t)[key].is_number()) v.push_back((*t)[key].get<double>());
  }
  if (v.size() < 4)
    throw std::runtime_error(
        fmt::format("calibration: a run wrote {} to metrics.jsonl in fewer than 4 steps", key));
  v.erase(v.begin(), v.begin() + 3);
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A run of `layers` blocks of `model`, offload `none`.
BlockRun block_run(const CalibrateRequest& req, const std::string& model, std::int64_t layers, bool ac,
                   const fs::path& dir) {
  const auto lines =
      trainer_run(req, model,
                  {"--model.offload=none", "--model.debug.num_layers=" + std::to_string(layers),
                   ac ? "--model.ac" : "--model.ac=None", "--model.ac-offloading=None"},
                  dir);
  BlockRun run;
  run.step_s = median_after_warmup(lines, "step_time_s");
  for (const auto& j : lines)
    if (j.contains("peak_host_mem_gib"))
      run.host_peak_bytes = std::max(run.host_peak_bytes, j["peak_host_mem_gib"].get<double>() * (1 << 30));
  return run;
}

// Parameters of a model's first block, and outside its blocks (embedding, final norm, head).
struct ParamSplit {
  std::int64_t first_block = 0, outside = 0;
};
ParamSplit param_split(const ModelArgs& s) {
  ParamSplit n;
  for (const auto& ps : s.params()) {
    if (ps.block == 0) n.first_block += ps.numel();
    if (ps.block < 0) n.outside += ps.numel();
  }
  return n;
}

// AdamW's rate inside FullOffload's pipeline: `model` in `full` at 1,024 tokens a step (so
// that the CPU update sets the step, as where the rate matters), its update time as the
// pipeline reports it (the kernels, not the waits). The copies, the job sizes and the
// thread hand-offs of a real step are in the figure: on an H100 machine the rows the CPU
// update set ran 4.0 to 4.1 G parameters/s where AdamW alone ran 4.9 and under saturating
// copies 3.5 (docs/memory-planner.md). Cut to the blocks that keep it near a billion
// parameters (at least two), so that its host state fits where the user's runs do; without
// clipping, which `full` refuses and which the rate does not depend on.
double full_update_rate(const CalibrateRequest& req, const std::string& model, const fs::path& dir) {
  ModelArgs s = resolve_model(model, std::nullopt).args;
  const ParamSplit n = param_split(s);
  const std::int64_t layers = std::clamp<std::int64_t>(
      (std::int64_t{1'000'000'000} - n.outside) / std::max<std::int64_t>(1, n.first_block),
      std::min<std::int64_t>(2, s.layers), s.layers);
  std::vector<std::string> shape = {"--model.offload=full",
                                    "--data.seq-len=1024",
                                    "--model.debug.num_layers=" + std::to_string(layers),
                                    "--model.ac=None",
                                    "--model.ac-offloading=None",
                                    "--optim.max-norm=None"};
  if (req.run.offload.cpu_threads)
    shape.push_back("--offload.cpu-threads=" + std::to_string(*req.run.offload.cpu_threads));
  const auto lines = trainer_run(req, model, shape, dir);
  s.layers = layers;  // the run's model
  return static_cast<double>(s.total_params()) / median_after_warmup(lines, "cpu_update_s", "pipeline");
}

// What a trainer process holds beyond the planner's own host terms: a one-block run's
// resident peak less the host plan of that run with no runtime (its data; the weights
// are drawn on the device, and `none` keeps no state on the host). On a CPU "device"
// the run's model lives in the same memory, so nothing is measured there.
std::optional<std::int64_t> host_runtime(const CalibrateRequest& req, const std::string& model,
                                         const BlockRun& one_block, bool cuda, bool bf16) {
  if (!cuda || one_block.host_peak_bytes <= 0) return std::nullopt;
  SFTConfig c = req.config;  // as block_run's command line sets it
  c.model.name = model;
  c.model.offload = Offload::none;
  c.model.debug = ModelDebugConfig{.num_layers = 1, .random_init = true};
  c.model.ac = std::nullopt;
  c.model.ac_offloading = std::nullopt;
  c.ckpt = std::nullopt;
  plan::Assumptions a;
  a.compute_bytes = bf16 ? 2 : 4;
  a.host_runtime = 0;
  const std::int64_t planned = plan::make_plan(c, a).mode(c.model.offload).host.peak;
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(one_block.host_peak_bytes) - planned);
}

}  // namespace

std::string calibration_summary(const MachineProfile& p, const std::string& file) {
  std::string out = fmt::format("calibrate: wrote {}, measured on {} ({}) with the fused kernels: {}\n", file,
                                p.provenance.device, p.provenance.machine,
                                p.provenance.kernels && !p.provenance.kernels->empty()
                                    ? fmt::format("{}", fmt::join(*p.provenance.kernels, ", "))
                                    : "none");
  for (const auto& b : p.gpu.blocks)
    out += fmt::format(
        "  block: {}hidden {}, intermediate {}, {}/{} heads of {}{}{}, at {} tokens\n",
        b.architecture == "llama" ? "" : b.architecture + ", ", b.hidden, b.intermediate, b.heads, b.kv_heads,
        b.head_dim, b.qk_norm ? ", QK-norm" : "",
        b.experts ? fmt::format(", {} experts of {} (top {})", b.experts, b.moe_intermediate, b.top_k) : "",
        b.tokens);
  std::vector<std::int64_t> dims;
  std::int64_t shortest = 0, longest = 0;
  for (const auto& a : p.gpu.attention) {
    if (std::find(dims.begin(), dims.end(), a.head_dim) == dims.end()) dims.push_back(a.head_dim);
    shortest = shortest ? std::min(shortest, a.seq_len) : a.seq_len;
    longest = std::max(longest, a.seq_len);
  }
  out += fmt::format(
      "  attention: head_dim {} from {} to {} tokens (lengths between are interpolated, beyond them the "
      "nearest is taken)\n",
      fmt::join(dims, " and "), shortest, longest);
  std::vector<std::string> runtimes;
  for (const auto& r : p.host.runtime_by_architecture)
    runtimes.push_back(
        fmt::format("{:.2f} GiB for {} models", static_cast<double>(r.bytes) / (1 << 30), r.architecture));
  out += fmt::format("  host: {} threads, CPU AdamW {:.2f} G parameters/s; resident runtime {}\n",
                     p.host.threads, p.host.adamw_params_per_s / 1e9,
                     !runtimes.empty() ? fmt::format("{}", fmt::join(runtimes, ", "))
                     : p.host.runtime_bytes
                         ? fmt::format("{:.2f} GiB", static_cast<double>(*p.host.runtime_bytes) / (1 << 30))
                         : std::string("not measured (a CPU device holds the model in the same memory)"));
  std::vector<std::string> by[4];
  for (const std::string& name : preset_names())
    by[static_cast<int>(plan::block_coverage(p, *preset(name)))].push_back(name);
  const char* how[4] = {
      "measured", "interpolated between the measured blocks",
      "smaller than any measured block (the smallest one's throughput: predicted steps likely too short)",
      "larger than any measured block (the largest one's throughput: predicted steps likely too long)"};
  out += "The presets' blocks in this profile:\n";
  for (int i = 0; i < 4; ++i)
    if (!by[i].empty()) out += fmt::format("  {}: {}\n", how[i], fmt::join(by[i], ", "));
  out += fmt::format(
      "Use it: primecfg-train @ run.toml --plan --plan-profile={} (step times and host memory for this "
      "machine); --calibrate-models=[...] measures more blocks.\n",
      file);
  return out;
}

std::string build_kernel_sources() { return PRIMECFG_KERNEL_SOURCES; }

MachineProfile calibrate(const CalibrateRequest& req) {
  const torch::Device d(req.run.device.value_or(torch::cuda::is_available() ? "cuda" : "cpu"));
  const bool bf16 = req.run.bf16.value_or(d.is_cuda());
  const torch::ScalarType compute = bf16 ? torch::kBFloat16 : torch::kFloat;
  const Sizes z = sizes_for(d);
  auto say = [&](const std::string& s) {
    if (req.progress) req.progress(s);
  };

  MachineProfile p;
  p.provenance.device = d.is_cuda() ? dev::device_name(d) : "CPU (" + cpu_model() + ")";
  p.provenance.machine =
      fmt::format("{}, {} usable cores, {:.0f} GiB", cpu_model(), usable_cores(), mem_total_gib());
  p.provenance.measured_at = utc_now();
  p.provenance.commit = PRIMECFG_COMMIT;
  p.provenance.torch = TORCH_VERSION;
  p.provenance.command = req.command;
  // The kernels apply to bf16 on a GPU only; elsewhere the runs use none.
  p.provenance.kernels =
      fused::kernels_built() && d.is_cuda() && bf16 ? req.run.kernels.on() : std::vector<std::string>{};
  if (!p.provenance.kernels->empty()) p.provenance.kernel_sources = build_kernel_sources();
  if (req.run.peak_tflops) p.gpu.peak_tflops = *req.run.peak_tflops;

  // The trainer's own runs first, each in a process of its own, before this one
  // touches the device.
  const std::int64_t tokens = req.config.seq_len();
  const fs::path dir = fs::temp_directory_path() / fmt::format("primecfg-calibrate-{}", ::getpid());
  struct Runs {
    std::string model;
    double r1, r3, r3ac;
  };
  std::vector<Runs> runs;
  for (const std::string& name : req.models) {
    auto timed = [&](std::int64_t layers, bool ac) {
      say(fmt::format("{}: timing {} block{}{}", name, layers, layers == 1 ? "" : "s",
                      ac ? ", checkpointed" : ""));
      return block_run(req, name, layers, ac, dir);
    };
    const BlockRun one = timed(1, false);
    Runs r{name, one.step_s, timed(3, false).step_s, timed(3, true).step_s};
    say(fmt::format("{}: steps of 1 / 3 / 3 checkpointed blocks {:.4f} / {:.4f} / {:.4f} s", name, r.r1, r.r3,
                    r.r3ac));
    runs.push_back(r);
    // The largest over the models: the runtime grows with the kernels a model loads.
    if (const auto rt = host_runtime(req, name, one, d.is_cuda(), bf16)) {
      p.host.runtime_bytes = std::max(p.host.runtime_bytes.value_or(0), *rt);
      const std::string arch = plan::block_key(resolve_model(name, std::nullopt).args).architecture;
      auto& by = p.host.runtime_by_architecture;
      auto at = std::find_if(by.begin(), by.end(), [&](const auto& r) { return r.architecture == arch; });
      if (at == by.end())
        by.push_back({arch, *rt});
      else
        at->bytes = std::max(at->bytes, *rt);
      say(fmt::format("{}: the process held {:.2f} GiB beyond the planner's terms (host runtime)", name,
                      static_cast<double>(*rt) / (1 << 30)));
    }
  }

  p.gpu.memory_gbs = device_memory_gbs(d, z);
  say(fmt::format("device memory: {:.0f} GB/s", p.gpu.memory_gbs));
  p.gpu.adamw_params_per_s = gpu_adamw_rate(d, z, compute);
  say(fmt::format("device AdamW: {:.2f} G parameters/s", p.gpu.adamw_params_per_s / 1e9));
  p.gpu.launch_us = launch_us(d);
  say(fmt::format("kernel launch: {:.1f} us", p.gpu.launch_us));
  for (const Runs& run : runs) {
    const ModelArgs s = resolve_model(run.model, std::nullopt).args;
    const double r1 = run.r1, r3 = run.r3, r3ac = run.r3ac;
    const ParamSplit n = param_split(s);
    if (r3 <= r1 || r3ac <= r3)
      say(fmt::format(
          "warning: {}: more blocks or checkpointing did not take longer ({:.4f} / {:.4f} / {:.4f} s): "
          "the machine is busy or the runs too short; the figures below are clamped",
          run.model, r1, r3, r3ac));
    // What one block adds to the step, less its share of the update.
    const double block = (r3 - r1) / 2;
    const double fwd = std::max(1e-9, (r3ac - r3) / 3);
    plan::BlockTiming b = plan::block_key(s);
    b.fp8 = req.config.model.quantization.has_value();  // the runs' config is the user's
    b.tokens = tokens;
    b.forward_s = fwd;
    b.backward_s =
        std::max(1e-9, block - fwd - static_cast<double>(n.first_block) / p.gpu.adamw_params_per_s);
    // The rest of a one-block step: the head, the loss and the step's fixed work; its
    // matmuls run once forward and twice backward, which splits it.
    const double rest =
        std::max(1e-9, r1 - block - static_cast<double>(n.outside) / p.gpu.adamw_params_per_s);
    plan::HeadTiming h;
    h.hidden = s.hidden, h.vocab = s.vocab_size, h.tied = s.tie_embeddings, h.tokens = tokens;
    h.forward_s = rest / 3;
    h.backward_s = rest - h.forward_s;
    if (std::none_of(p.gpu.blocks.begin(), p.gpu.blocks.end(),
                     [&](const auto& o) { return o.same_shape(b); }))
      p.gpu.blocks.push_back(b);
    if (std::none_of(p.gpu.heads.begin(), p.gpu.heads.end(), [&](const auto& o) { return o.same_shape(h); }))
      p.gpu.heads.push_back(h);
    say(fmt::format("{}: block forward {:.5f} s, backward {:.5f} s; head {:.5f} s", run.model, b.forward_s,
                    b.backward_s, rest));
  }
  p.gpu.attention = attention(d, z, compute, req.progress);
  link(d, z, p.link);
  say(fmt::format("PCIe: up {:.1f}, down {:.1f}, both {:.1f} + {:.1f} GB/s; pageable {:.2f} of pinned{}",
                  p.link.h2d_gbs, p.link.d2h_gbs, p.link.h2d_both_gbs, p.link.d2h_both_gbs,
                  p.link.pageable_factor,
                  p.link.copy_us ? fmt::format("; {:.1f} us a copy beyond its bytes", *p.link.copy_us) : ""));
  host(d, z, req.run, p.host);
  if (std::holds_alternative<AdamWConfig>(req.config.optim)) {
    // The smallest model: its host state is the least to hold.
    std::string smallest;
    std::int64_t fewest = 0;
    for (const std::string& name : req.models) {
      const std::int64_t n = resolve_model(name, std::nullopt).args.total_params();
      if (smallest.empty() || n < fewest) smallest = name, fewest = n;
    }
    say(fmt::format("{}: timing the CPU update of a full-offload run", smallest));
    p.host.adamw_full_params_per_s = full_update_rate(req, smallest, dir);
    say(fmt::format("full offload: CPU AdamW {:.2f} G parameters/s in its pipeline",
                    *p.host.adamw_full_params_per_s / 1e9));
  }
  say(fmt::format("host: {} threads, AdamW {:.2f} (busy {:.2f}) G parameters/s, memory {:.0f} GB/s",
                  p.host.threads, p.host.adamw_params_per_s / 1e9, p.host.adamw_busy_params_per_s / 1e9,
                  p.host.memory_gbs));
  p.collectives.intra_node_gbs = 300;
  p.collectives.inter_node_gbs = 40;
  p.collectives.source =
      "stated, not measured: NVLink all-gather/reduce-scatter bus bandwidth of an 8-GPU H200 node, and "
      "8 x 400 Gb/s InfiniBand between nodes (one NIC per GPU)";

  return p;
}

}  // namespace primecfg::train
