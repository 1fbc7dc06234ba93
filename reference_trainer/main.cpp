// primecfg-train [@ config.toml ...] [--section.field=value ...]
//
// Reads an SFTConfig (or a TrainerConfig with [data.fake]) through primecfg,
// rejects what the trainer does not implement, and trains. Without config files
// it runs the embedded default: a tiny model learning to reverse text on the CPU.
#include "base/remove_tree.hpp"
#include "calibrate.hpp"
#include "checkpoint/dir.hpp"
#include "command_line.hpp"
#include "model/architecture.hpp"
#include "model/config.hpp"
#include "options.hpp"
#include "planner/machine.hpp"
#include "planner/planner.hpp"
#include "planner/profile.hpp"
#include "support.hpp"
#include "trainer.hpp"

#include <c10/util/Exception.h>

#include <primecfg/cli.hpp>
#include <primecfg/help.hpp>
#include <primecfg/load.hpp>
#include <primecfg/report.hpp>
#include <primecfg/sft.hpp>
#include <primecfg/trainer.hpp>
#if __has_include(<primecfg/dump.hpp>)
#include <primecfg/dump.hpp>
#define PRIMECFG_TRAIN_HAVE_DUMP 1
#endif

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <execinfo.h>
#include <signal.h>
#include <sys/resource.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace {

namespace train = primecfg::train;

// The run with no config file: about a minute on two CPU cores.
constexpr const char* kDefaultConfig = R"toml(
max_steps = 200
output_dir = "outputs/default"
clean = true  # the demo starts over each time

[model]
name = "primecfg/tiny"
attn = "sdpa"
compile = "None"
# Two blocks at 96 tokens: checkpointing would only add a recompute (prime-rl has both on).
ac = "None"
ac_offloading = "None"

[data]
seq_len = 96
batch_size = 16
micro_batch_size = 8

[optim]
lr = 3e-3
weight_decay = 0.0

[scheduler]
type = "cosine"
warmup_steps = @WARMUP@
min_lr = 3e-4
)toml";

// The default's warm-up, and the embedded default with a given one.
constexpr std::int64_t kDefaultWarmup = 20;
std::string default_config(std::int64_t warmup) {
  std::string text = kDefaultConfig + 1;
  text.replace(text.find("@WARMUP@"), 8, std::to_string(warmup));
  return text;
}

constexpr const char* kUsage =
    R"(usage: primecfg-train [@ config.toml ...] [--section.field=value ...] [options]

Trains a Llama/Qwen3-style model with LibTorch. With no config file, runs the
embedded default (a tiny model on the built-in reverse-text task).

  @ FILE, @FILE          read an SFTConfig TOML file (later files override earlier ones)
  --a.b=value, --a.b v   override one field of the config; --flag / --no-flag for booleans
  --print-default        print the embedded default config and exit
  --options=FILE         read primecfg-train's options (below) from a TOML file; flags win
  --help                 this text

)";

// The paragraph on models, its preset list taken from the registry (model/presets.cpp).
std::string models_help() {
  std::string text = "Model presets (model.name):";
  std::size_t line = text.size();
  for (const std::string& name : train::preset_names()) {
    if (line + name.size() + 2 > 84) {
      text += "\n ";
      line = 1;
    }
    text += " " + name + ",";
    line += name.size() + 2;
  }
  text.back() = '.';
  // The model_type values a local directory may hold, from the architectures' registry.
  std::string types;
  for (const train::Architecture* a : train::architectures())
    for (std::string_view t : a->model_types()) types += (types.empty() ? "" : ", ") + std::string(t);
  return text + "\nOr a local HF directory (config.json's model_type: " + types +
         ";\nevery config.json key is used or refused by name)." + R"(
Metrics go to <output_dir>/metrics.jsonl, the resolved config to <output_dir>/config.toml
and the options to <output_dir>/options.toml.
)";
}

// What each offload mode trades (the values come from the config's own description).
constexpr const char* kOffloadTrade =
    R"(      none: every tensor on the GPU; the fastest, the most GPU memory (FP32 masters,
        gradients and Adam's two moments: 16 bytes a parameter besides the bf16 weights).
      optimizer: Adam's moments (8 bytes a parameter) in pinned host memory, streamed
        over PCIe each step; slower by the transfer that backward does not hide.
      full: masters, moments and gradients in host memory, updated by the CPU; the GPU
        keeps the bf16 weights and activations; the CPU update sets the step time.
      `--plan` says which modes fit this machine and recommends one.
)";

