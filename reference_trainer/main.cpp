// primecfg-train [@ config.toml ...] [--section.field=value ...]
//
// Reads an SFTConfig (or a TrainerConfig with [data.fake]) through primecfg,
// rejects what the trainer does not implement, and trains. Without config files
// it runs the embedded default: a tiny model learning to reverse text on the CPU.
#include "support.hpp"
#include "trainer.hpp"

#include <primecfg/cli.hpp>
#include <primecfg/load.hpp>
#include <primecfg/report.hpp>
#include <primecfg/sft.hpp>
#include <primecfg/trainer.hpp>
#if __has_include(<primecfg/dump.hpp>)
#include <primecfg/dump.hpp>
#define PRIMECFG_TRAIN_HAVE_DUMP 1
#endif

#include <cstdio>
#include <string>
#include <vector>

namespace {

// The run with no config file: about a minute on two CPU cores.
constexpr const char* kDefaultConfig = R"toml(
max_steps = 200
output_dir = "outputs/default"

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
  --print-default        print the embedded default config and exit
  --help                 this text

Model presets (model.name): primecfg/tiny, Qwen/Qwen3-0.6B, meta-llama/Llama-3.2-1B,
meta-llama/Llama-3.2-3B, meta-llama/Meta-Llama-3-8B; or a local HF directory.
Metrics go to <output_dir>/metrics.jsonl, the resolved config to <output_dir>/config.toml.
)";

// An SFTConfig that trains on a TrainerConfig's fake data.
primecfg::SFTConfig from_trainer_config(const primecfg::TrainerConfig& t) {
  primecfg::SFTConfig s;
  s.model = t.model;
  s.data = *t.data.fake;
  s.optim = t.optim;
  s.scheduler = t.scheduler;
  s.ckpt = t.ckpt;
  s.log = t.log;
  s.max_steps = t.max_steps;
  s.output_dir = t.output_dir;
  s.dist_timeout_seconds = t.dist_timeout_seconds;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace primecfg;
  std::vector<std::string> args;
  train::RunOptions run;
  run.demo = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value_of = [&](std::string_view flag) -> std::optional<std::string> {
      if (a.rfind(std::string(flag) + "=", 0) == 0) return a.substr(flag.size() + 1);
      if (a == flag && i + 1 < argc) return std::string(argv[++i]);
      return std::nullopt;
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--print-default") {
      std::fputs(kDefaultConfig + 1, stdout);
      return 0;
    }
    if (a == "--plan") {
      std::fputs("primecfg-train: --plan (the memory planner) is not implemented yet\n", stderr);
      return 2;
    }
    if (a.rfind("--device", 0) == 0) {
      if (auto v = value_of("--device")) {
        run.device = *v;
        continue;
      }
    }
    if (a.rfind("--compute-dtype", 0) == 0) {
      if (auto v = value_of("--compute-dtype")) {
        if (*v != "bf16" && *v != "fp32") {
          std::fprintf(stderr, "primecfg-train: --compute-dtype must be bf16 or fp32, not \"%s\"\n",
                       v->c_str());
          return 1;
        }
        run.bf16 = *v == "bf16";
        continue;
      }
    }
    args.push_back(std::move(a));
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
      cfg.value = from_trainer_config(as_trainer.value);
      cfg.provenance = as_trainer.provenance;
      cfg.diagnostics = as_trainer.diagnostics;
      root = "TrainerConfig";
    }
  }
  if (!cfg.ok()) {
    std::fputs(format_text(cfg.diagnostics, root).c_str(), stderr);
    return 1;
  }
  auto support = train::check_support(cfg.value, cfg.provenance);
  cfg.diagnostics.insert(cfg.diagnostics.end(), support.begin(), support.end());
  if (!cfg.diagnostics.empty()) std::fputs(format_text(cfg.diagnostics, root).c_str(), stderr);
  if (!cfg.ok()) return 1;

#if defined(PRIMECFG_TRAIN_HAVE_DUMP)
  run.resolved_config = dump_toml(cfg.value, cfg.provenance);
#endif
  try {
    auto result = train::run_sft(cfg.value, run);
    if (!result.losses.empty())
      std::fprintf(stderr, "done: steps %lld..%lld, loss %.4f -> %.4f\n",
                   static_cast<long long>(result.first_step), static_cast<long long>(result.last_step),
                   result.losses.front(), result.losses.back());
  } catch (const train::run_error& e) {
    std::fprintf(stderr, "primecfg-train: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "primecfg-train: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
