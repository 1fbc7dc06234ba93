// primecfg-train [@ config.toml ...] [--section.field=value ...]
//
// Reads an SFTConfig (or a TrainerConfig with [data.fake]) through primecfg,
// rejects what the trainer does not implement, and trains. Without config files
// it runs the embedded default: a tiny model learning to reverse text on the CPU.
#include "planner.hpp"
#include "support.hpp"
#include "trainer.hpp"

#include <c10/util/Exception.h>

#include <primecfg/cli.hpp>
#include <primecfg/load.hpp>
#include <primecfg/report.hpp>
#include <primecfg/sft.hpp>
#include <primecfg/trainer.hpp>
#if __has_include(<primecfg/dump.hpp>)
#include <primecfg/dump.hpp>
#define PRIMECFG_TRAIN_HAVE_DUMP 1
#endif

#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
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

[data]
seq_len = 96
batch_size = 16
micro_batch_size = 8

[optim]
lr = 3e-3
weight_decay = 0.0

[scheduler]
type = "cosine"
warmup_steps = 20
min_lr = 3e-4
)toml";

constexpr const char* kUsage =
    R"(usage: primecfg-train [@ config.toml ...] [--section.field=value ...] [options]

Trains a Llama/Qwen3-style model with LibTorch. With no config file, runs the
embedded default (a tiny model on the built-in reverse-text task).

  @ FILE, @FILE          read an SFTConfig TOML file (later files override earlier ones)
  --a.b=value, --a.b v   override one field; --flag / --no-flag for booleans
  --device=cpu|cuda      where to run (default: cuda when available)
  --compute-dtype=bf16|fp32  compute dtype (default: bf16 on CUDA, fp32 on CPU)
  --dump-logits=FILE     train nothing: write the logits of the data's first micro-batch
                         (FP32) with its input_ids, positions and targets to FILE
                         (safetensors), to compare with transformers
  --print-default        print the embedded default config and exit
  --plan                 print the predicted peak GPU and host memory of the config in
                         each offload mode, and which modes fit; runs nothing
  --plan-format=text|json      output of --plan (default text)
  --plan-gpu-memory=GiB  GPU capacity for --plan (default: the CUDA device's, else 139)
  --plan-host-memory=GiB host memory for --plan (default: MemAvailable of /proc/meminfo)
  --no-memory-check      start a CUDA run even when the planner predicts it will not fit
                         (by default it stops before loading anything, naming what fits)
  --help                 this text

Model presets (model.name): primecfg/tiny, Qwen/Qwen3-0.6B, meta-llama/Llama-3.2-1B,
meta-llama/Llama-3.2-3B, meta-llama/Meta-Llama-3-8B, meta-llama/Llama-3.1-8B; or a local
HF directory (llama, qwen2, qwen3; every config.json key is used or refused by name).
Metrics go to <output_dir>/metrics.jsonl, the resolved config to <output_dir>/config.toml.
)";

// Prints to standard output; a write that fails (`> /dev/full`) is an error and exit 2,
// as for the primecfg tool, never a silent 0.
int print_out(std::string_view text) {
  const bool ok = std::fwrite(text.data(), 1, text.size(), stdout) == text.size() && std::fflush(stdout) == 0;
  if (ok) return 0;
  std::fprintf(stderr, "primecfg-train: error: cannot write to standard output: %s\n", std::strerror(errno));
  return 2;
}

struct PlanFlags {
  bool plan = false;
  bool json = false;
  std::optional<std::int64_t> gpu_memory, host_memory;
  std::vector<std::string> given;  // --plan-* flags seen (an error without --plan)
};

// CUDA device index of --device ("cuda", "cuda:1"); 0 by default.
int device_index(const train::RunOptions& run) {
  if (!run.device) return 0;
  auto pos = run.device->find(':');
  if (pos == std::string::npos) return 0;
  int index = 0;
  const std::string_view digits = std::string_view(*run.device).substr(pos + 1);
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  if (ec != std::errc() || end != digits.data() + digits.size() || index < 0)
    throw std::invalid_argument("--device=" + *run.device + ": the device index must be a number (cuda:0)");
  return index;
}