// The config's sections and the fields set most often, from the config's own
// descriptions (help_text), so that this summary cannot drift from the fields.
std::string config_summary() {
  const std::string all = primecfg::help_text<primecfg::SFTConfig>();
  std::vector<std::string> entries;  // "  --flag ...\n      description\n"
  for (std::size_t at = all.find("  --"); at != std::string::npos;) {
    const std::size_t next = all.find("\n  --", at);
    entries.push_back(all.substr(at, next == std::string::npos ? std::string::npos : next + 1 - at));
    at = next == std::string::npos ? next : next + 1;
  }
  std::vector<std::string> sections;
  for (const auto& e : entries) {
    const std::string flag = e.substr(4, e.find_first_of(" \n", 4) - 4);
    if (const auto dot = flag.find('.'); dot != std::string::npos) {
      const std::string section = flag.substr(0, dot);
      if (std::find(sections.begin(), sections.end(), section) == sections.end()) sections.push_back(section);
    }
  }
  std::string out =
      "\nThe config (SFTConfig; every field: `primecfg help --as sft`, docs/config-reference.md). The "
      "defaults "
      "below are SFTConfig's, as in prime-rl; a run without a config file starts from the embedded default "
      "(--print-default).\n";
  out += fmt::format("Sections: {}.\nThe fields set most often:\n", fmt::join(sections, ", "));
  for (const char* flag :
       {"model.name", "model.offload", "model.ac", "model.ac-offloading", "data.seq-len", "data.batch-size",
        "data.micro-batch-size", "optim.lr", "max-steps", "output-dir", "ckpt.interval"}) {
    for (const auto& e : entries) {
      const std::string head = std::string("  --") + flag;
      if (e.rfind(head, 0) == 0 && (e[head.size()] == ' ' || e[head.size()] == '\n')) {
        out += e;
        if (std::string_view(flag) == "model.offload") out += kOffloadTrade;
        break;
      }
    }
  }
  return out + "\nOptions (read through primecfg like the config: checked, with did-you-mean):\n";
}

// Prints to standard output; a write that fails (`> /dev/full`) is an error and exit 2,
// as for the primecfg tool, never a silent 0.
int print_out(std::string_view text) {
  const bool ok = std::fwrite(text.data(), 1, text.size(), stdout) == text.size() && std::fflush(stdout) == 0;
  if (ok) return 0;
  std::fprintf(stderr, "primecfg-train: error: cannot write to standard output: %s\n", std::strerror(errno));
  return 2;
}

// CUDA device index of --device ("cuda", "cuda:1"); 0 by default.
int device_index(const train::TrainerOptions& o) {
  return o.device ? train::TrainerOptions::cuda_index(*o.device).value_or(0) : 0;
}

std::int64_t gib_bytes(double gib) {
  return static_cast<std::int64_t>(gib * static_cast<double>(std::int64_t{1} << 30));
}

const train::plan::MachineProfile* machine_profile(const train::TrainerOptions& o, bool this_device,
                                                   std::string& source);

// Whether this primecfg-train runs on CUDA devices (a CUDA LibTorch).
#if defined(PRIMECFG_WITH_CUDA)
constexpr bool kCudaBuild = true;
#else
constexpr bool kCudaBuild = false;
#endif

// What the planner assumes about this machine: the GPU's memory from the CUDA
// driver (or the option, or the H200's 139 GiB), host memory from /proc/meminfo, the
// process's resident runtime from a profile measured on this GPU (a plan given a
// profile takes that profile's: make_plan).
train::plan::Assumptions machine(const train::TrainerOptions& o) {
  namespace plan = train::plan;
  plan::Assumptions a;
  a.compute_bytes = o.compute_dtype.value_or(train::ComputeDtype::bf16) == train::ComputeDtype::bf16 ? 2 : 4;
  a.ring_bytes = o.offload.ring_bytes();  // the trainer's staging rings and moment window
  a.deferred_share = o.offload.deferred_share;
  a.cuda_graph = o.cuda_graph;
  a.cpu_threads = o.offload.cpu_threads;
  // The fused kernels the run will use: bf16 only. A CUDA build without them runs without
  // them; a build without CUDA (a laptop planning a cluster) plans another build's GPU run,
  // which has them, so its plan is the one that build would make.
  const bool run_has_kernels = plan::kFusedKernels || !kCudaBuild;
  a.kernels = run_has_kernels && a.compute_bytes == 2 ? o.kernels.on() : std::vector<std::string>{};
  auto uses = [&](std::string_view k) {
    return std::find(a.kernels->begin(), a.kernels->end(), k) != a.kernels->end();
  };
  a.fused_swiglu = uses("fused");
  a.fused_cross_entropy = uses("cross_entropy");
  a.fused_adamw = uses("adamw");
  a.fused_fp8_casts = uses("fused") && o.kernels.fp8_cast;
  if (!a.kernels->empty()) a.kernel_sources = train::build_kernel_sources();
  a.gpu_name = plan::cuda_device_name(device_index(o));
  std::string source;
  if (const auto* here = machine_profile(o, true, source)) plan::take_host_runtime(a, *here, source);
  if (o.plan_gpu_memory) {
    a.gpu_capacity = gib_bytes(*o.plan_gpu_memory);
    a.gpu_capacity_source = "--plan-gpu-memory";
  } else if (auto dev = plan::cuda_device_memory(device_index(o))) {
    a.gpu_capacity = dev;
    a.gpu_capacity_source = "CUDA device " + std::to_string(device_index(o));
  } else {
    a.gpu_capacity = std::int64_t{139} << 30;
    a.gpu_capacity_source = "no CUDA device here: H200 default, set --plan-gpu-memory";
  }
  if (o.plan_host_memory) {
    a.host_capacity = gib_bytes(*o.plan_host_memory);
    a.host_capacity_source = "--plan-host-memory";
  } else if (auto h = plan::host_memory()) {
    a.host_capacity = h->available;
    a.host_capacity_source = "MemAvailable, of " + std::to_string(h->total >> 30) + " GiB total";
  } else {
    a.host_capacity_source = "/proc/meminfo unreadable";
  }
  return a;
}

// The machine profile of the step-time model: --plan-profile, else the shipped one.
// `this_device`: only a profile measured on this run's GPU (a run chooses its pipeline
// by it; --plan may plan an H200 from anywhere). nullptr: none.
const train::plan::MachineProfile* machine_profile(const train::TrainerOptions& o, bool this_device,
                                                   std::string& source) {
  namespace plan = train::plan;
  static plan::MachineProfile profile;
  if (o.plan_profile) {
    profile = plan::read_profile(*o.plan_profile);
    source = o.plan_profile->string();
    return &profile;
  }
  const auto& shipped = plan::shipped_profile();
  if (!shipped) return nullptr;
  if (this_device && plan::cuda_device_name(device_index(o)) != shipped->provenance.device) return nullptr;
  profile = *shipped;
  source = "shipped with primecfg (--plan-profile or --calibrate for this machine)";
  return &profile;
}

// offload = "optimizer" with --offload.deferred-share unset: the plan's choice for this
// machine (plan::PipelineChoice), written into the options so the run, its memory
// check and its dump see it. Said in one line, as every choice made for the user.
void choose_pipeline(const primecfg::SFTConfig& cfg, train::TrainerOptions& o, bool say) {
  namespace plan = train::plan;
  std::string why;
  try {
    auto a = machine(o);
    plan::apply_ranks(a, o, train::Launch::from_environment());
    a.profile = machine_profile(o, true, a.profile_source);
    const auto p = plan::make_plan(cfg, a);
    const auto& c = p.pipeline();
    o.offload.deferred_share = c.deferred_share;
    if (c.ring_bytes && !o.offload.ring_mib)
      o.offload.ring_mib = static_cast<double>(*c.ring_bytes) / static_cast<double>(1 << 20);
    why = c.why;
  } catch (const std::exception& e) {
    if (o.plan_profile) throw;  // the profile the user gave, unreadable: an error, not a fallback
    o.offload.deferred_share = 0;
    why = fmt::format("no plan: {}", e.what());
  }
  if (!say) return;
  std::fprintf(
      stderr,
      "primecfg-train: note: offload.deferred_share = %g%s, chosen: %s (--offload.deferred-share sets it)\n",
      *o.offload.deferred_share,
      o.offload.ring_mib && *o.offload.deferred_share > 0
          ? fmt::format(" with a {:g} MiB moment window", *o.offload.ring_mib).c_str()
          : "",
      why.c_str());
}