// What the planner assumes about this machine: the GPU's memory from the CUDA
// driver (or the flag, or the H200's 139 GiB), host memory from /proc/meminfo.
train::plan::Assumptions machine(const train::RunOptions& run, const PlanFlags& f) {
  namespace plan = train::plan;
  plan::Assumptions a;
  a.compute_bytes = run.bf16.value_or(true) ? 2 : 4;
  // The trainer's staging rings and moment window follow this variable too.
  if (const char* ring = std::getenv("PRIMECFG_OFFLOAD_RING_MB"); ring && *ring) {
    char* end = nullptr;
    const double mb = std::strtod(ring, &end);
    if (end && *end == '\0' && mb > 0 && mb < 1e9) a.ring_bytes = static_cast<std::int64_t>(mb * (1 << 20));
  }
  if (f.gpu_memory) {
    a.gpu_capacity = f.gpu_memory;
    a.gpu_capacity_source = "--plan-gpu-memory";
  } else if (auto dev = plan::cuda_device_memory(device_index(run))) {
    a.gpu_capacity = dev;
    a.gpu_capacity_source = "CUDA device " + std::to_string(device_index(run));
  } else {
    a.gpu_capacity = std::int64_t{139} << 30;
    a.gpu_capacity_source = "no CUDA device here: H200 default, set --plan-gpu-memory";
  }
  if (f.host_memory) {
    a.host_capacity = f.host_memory;
    a.host_capacity_source = "--plan-host-memory";
  } else if (auto h = plan::host_memory()) {
    a.host_capacity = h->available;
    a.host_capacity_source = "MemAvailable, of " + std::to_string(h->total >> 30) + " GiB total";
  } else {
    a.host_capacity_source = "/proc/meminfo unreadable";
  }
  return a;
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
  for (const auto& p : partial) fs::remove_all(p, ec);
}

// A device out-of-memory error: what failed, what the planner predicted, what would fit.
int report_oom(const primecfg::SFTConfig& cfg, const train::RunOptions& run, const std::string& what) {
  std::string first = what.substr(0, what.find('\n'));
  std::fprintf(stderr, "primecfg-train: error: %s\n", first.c_str());
  try {
    auto plan = train::plan::make_plan(cfg, machine(run, PlanFlags{}));
    std::fprintf(stderr, "primecfg-train: %s", train::plan::oom_advice(plan, cfg.model.offload).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "primecfg-train: (no memory plan: %s)\n", e.what());
  }
  std::fprintf(stderr,
               "primecfg-train: see `primecfg-train --plan` with the same arguments for the breakdown\n");
  remove_partial_checkpoints(cfg);
  return 1;
}