// How the run goes, from the options.
train::RunOptions run_options(const train::TrainerOptions& o) {
  train::RunOptions run;
  run.device = o.device;
  if (o.compute_dtype) run.bf16 = *o.compute_dtype == train::ComputeDtype::bf16;
  run.dump_logits = o.dump_logits;
  run.offload = o.offload;
  run.profile = o.profile;
  run.kernels = o.kernels;
  run.cuda_graph = o.cuda_graph;
  run.save = o.save;
  run.peak_tflops = o.peak_tflops;
  run.demo = true;
  return run;
}

// Leftovers of a checkpoint that was being written when the run stopped.
void remove_partial_checkpoints(const primecfg::SFTConfig& cfg) {
  if (!cfg.ckpt) return;
  namespace fs = std::filesystem;
  const fs::path root = cfg.ckpt->output_dir.value_or(cfg.output_dir / "checkpoints");
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return;
  std::vector<fs::path> partial;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(".step_", 0) == 0 && n.size() > 4 && n.compare(n.size() - 4, 4, ".tmp") == 0)
      partial.push_back(e.path());
  }
  for (const auto& p : partial) train::remove_tree(p, ec);
}

// A device out-of-memory error: what failed, what the planner predicted, what would fit.
int report_oom(const primecfg::SFTConfig& cfg, const train::TrainerOptions& options,
               const std::string& what) {
  std::string first = what.substr(0, what.find('\n'));
  std::fprintf(stderr, "primecfg-train: error: %s\n", first.c_str());
  try {
    // Per rank of the run that failed: its ranks are the launcher's.
    auto a = machine(options);
    train::plan::apply_ranks(a, options, train::Launch::from_environment());
    auto plan = train::plan::make_plan(cfg, a);
    std::fprintf(stderr, "primecfg-train: %s", train::plan::oom_advice(plan, cfg.model.offload).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "primecfg-train: (no memory plan: %s)\n", e.what());
  }
  std::fprintf(stderr,
               "primecfg-train: see `primecfg-train --plan` with the same arguments for the breakdown\n");
  if (train::Launch::from_environment().rank == 0) remove_partial_checkpoints(cfg);  // rank 0 owns the folder
  return 1;
}

// Only async-signal-safe calls: the process is broken.
void write_hex(const char* label, std::uintptr_t v) {
  char buf[32];
  int n = 0;
  do buf[n++] = "0123456789abcdef"[v & 15], v >>= 4;
  while (v != 0);
  char out[48];
  int k = 0;
  out[k++] = ' ';
  for (const char* c = label; *c != 0; ++c) out[k++] = *c;
  out[k++] = '0', out[k++] = 'x';
  while (n > 0) out[k++] = buf[--n];
  (void)!::write(2, out, static_cast<std::size_t>(k));
}

void report_crash(int sig, siginfo_t* info, void* context) {
  const char* name = sig == SIGSEGV  ? "SIGSEGV"
                     : sig == SIGBUS ? "SIGBUS"
                     : sig == SIGILL ? "SIGILL"
                     : sig == SIGFPE ? "SIGFPE"
                                     : "SIGABRT";
  const char head[] = "primecfg-train: fatal: ";
  (void)!::write(2, head, sizeof head - 1);
  (void)!::write(2, name, std::strlen(name));
  auto say = [](const char* text) { (void)!::write(2, text, std::strlen(text)); };
  if (sig != SIGABRT) write_hex("at address ", reinterpret_cast<std::uintptr_t>(info->si_addr));
#if defined(__x86_64__)
  // The word on top of the stack is the caller when a call jumped to a bad address
  // (pc 0x0: a null function pointer) and left no frame to unwind.
  const auto* uc = static_cast<const ucontext_t*>(context);
  write_hex("pc ", static_cast<std::uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]));
  say("\ntop of stack: ");
  void* top = *reinterpret_cast<void* const*>(uc->uc_mcontext.gregs[REG_RSP]);
  ::backtrace_symbols_fd(&top, 1, 2);
#else
  (void)context;
  say("\n");
#endif
  say("the stack:\n");
  void* frames[64];
  ::backtrace_symbols_fd(frames, ::backtrace(frames, 64), 2);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void install_crash_report() {
  static char alternate[1 << 16];  // a stack overflow still gets its report
  stack_t st{};
  st.ss_sp = alternate;
  st.ss_size = sizeof alternate;
  ::sigaltstack(&st, nullptr);
  struct sigaction sa {};
  sa.sa_sigaction = report_crash;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) ::sigaction(sig, &sa, nullptr);
}

// The loader's diagnostics and the trainer's own in one order (docs/errors.md): the
// files as given (the embedded default first), then the command line, then defaults;
// by line and column within a file.
void in_file_order(std::vector<primecfg::diagnostic>& diags, const std::vector<std::string>& args,
                   bool embedded_default) {
  using primecfg::provenance;
  std::vector<std::string> files;
  if (embedded_default) files.push_back("<default config>");
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "@" && i + 1 < args.size())
      files.push_back(args[++i]);
    else if (args[i].size() > 1 && args[i][0] == '@')
      files.push_back(args[i].substr(1));
  }
  auto key = [&](const primecfg::diagnostic& d) {
    const provenance& p = d.where;
    std::size_t file = files.size();
    if (p.from == provenance::origin::file)
      file = static_cast<std::size_t>(std::find(files.begin(), files.end(), p.file) - files.begin());
    const int origin = p.from == provenance::origin::file           ? 0
                       : p.from == provenance::origin::command_line ? 1
                                                                    : 2;
    return std::tuple(origin, file, p.line, p.column);
  };
  std::stable_sort(diags.begin(), diags.end(), [&](const auto& a, const auto& b) { return key(a) < key(b); });
}