bool looks_like_oom(std::string_view what) {
  return what.find("out of memory") != std::string_view::npos ||
         what.find("CUBLAS_STATUS_ALLOC_FAILED") != std::string_view::npos ||
         what.find("cudaErrorMemoryAllocation") != std::string_view::npos;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace primecfg;
  std::vector<std::string> args;
  train::RunOptions run;
  PlanFlags plan_flags;
  bool memory_check = true;
  run.demo = true;
  // A write past the file-size limit then fails with EFBIG and is reported, instead of
  // the signal ending the run without a word.
  std::signal(SIGXFSZ, SIG_IGN);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value_of = [&](std::string_view flag) -> std::optional<std::string> {
      if (a.rfind(std::string(flag) + "=", 0) == 0) return a.substr(flag.size() + 1);
      if (a == flag && i + 1 < argc) return std::string(argv[++i]);
      return std::nullopt;
    };
    if (a == "--help" || a == "-h") return print_out(kUsage);
    if (a == "--print-default") return print_out(kDefaultConfig + 1);
    if (a == "--plan") {
      plan_flags.plan = true;
      continue;
    }
    if (a == "--no-memory-check") {
      memory_check = false;
      continue;
    }
    if (a.rfind("--plan-", 0) == 0) {
      const std::string flag = a.substr(0, a.find('='));
      std::optional<std::string> v;
      if (flag == "--plan-format" || flag == "--plan-gpu-memory" || flag == "--plan-host-memory")
        v = value_of(flag);
      if (!v) {
        std::fprintf(stderr, "primecfg-train: unknown option or missing value: %s (see --help)\n", a.c_str());
        return 2;
      }
      plan_flags.given.push_back(flag);
      if (flag == "--plan-format") {
        if (*v != "text" && *v != "json") {
          std::fprintf(stderr, "primecfg-train: --plan-format must be text or json, not \"%s\"\n",
                       v->c_str());
          return 2;
        }
        plan_flags.json = *v == "json";
      } else {
        auto bytes = train::plan::parse_gib(*v);
        if (!bytes) {
          std::fprintf(stderr, "primecfg-train: %s takes a positive size in GiB, not \"%s\"\n", flag.c_str(),
                       v->c_str());
          return 2;
        }
        (flag == "--plan-gpu-memory" ? plan_flags.gpu_memory : plan_flags.host_memory) = bytes;
      }
      continue;
    }
    if (a.rfind("--device", 0) == 0) {
      if (auto v = value_of("--device")) {
        run.device = *v;
        try {
          if (*v != "cpu") device_index(run);
        } catch (const std::invalid_argument& e) {
          std::fprintf(stderr, "primecfg-train: %s\n", e.what());
          return 2;
        }
        if (*v != "cpu" && v->rfind("cuda", 0) != 0) {
          std::fprintf(stderr, "primecfg-train: --device must be cpu, cuda or cuda:N, not \"%s\"\n",
                       v->c_str());
          return 2;
        }
        continue;
      }
    }
    if (a.rfind("--dump-logits", 0) == 0) {
      if (auto v = value_of("--dump-logits")) {
        run.dump_logits = *v;
        continue;
      }
    }
    if (a.rfind("--compute-dtype", 0) == 0) {
      if (auto v = value_of("--compute-dtype")) {
        if (*v != "bf16" && *v != "fp32") {
          std::fprintf(stderr, "primecfg-train: --compute-dtype must be bf16 or fp32, not \"%s\"\n",
                       v->c_str());
          return 2;
        }
        run.bf16 = *v == "bf16";
        continue;
      }
    }
    args.push_back(std::move(a));
  }
  if (!plan_flags.plan && !plan_flags.given.empty()) {
    std::fprintf(stderr, "primecfg-train: %s only applies with --plan\n", plan_flags.given.front().c_str());
    return 2;
  }
  if (plan_flags.plan && run.device && run.device->rfind("cuda", 0) != 0) {
    std::fprintf(stderr, "primecfg-train: --plan models a CUDA run; --device=%s is not supported with it\n",
                 run.device->c_str());
    return 2;
  }

  // The embedded default underlies a run without config files (overrides still apply).
  bool has_file = false;
  for (const auto& a : args) has_file |= !a.empty() && a[0] == '@';
  sources base;
  if (!has_file) base.add_text("<default config>", kDefaultConfig);

  loaded<SFTConfig> cfg = load_command_line<SFTConfig>(args, base);
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
    std::fputs(format_text(cfg.diagnostics, root).c_str(), stderr);
    // As the primecfg tool: a config file that cannot be read is a usage error.
    for (const auto& d : cfg.diagnostics)
      if (d.level == severity::error && d.kind == error_kind::file_error) return 2;
    return 1;
  }
  auto support = train::check_support(cfg.value, cfg.provenance);
  cfg.diagnostics.insert(cfg.diagnostics.end(), support.begin(), support.end());
  if (!cfg.diagnostics.empty()) std::fputs(format_text(cfg.diagnostics, root).c_str(), stderr);
  if (!cfg.ok()) return 1;

  if (plan_flags.plan) {
    try {
      auto plan = train::plan::make_plan(cfg.value, machine(run, plan_flags));
      return print_out(plan_flags.json ? train::plan::format_json(plan) : train::plan::format_text(plan));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "primecfg-train: error: %s\n", e.what());
      return 1;
    }
  }

  // A CUDA run predicted not to fit stops here, before minutes of loading.
  const bool on_cuda =
      run.device ? run.device->rfind("cuda", 0) == 0 : train::plan::cuda_device_memory(0).has_value();
  if (memory_check && on_cuda && !run.dump_logits) {
    try {
      auto plan = train::plan::make_plan(cfg.value, machine(run, plan_flags));
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
#endif
  try {
    auto result = train::run_sft(cfg.value, run);
    if (!result.losses.empty())
      std::fprintf(stderr, "done: steps %lld..%lld, loss %.4f -> %.4f\n",
                   static_cast<long long>(result.first_step), static_cast<long long>(result.last_step),
                   result.losses.front(), result.losses.back());
  } catch (const c10::OutOfMemoryError& e) {
    return report_oom(cfg.value, run, e.what_without_backtrace());
  } catch (const train::run_error& e) {
    std::fprintf(stderr, "primecfg-train: error: %s\n", e.what());
    return 1;
  } catch (const c10::Error& e) {
    if (looks_like_oom(e.what_without_backtrace()))
      return report_oom(cfg.value, run, e.what_without_backtrace());
    std::fprintf(stderr, "primecfg-train: error: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    if (looks_like_oom(e.what())) return report_oom(cfg.value, run, e.what());
    std::fprintf(stderr, "primecfg-train: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