// Host memory ran out (LibTorch's CPU allocator, or the C++ runtime): what failed, the
// planner's host estimate, and what the machine and the process's limit allow.
int report_host_oom(const primecfg::SFTConfig& cfg, const train::TrainerOptions& options,
                    const std::string& what) {
  std::string first = what.substr(0, what.find('\n'));
  if (const auto at = first.find("tried to allocate "); at != std::string::npos) {  // LibTorch's wording
    const long long bytes = std::atoll(first.c_str() + at + 18);
    if (bytes > 0) first += fmt::format(" ({:.1f} MiB)", static_cast<double>(bytes) / (1 << 20));
  }
  std::fprintf(stderr, "primecfg-train: error: host memory ran out: %s\n", first.c_str());
  std::optional<std::int64_t> limit;
  if (rlimit r{}; ::getrlimit(RLIMIT_AS, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
    limit = static_cast<std::int64_t>(r.rlim_cur);
  try {
    auto a = machine(options);
    train::plan::apply_ranks(a, options, train::Launch::from_environment());
    auto plan = train::plan::make_plan(cfg, a);
    const bool cpu =
        options.device.value_or("") == "cpu" || !train::plan::cuda_device_memory(device_index(options));
    std::fprintf(stderr, "primecfg-train: %s",
                 train::plan::host_oom_advice(plan, cfg.model.offload, cpu, limit).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "primecfg-train: (no memory plan: %s)\n", e.what());
  }
  if (train::Launch::from_environment().rank == 0) remove_partial_checkpoints(cfg);
  return 1;
}

// LibTorch's CPU allocator says "DefaultCPUAllocator: can't allocate memory".
bool looks_like_host_oom(std::string_view what) {
  return what.find("DefaultCPUAllocator") != std::string_view::npos ||
         what.find("can't allocate memory") != std::string_view::npos;
}

bool looks_like_oom(std::string_view what) {
  return what.find("out of memory") != std::string_view::npos ||
         what.find("CUBLAS_STATUS_ALLOC_FAILED") != std::string_view::npos ||
         what.find("cudaErrorMemoryAllocation") != std::string_view::npos;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace primecfg;
  // A write past the file-size limit then fails with EFBIG and is reported, instead of
  // the signal ending the run without a word.
  std::signal(SIGXFSZ, SIG_IGN);
  // Likewise a write to a peer rank that died (its socket closed) fails with EPIPE and the
  // collective reports it, naming this rank, instead of SIGPIPE ending the process silently.
  std::signal(SIGPIPE, SIG_IGN);
  // A crash says where it happened (frames as binary(+offset): `addr2line -Cfpe`).
  install_crash_report();
  const std::vector<std::string> argv_list(argv + 1, argv + argc);
  for (const auto& a : argv_list) {
    if (a == "--help" || a == "-h")
      return print_out(std::string(kUsage) + models_help() + config_summary() +
                       help_text<train::TrainerOptions>());
    if (a == "--print-default") return print_out(default_config(kDefaultWarmup));
  }
  // Several ranks (torchrun, Slurm + torchrun): the launcher's variables say where this
  // process stands; without them the trainer runs alone.
  train::Launch launch;
  try {
    launch = train::Launch::from_environment();
  } catch (const train::launch_error& e) {
    std::fprintf(stderr, "primecfg-train: error: %s\n", e.what());
    return 2;
  }
  const train::CommandLine line = train::split_command_line(argv_list);
  // primecfg-train's own options: a mistake in them is a usage error (exit 2).
  loaded<train::TrainerOptions> options = load_command_line<train::TrainerOptions>(line.options);
  if (!options.diagnostics.empty())
    std::fputs(format_text(options.diagnostics, "primecfg-train options").c_str(), stderr);
  if (!options.ok()) return 2;
  const train::TrainerOptions& opts = options.value;
  train::RunOptions run = run_options(opts);
  run.launch = launch;
  run.dist = opts.dist;
  // Without a launcher nothing is reduced or gathered: a value given for it is said
  // to have no effect rather than dropped without a word. (A plan of several ranks
  // reads them: the buckets, and Gloo's copies, are in its per-rank figures.)
  if (!launch.launched && !(opts.plan && opts.plan_world_size.value_or(1) > 1))
    for (const auto& [path, from] : options.provenance)
      if (path.rfind("dist.", 0) == 0 && !from.is_default())
        std::fprintf(stderr, "%s: note: %s has no effect in one process (no ranks to reduce over)\n",
                     from.to_string().c_str(), path.c_str());
  // Knobs that were environment variables are options now: one still set is not read.
  if (launch.rank == 0)
    for (const auto& v : train::kRetiredEnvironment)
      if (const char* value = std::getenv(v.name); value != nullptr)
        std::fprintf(stderr, "primecfg-train: note: environment variable %s=%s is not read any more: %s\n",
                     v.name, value,
                     v.replacement ? fmt::format("use {} instead", v.replacement).c_str()
                                   : "no option replaces it (the behaviour it chose is fixed now)");
  // One rank reports: the others' progress lines, notes and demo would repeat it.
  if (launch.rank != 0) run.print = run.demo = false;
  std::vector<std::string> args = line.config;

  // The embedded default underlies a run without config files (overrides still apply).
  bool has_file = false;
  for (const auto& a : args) has_file |= !a.empty() && a[0] == '@';
  sources base;
  std::optional<diagnostic> warmup_note;
  if (!has_file) {
    // The default's warm-up is only a default: it adapts to a --max-steps it does not
    // fit (with a note); one the user gave is checked as written.
    sources probe;
    probe.add_text("<default config>", default_config(0));
    const loaded<SFTConfig> first = load_command_line<SFTConfig>(args, probe);
    std::int64_t warmup = kDefaultWarmup;
    if (first.source_of("scheduler.warmup_steps").file == "<default config>" && first.value.max_steps &&
        *first.value.max_steps <= kDefaultWarmup && *first.value.max_steps >= 1) {
      warmup = *first.value.max_steps / 10;
      const provenance steps_from = first.source_of("max_steps");
      warmup_note = diagnostic{
          severity::note,
          error_kind::value_error,
          "scheduler.warmup_steps",
          {},
          fmt::format(
              "the embedded default's {} warm-up steps do not fit max_steps = {} ({}): shortened to {}, "
              "a tenth of the run; --scheduler.warmup-steps sets it",
              kDefaultWarmup, *first.value.max_steps,
              steps_from.from == provenance::origin::command_line ? steps_from.file : steps_from.to_string(),
              warmup),
          ""};
    }
    base.add_text("<default config>", default_config(warmup));
  }

  loaded<SFTConfig> cfg = load_command_line<SFTConfig>(args, base);
  if (warmup_note) {
    warmup_note->where = cfg.source_of("scheduler.warmup_steps");
    cfg.diagnostics.insert(cfg.diagnostics.begin(), *warmup_note);
  }
  std::string root = "SFTConfig";
  if (!cfg.ok()) {
    // A TrainerConfig (RL trainer) file with [data.fake] is accepted too.
    auto as_trainer = load_command_line<TrainerConfig>(args, base);
    if (as_trainer.ok() && as_trainer.value.data.fake) {
      cfg.value = train::from_trainer_config(as_trainer.value);
      cfg.provenance = as_trainer.provenance;
      cfg.diagnostics = as_trainer.diagnostics;
      auto rl_only = train::check_rl_only(cfg.provenance);
      cfg.diagnostics.insert(cfg.diagnostics.end(), rl_only.begin(), rl_only.end());
      root = "TrainerConfig";
    }
  }
  if (!cfg.ok()) {
    train::suggest_options(cfg.diagnostics);
    std::fputs(format_text(cfg.diagnostics, root).c_str(), stderr);
    // As the primecfg tool: a config file that cannot be read is a usage error.
    for (const auto& d : cfg.diagnostics)
      if (d.level == severity::error && d.kind == error_kind::file_error) return 2;
    return 1;
  }
  // --plan --plan-world-size plans that many ranks: the config is checked for them
  // (dp_replicate must divide that world, not this process's).
  const int checked_world =
      opts.plan && opts.plan_world_size ? static_cast<int>(*opts.plan_world_size) : launch.world;
  auto support = train::check_support(cfg.value, cfg.provenance, checked_world);
  cfg.diagnostics.insert(cfg.diagnostics.end(), support.begin(), support.end());
  in_file_order(cfg.diagnostics, args, !has_file);
  if (!cfg.diagnostics.empty()) std::fputs(format_text(cfg.diagnostics, root).c_str(), stderr);
  if (!cfg.ok()) return 1;

  if (opts.calibrate) {
    if (launch.several()) {
      std::fprintf(stderr,
                   "primecfg-train: error: --calibrate measures one process; run it without a launcher\n");
      return 2;
    }
    try {
      train::CalibrateRequest req;
      req.config = cfg.value;
      req.models.push_back(cfg.value.model.name);
      for (const auto& m : opts.calibrate_models)
        if (std::find(req.models.begin(), req.models.end(), m) == req.models.end()) req.models.push_back(m);
      req.run = run;
      req.trainer = std::filesystem::read_symlink("/proc/self/exe");
      req.command = "primecfg-train";
      for (const auto& a : argv_list) req.command += " " + a;
      req.progress = [](const std::string& line) { std::fprintf(stderr, "calibrate: %s\n", line.c_str()); };
      const auto profile = train::calibrate(req);
      train::replace_file(
          *opts.calibrate,
          "# A machine profile for primecfg-train --plan-profile (planner/profile.hpp), written "
          "by --calibrate.\n" +
              train::plan::profile_toml(profile));
      std::fputs(train::calibration_summary(profile, opts.calibrate->string()).c_str(), stderr);
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "primecfg-train: error: --calibrate: %s\n", e.what());
      return 1;
    }
  }

  if (opts.plan) {
    try {
      auto a = machine(opts);
      train::plan::apply_ranks(a, opts, train::Launch::from_environment());
      // Step times from a machine profile: the one given, else the shipped one. Beside a
      // GPU the shipped profile was not measured on, optimizer's pipeline is planned as a
      // run here chooses it (choose_pipeline: without a profile of this GPU).
      a.profile = machine_profile(opts, false, a.profile_source);
      a.profile_chooses_here =
          opts.plan_profile || !a.gpu_name || (a.profile && *a.gpu_name == a.profile->provenance.device);
      auto plan = train::plan::make_plan(cfg.value, a);
      const auto advice = train::plan::advise(cfg.value, plan);
      return print_out(opts.plan_format == train::PlanFormat::json ? train::plan::format_json(plan, &advice)
                                                                   : train::plan::format_text(plan, &advice));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "primecfg-train: error: %s\n", e.what());
      return 1;
    }
  }

  const bool on_cuda =
      run.device ? run.device->rfind("cuda", 0) == 0 : train::plan::cuda_device_memory(0).has_value();
  // A deferral asked for where there is nothing to defer is an error, not ignored.
  if (opts.offload.deferred_share.value_or(0) > 0)
    if (const auto why = train::plan::deferral_refusal(cfg.value, on_cuda); !why.empty()) {
      std::fprintf(
          stderr,
          "%s: error: offload.deferred_share = %g defers offload = \"optimizer\"'s moment write-backs, "
          "which happen in the gradient hooks only on a GPU and without clipping: this run has %s\n",
          options.source_of("offload.deferred_share").to_string().c_str(), *opts.offload.deferred_share,
          why.c_str());
      return 2;
    }
  if (on_cuda && !opts.offload.deferred_share && train::plan::has_pipeline_choice(cfg.value)) {
    try {
      choose_pipeline(cfg.value, options.value, launch.rank == 0);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "primecfg-train: error: plan_profile: %s\n", e.what());
      return 1;
    }
    run.offload = opts.offload;
  } else if (opts.plan_profile) {
    // A run reads a machine profile for one thing only: the choice above.
    std::fprintf(stderr,
                 "%s: error: plan_profile = \"%s\": a run uses a machine profile only to choose offload = "
                 "\"optimizer\"'s pipeline on a GPU where --offload.deferred-share is unset, and this run "
                 "chooses none (it applies with --plan)\n",
                 options.source_of("plan_profile").to_string().c_str(), opts.plan_profile->c_str());
    return 2;
  }
  // A CUDA run predicted not to fit stops here, before minutes of loading.
  if (opts.memory_check && on_cuda && !run.dump_logits) {
    try {
      // The run's own ranks (WORLD_SIZE, LOCAL_WORLD_SIZE): each rank holds a shard of
      // the FP32 state, and a node's ranks share its host memory.
      auto a = machine(opts);
      train::plan::apply_ranks(a, opts, train::Launch::from_environment());
      // Gloo's ranks on one named GPU share it: each gets its node's share.
      if (launch.several() && opts.dist.backend == train::DistBackend::gloo && opts.device &&
          train::TrainerOptions::cuda_index(*opts.device) && a.gpu_capacity && !opts.plan_gpu_memory) {
        *a.gpu_capacity /= launch.local_world;
        a.gpu_capacity_source += fmt::format(", shared by its {} ranks", launch.local_world);
      }
      auto plan = train::plan::make_plan(cfg.value, a);
      if (auto why = train::plan::fit_refusal(plan, cfg.value.model.offload); !why.empty()) {
        std::fprintf(
            stderr,
            "primecfg-train: error: %sprimecfg-train: `--plan` shows the breakdown; --no-memory-check "
            "tries anyway\n",
            why.c_str());
        return 1;
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "primecfg-train: note: no memory check (%s)\n", e.what());
    }
  }

#if defined(PRIMECFG_TRAIN_HAVE_DUMP)
  run.resolved_config = dump_toml(cfg.value, cfg.provenance);
  run.resolved_options = dump_toml(opts, options.provenance);
#endif
  // In a sharded run every rank's error says which rank it is.
  const std::string who =
      launch.several() ? fmt::format("primecfg-train[rank {}]", launch.rank) : std::string("primecfg-train");
  try {
    auto result = train::run_sft(cfg.value, run);
    if (!result.losses.empty() && launch.rank == 0)
      std::fprintf(stderr, "done: steps %lld..%lld, loss %.4f -> %.4f\n",
                   static_cast<long long>(result.first_step), static_cast<long long>(result.last_step),
                   result.losses.front(), result.losses.back());
  } catch (const c10::OutOfMemoryError& e) {
    return report_oom(cfg.value, opts, e.what_without_backtrace());
  } catch (const train::run_error& e) {
    std::fprintf(stderr, "%s: error: %s\n", who.c_str(), e.what());
    return 1;
  } catch (const train::host_memory_error& e) {
    return report_host_oom(cfg.value, opts, e.what());
  } catch (const c10::Error& e) {
    if (looks_like_host_oom(e.what_without_backtrace()))
      return report_host_oom(cfg.value, opts, e.what_without_backtrace());
    if (looks_like_oom(e.what_without_backtrace()))
      return report_oom(cfg.value, opts, e.what_without_backtrace());
    std::fprintf(stderr, "%s: error: %s\n", who.c_str(), e.what_without_backtrace());
    return 1;
  } catch (const std::bad_alloc& e) {
    return report_host_oom(cfg.value, opts, std::string("an allocation failed (") + e.what() + ")");
  } catch (const std::exception& e) {
    if (looks_like_host_oom(e.what())) return report_host_oom(cfg.value, opts, e.what());
    if (looks_like_oom(e.what())) return report_oom(cfg.value, opts, e.what());
    std::fprintf(stderr, "%s: error: %s\n", who.c_str(), e.what());
    return 1;
  }
  return 0;
}
