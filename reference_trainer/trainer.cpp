// The training loop of primecfg-train.
//
// Read top to bottom:
//   1. Checkpoints (safetensors, written to a temp dir and renamed).
//   2. Metrics (metrics.jsonl, progress bar or plain lines).
//   3. Trainer<Strategy>::run(): the loop.
//   4. run_sft(): device/dtype choice and the visit_offload dispatch.
// The optimizers' arithmetic is in optimizer_math.hpp; where the FP32 state lives and
// when the update runs, per offload strategy, in offload_state.hpp.
#include "trainer.hpp"

#include "checkpoint_dir.hpp"
#include "data.hpp"
#include "device_streams.hpp"
#include "model.hpp"
#include "offload_state.hpp"
#include "optimizer_math.hpp"
#include "planner.hpp"
#include "safetensors.hpp"

#include <primecfg/offload.hpp>

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include <torch/cuda.h>
#if defined(PRIMECFG_WITH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <numbers>
#include <set>
#include <string_view>
#include <thread>

namespace primecfg::train {

using torch::Tensor;
namespace fs = std::filesystem;

namespace {

// ===========================================================================
// 1. Checkpoints
// ===========================================================================

safetensors::dtype st_dtype(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32:
      return safetensors::dtype::F32;
    case torch::kBFloat16:
      return safetensors::dtype::BF16;
    case torch::kFloat16:
      return safetensors::dtype::F16;
    case torch::kInt64:
      return safetensors::dtype::I64;
    case torch::kUInt8:
      return safetensors::dtype::U8;
    default:
      throw run_error("checkpoint: unsupported dtype");
  }
}

// Tensors to write, kept alive (and on the CPU, contiguous) until written.
struct TensorBundle {
  std::vector<Tensor> keep;
  std::vector<safetensors::entry> entries;
  void add(const std::string& name, const Tensor& t) {
    Tensor c = t.detach().to(torch::kCPU).contiguous();
    keep.push_back(c);
    entries.push_back({name, st_dtype(c.scalar_type()),
                       std::vector<std::int64_t>(c.sizes().begin(), c.sizes().end()), c.data_ptr(),
                       c.nbytes()});
  }
};

// A whole file, or an error naming it (a full disk must not pass as a checkpoint).
void write_file(const fs::path& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.close();
  if (!out) throw run_error(path.string() + ": write failed");
}

std::string_view hf_dtype_name(torch::ScalarType t) {
  return t == torch::kBFloat16 ? "bfloat16" : t == torch::kFloat16 ? "float16" : "float32";
}

// The tokenizer and generation settings of the HF directory the run started from, so
// that a checkpoint is a model directory that HF and vLLM can use as it is.
void copy_tokenizer_files(const std::optional<fs::path>& source_dir, const fs::path& to) {
  if (!source_dir) return;
  for (const char* name :
       {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
        "merges.txt", "generation_config.json", "chat_template.jinja", "added_tokens.json"}) {
    std::error_code ec;
    const fs::path from = *source_dir / name;
    if (!fs::is_regular_file(from, ec)) continue;
    fs::copy_file(from, to / name, fs::copy_options::overwrite_existing, ec);
    if (ec)
      throw run_error(fmt::format("{}: cannot copy into the checkpoint: {}", from.string(), ec.message()));
  }
}

template <class Strategy>
void save_checkpoint(const fs::path& root, Transformer& model, OffloadState<Strategy>& state,
                     const OptSettings& opt, const TrainPosition& pos, const CheckpointConfig& cfg,
                     const std::optional<fs::path>& source_dir) {
  state.sync_host();
  fs::create_directories(root);
  const fs::path tmp = root / fmt::format(".step_{}.tmp", pos.step);
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    // model.safetensors + config.json: the folder is also an HF model directory.
    {
      TensorBundle b;
      for (const auto& p : model.params()) b.add(p.name, p.tensor);
      safetensors::write(tmp / "model.safetensors", b.entries, {{"format", "pt"}});
      write_file(tmp / "config.json", hf_config_json(model.args(), hf_dtype_name(model.dtype())));
      copy_tokenizer_files(source_dir, tmp);
    }
    if (!cfg.skip_optimizer) {
      TensorBundle b;
      for (auto& s : state.states()) {
        b.add("master." + s.p->name, s.master);
        if (s.m1.defined()) b.add("m1." + s.p->name, s.m1);
        if (s.m2.defined()) b.add("m2." + s.p->name, s.m2);
      }
      safetensors::write(tmp / "optimizer.safetensors", b.entries, {{"optimizer", std::string(opt.name())}});
    }
    {
      TensorBundle b;
      b.add("rng.cpu", at::detail::getDefaultCPUGenerator().get_state());
      safetensors::write(tmp / "trainer_state.safetensors", b.entries,
                         {{"step", std::to_string(pos.step)},
                          {"data_position", std::to_string(pos.data_position)},
                          {"scheduler_step", std::to_string(pos.scheduler_step)},
                          {"offload", std::string(Strategy::name)},
                          {"optimizer", std::string(opt.name())}});
    }
    // Last: the manifest, which makes the folder a checkpoint; then one rename.
    write_manifest(tmp, pos.step, !cfg.skip_optimizer);
    publish_checkpoint(tmp, step_dir(root, pos.step));
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);  // a full disk must not leave half a checkpoint behind
    throw;
  }
  if (cfg.keep_last) prune_checkpoints(root, *cfg.keep_last, pos.step);
}

// Copies a checkpoint tensor into dst, checking name, shape and dtype (a checkpoint
// of another model fails here with the tensor's name); marks it consumed.
void load_into(const safetensors::file& f, const std::string& name, Tensor dst,
               std::set<std::string>& consumed) {
  const auto* t = f.find(name);
  if (!t)
    throw run_error(fmt::format("{}: tensor {} missing (checkpoint of another model or optimizer?)",
                                f.path().string(), name));
  std::vector<std::int64_t> want(dst.sizes().begin(), dst.sizes().end());
  if (t->shape != want)
    throw run_error(fmt::format("{}: tensor {} has shape [{}], this model needs [{}]", f.path().string(),
                                name, fmt::join(t->shape, ", "), fmt::join(want, ", ")));
  torch::ScalarType st;
  switch (t->type) {
    case safetensors::dtype::BF16:
      st = torch::kBFloat16;
      break;
    case safetensors::dtype::F32:
      st = torch::kFloat32;
      break;
    case safetensors::dtype::F16:
      st = torch::kFloat16;
      break;
    default:
      throw run_error(fmt::format("{}: tensor {} has dtype {}; a checkpoint holds F32, BF16 or F16 here",
                                  f.path().string(), name, safetensors::dtype_name(t->type)));
  }
  if (dst.scalar_type() == torch::kFloat32 && st != torch::kFloat32 && name.rfind("model.", 0) != 0 &&
      name != "lm_head.weight")
    throw run_error(fmt::format("{}: tensor {} has dtype {}; optimizer state is FP32", f.path().string(),
                                name, safetensors::dtype_name(t->type)));
  torch::NoGradGuard ng;
  Tensor src = torch::from_blob(const_cast<std::byte*>(t->data), t->shape, torch::TensorOptions().dtype(st));
  if (!torch::isfinite(src).all().item<bool>())
    throw run_error(fmt::format("{}: tensor {} holds NaN or infinite values", f.path().string(), name));
  dst.detach().copy_(src);
  consumed.insert(name);
}

// Every tensor of a checkpoint file was loaded, or the checkpoint is not this run's.
void all_consumed(const safetensors::file& f, const std::set<std::string>& consumed) {
  for (const auto& t : f.tensors())
    if (!consumed.count(t.name))
      throw run_error(fmt::format("{}: tensor {} is not part of this run's model or optimizer",
                                  f.path().string(), t.name));
}

template <class Strategy>
TrainPosition load_checkpoint(const fs::path& dir, std::int64_t step, Transformer& model,
                              OffloadState<Strategy>& state, const OptSettings& opt,
                              const CheckpointConfig& cfg) {
  if (!fs::is_directory(dir)) throw run_error(dir.string() + ": no such checkpoint");
  try {
    const Manifest manifest = verify_checkpoint(dir, step);
    // The model must be the run's: config.json describes the same parameters.
    const ModelArgs saved = read_hf_config(dir / "config.json");
    if (saved.params().size() != model.args().params().size() ||
        saved.total_params() != model.args().total_params())
      throw run_error(fmt::format("{}: a {} model with {} parameters, this run's has {}",
                                  (dir / "config.json").string(), arch_name(saved.arch), saved.total_params(),
                                  model.args().total_params()));
    auto mf = safetensors::file::open(dir / "model.safetensors");
    std::set<std::string> consumed;
    for (auto& p : model.params()) load_into(mf, p.name, p.tensor, consumed);
    all_consumed(mf, consumed);
    if (!cfg.skip_optimizer) {
      if (!manifest.optimizer)
        throw run_error(fmt::format(
            "{}: has no optimizer state (saved with ckpt.skip_optimizer); set ckpt.skip_optimizer = true to "
            "resume from its weights with fresh optimizer moments",
            dir.string()));
      auto of = safetensors::file::open(dir / "optimizer.safetensors");
      auto it = of.metadata().find("optimizer");
      if (it == of.metadata().end() || it->second != opt.name())
        throw run_error(
            fmt::format("{}: optimizer state is {}, the config asks for {} (set ckpt.skip_optimizer to "
                        "load weights only)",
                        of.path().string(), it == of.metadata().end() ? "unnamed" : it->second, opt.name()));
      consumed.clear();
      for (auto& s : state.states()) {
        load_into(of, "master." + s.p->name, s.master, consumed);
        if (s.m1.defined()) load_into(of, "m1." + s.p->name, s.m1, consumed);
        if (s.m2.defined()) load_into(of, "m2." + s.p->name, s.m2, consumed);
      }
      all_consumed(of, consumed);
    } else {
      state.masters_from_model();  // asked for: masters are the weights, moments start at zero
    }
    auto sf = safetensors::file::open(dir / "trainer_state.safetensors");
    TrainPosition pos = parse_trainer_state(sf.metadata(), sf.path().string(), step);
    if (cfg.skip_scheduler) pos.scheduler_step = 0;
    if (const auto* rng = sf.find("rng.cpu")) {
      auto t = torch::empty({static_cast<std::int64_t>(rng->nbytes)}, torch::kUInt8);
      std::memcpy(t.data_ptr(), rng->data, rng->nbytes);
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      gen.set_state(t);
    }
    return pos;
  } catch (const safetensors::error& e) {
    throw run_error(e.what());
  } catch (const checkpoint_error& e) {
    throw run_error(e.what());
  } catch (const model_config_error& e) {
    throw run_error(e.what());
  }
}

// ===========================================================================
// 2. Metrics
// ===========================================================================

double rss_bytes(const char* field) {  // VmRSS / VmHWM from /proc/self/status
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field, 0) == 0) return std::stod(line.substr(std::strlen(field))) * 1024.0;
  return 0;
}

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

// Peak dense bf16 FLOP/s of the device for MFU; nullopt when unknown.
std::optional<double> peak_flops(torch::Device d) {
  if (const char* env = std::getenv("PRIMECFG_PEAK_TFLOPS")) return std::stod(env) * 1e12;
  const std::string name = dev::device_name(d);
  if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) return 989e12;
  return std::nullopt;
}

double peak_device_bytes(torch::Device d) {
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
  std::map<std::string, double> host_state;
  std::map<std::string, double> pipeline;
  std::int64_t tokens = 0;
};

// A number for metrics.jsonl: JSON has no NaN or infinity, so those are null.
std::string json_number(double v, std::string_view f) {
  return std::isfinite(v) ? fmt::vformat(f, fmt::make_format_args(v)) : "null";
}

class Reporter {
 public:
  Reporter(const fs::path& out_dir, bool print, std::string_view mode)
      : path_(out_dir / "metrics.jsonl"), print_(print), mode_(mode) {
    fs::create_directories(out_dir);
    jsonl_.open(path_, std::ios::app);
    if (!jsonl_) throw run_error(path_.string() + ": cannot open for writing");
    tty_ = ::isatty(::fileno(stderr));
  }
  ~Reporter() {
    if (tty_ && print_ && bar_shown_) std::fputc('\n', stderr);
  }

  void log(const StepMetrics& m) {
    std::string host, pipe;
    for (const auto& [k, v] : m.host_state) host += fmt::format(",\"{}\":{:.6f}", k, v / GiB);
    for (const auto& [k, v] : m.pipeline)
      pipe += fmt::format("{}\"{}\":{:.6g}", pipe.empty() ? "" : ",", k, v);
    jsonl_ << fmt::format(
        "{{\"step\":{},\"loss\":{},\"lr\":{:.6g},\"grad_norm\":{},\"tokens\":{},\"tokens_per_s\":{:."
        "2f},"
        "\"mfu\":{},\"step_time_s\":{:.4f},\"peak_device_mem_gib\":{:.4f},\"host_mem_gib\":{{\"rss\":{:.4f}{}"
        "}},"
        "\"offload\":\"{}\"{}}}\n",
        m.step, json_number(m.loss, "{:.6f}"), m.lr, json_number(m.grad_norm, "{:.6g}"), m.tokens,
        m.tokens_per_s, m.mfu ? fmt::format("{:.4f}", *m.mfu) : "null", m.step_time, m.peak_device / GiB,
        m.host_rss / GiB, host, mode_, pipe.empty() ? std::string() : ",\"pipeline\":{" + pipe + "}");
    jsonl_.flush();
    if (!jsonl_) throw run_error(path_.string() + ": write failed (disk full?)");
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
  fs::path path_;
  std::ofstream jsonl_;
  bool print_, tty_ = false, bar_shown_ = false;
  std::string mode_;
};

// PRIMECFG_PROFILE=trace.json records the last two steps of a run with the
// Kineto profiler (CPU ops and CUDA kernels, as torch.profiler does; only the
// latter with PRIMECFG_PROFILE_CPU=0) and writes
// a Chrome trace: what bench/trainer/profile_gpu.sh compares with the PyTorch peer.
class StepProfiler {
 public:
  explicit StepProfiler(std::int64_t last_step) {
    const char* path = std::getenv("PRIMECFG_PROFILE");
    if (!path || !*path) return;
    path_ = path;
    first_ = std::max<std::int64_t>(1, last_step - 1);
    last_ = last_step;
  }
  void before_step(std::int64_t step) {  // step counts from 1
    if (path_.empty() || step != first_) return;
    namespace prof = torch::autograd::profiler;
    prof::ProfilerConfig config(prof::ProfilerState::KINETO);
    // PRIMECFG_PROFILE_CPU=0 records only the GPU's kernels and copies: recording every
    // host operator slows the host down enough to change what a host-bound step does.
    const char* cpu = std::getenv("PRIMECFG_PROFILE_CPU");
    std::set<torch::profiler::impl::ActivityType> activities;
    if (!cpu || std::string_view(cpu) != "0" || !torch::cuda::is_available())
      activities.insert(torch::profiler::impl::ActivityType::CPU);
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
};

// ===========================================================================
// 3. The training loop
// ===========================================================================

double scheduled_lr(const SchedulerConfig& sched, double peak, std::int64_t step, std::int64_t max_steps) {
  return std::visit(
      [&](const auto& s) -> double {
        using S = std::decay_t<decltype(s)>;
        if (step < s.warmup_steps)
          return peak * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
        if constexpr (std::is_same_v<S, ConstantSchedulerConfig>) {
          return peak;
        } else {
          const std::int64_t decay =
              s.decay_steps.value_or(std::max<std::int64_t>(1, max_steps - s.warmup_steps));
          const double t =
              std::min(1.0, static_cast<double>(step - s.warmup_steps) / static_cast<double>(decay));
          const double shape = std::is_same_v<S, LinearSchedulerConfig>
                                   ? 1.0 - t
                                   : 0.5 * (1.0 + std::cos(std::numbers::pi * t));
          return s.min_lr + (peak - s.min_lr) * shape;
        }
      },
      sched);
}

// The forward pass of one micro-batch, no gradients, its logits (FP32, [rows, seq_len,
// vocab]) written beside its inputs: what a test compares with transformers.
void write_logits(Transformer& model, const data::MicroBatch& mb, const fs::path& path) {
  torch::NoGradGuard no_grad;
  const torch::Device dev = model.device();
  auto ids = torch::tensor(mb.input_ids, torch::kInt64).view({mb.rows, mb.seq_len});
  auto positions = torch::tensor(mb.positions, torch::kInt64).view({mb.rows, mb.seq_len});
  auto docs = torch::tensor(mb.doc_ids, torch::kInt64).view({mb.rows, mb.seq_len});
  Transformer::Inputs in{ids.to(dev), positions.to(dev), std::nullopt};
  if (!mb.one_doc_per_row) {
    Tensor d = docs.to(dev);
    Tensor same = d.unsqueeze(2).eq(d.unsqueeze(1));
    in.mask = same.logical_and(torch::ones({mb.seq_len, mb.seq_len}, same.options()).tril()).unsqueeze(1);
  }
  Tensor logits = torch::matmul(model.hidden(in, false), model.lm_head().t()).to(torch::kFloat32);
  TensorBundle b;
  b.add("input_ids", ids);
  b.add("positions", positions);
  b.add("doc_ids", docs);
  b.add("targets", torch::tensor(mb.targets, torch::kInt64).view({mb.rows, mb.seq_len}));
  b.add("logits", logits);
  const fs::path tmp = path.string() + ".tmp";
  safetensors::write(tmp, b.entries, {{"format", "pt"}});
  fs::rename(tmp, path);
}

struct Setup {
  torch::Device device = torch::kCPU;
  torch::ScalarType dtype = torch::kFloat32;
};

template <offload_strategy Strategy>
class Trainer {
 public:
  Trainer(const SFTConfig& cfg, const RunOptions& opts, const Setup& setup)
      : cfg_(cfg), opts_(opts), setup_(setup) {}

  RunResult run() {
    // --- The run's folder: one writer, never two runs mixed ----------------
    // Before anything is loaded, so that a mistake costs seconds, not a model load.
    const CheckpointConfig ckpt = cfg_.ckpt.value_or(CheckpointConfig{});
    const fs::path ckpt_root = ckpt.output_dir.value_or(cfg_.output_dir / "checkpoints");
    std::optional<OutputDirLock> lock;
    std::optional<std::int64_t> resume_step;
    if (!opts_.dump_logits) {
      try {
        lock.emplace(cfg_.output_dir);
        remove_stale_temporaries(ckpt_root);
        if (cfg_.resume) {
          resume_step = cfg_.resume->step;
          if (!resume_step) {
            const auto steps = complete_checkpoints(ckpt_root);
            if (steps.empty())
              throw run_error(fmt::format("resume: no checkpoint in {}", ckpt_root.string()));
            resume_step = steps.back();
          }
          if (const std::string note = prepare_resume(cfg_.output_dir, ckpt_root, *resume_step);
              !note.empty() && opts_.print)
            std::fprintf(stderr, "primecfg-train: note: %s\n", note.c_str());
        } else {
          prepare_fresh_run(cfg_.output_dir, ckpt_root, cfg_.clean);
        }
      } catch (const checkpoint_error& e) {
        throw run_error(e.what());
      }
    }

    // --- Model -----------------------------------------------------------
    const auto& name = cfg_.model.name;
    std::optional<ModelArgs> args = preset(name);
    const bool hf_dir = !args && fs::exists(fs::path(name) / "config.json");
    if (hf_dir) args = read_hf_config(fs::path(name) / "config.json");
    const std::optional<fs::path> source_dir = hf_dir ? std::optional<fs::path>(name) : std::nullopt;
    if (!args)
      throw run_error(
          fmt::format("model.name = \"{}\" is neither a preset ({}) nor a local directory with "
                      "config.json (nothing is downloaded)",
                      name, fmt::join(preset_names(), ", ")));
    if (cfg_.model.debug && cfg_.model.debug->num_layers)
      args->layers = std::min(args->layers, *cfg_.model.debug->num_layers);
    const std::int64_t seed = std::visit(
        [](const auto& d) -> std::int64_t {
          if constexpr (requires { d.seed; }) return d.seed;
          return 0;
        },
        cfg_.data);
    torch::manual_seed(static_cast<std::uint64_t>(seed));
    Transformer model(*args, setup_.device, setup_.dtype, static_cast<std::uint64_t>(seed));
    if (hf_dir && !(cfg_.model.debug && cfg_.model.debug->random_init)) model.load_hf_weights(name);

    // --- Data, optimizer, strategy ------------------------------------------
    data::Loader loader = data::make_loader(cfg_.data, args->vocab_size);
    if (const std::string note = loader.source_report(); !note.empty() && opts_.print)
      std::fprintf(stderr, "primecfg-train: note: %s\n", note.c_str());
    if (opts_.dump_logits) {
      write_logits(model, loader.next().micro.front(), *opts_.dump_logits);
      return {};
    }
    const std::int64_t seq_len = loader.options().seq_len;
    const auto opt = OptSettings::from(cfg_.optim);
    OffloadState<Strategy> state(model, opt, opts_);
    const bool ac = cfg_.model.ac.has_value();
    const std::int64_t ac_freq = ac ? cfg_.model.ac->freq : 1;
    const std::int64_t ce_chunk =
        cfg_.model.fused_lm_head_token_chunk_size.value_or(plan::default_ce_chunk_tokens(args->vocab_size));

    // --- Resume --------------------------------------------------------------
    TrainPosition pos;
    if (resume_step) {
      pos = load_checkpoint(step_dir(ckpt_root, *resume_step), *resume_step, model, state, opt, ckpt);
      loader.set_position(pos.data_position);
    }
    const bool endless = std::holds_alternative<FakeDataConfig>(cfg_.data) ||
                         (std::get<SFTDataConfig>(cfg_.data).path == std::nullopt && !cfg_.max_steps);
    if (!cfg_.max_steps && std::holds_alternative<FakeDataConfig>(cfg_.data))
      throw run_error("max_steps: fake data is endless; set max_steps");
    const std::int64_t max_steps =
        cfg_.max_steps.value_or(endless ? 1000 : std::numeric_limits<std::int64_t>::max());

    // --- Reporting -----------------------------------------------------------
    fs::create_directories(cfg_.output_dir);
    if (!opts_.resolved_config.empty()) write_file(cfg_.output_dir / "config.toml", opts_.resolved_config);
    Reporter reporter(cfg_.output_dir, opts_.print, Strategy::name);
    const double flops_per_token =
        6.0 * static_cast<double>(args->matmul_params()) +
        12.0 * args->layers * args->heads * args->head_dim * static_cast<double>(seq_len);
    const auto peak = peak_flops(setup_.device);
    if (opts_.print)
      std::fprintf(stderr,
                   "primecfg-train: %s, %.2fM params, offload = %.*s, optim = %.*s, %s %s, seq_len %lld\n",
                   name.c_str(), static_cast<double>(args->total_params()) / 1e6,
                   static_cast<int>(Strategy::name.size()), Strategy::name.data(),
                   static_cast<int>(opt.name().size()), opt.name().data(), setup_.device.str().c_str(),
                   setup_.dtype == torch::kBFloat16 ? "bf16" : "fp32", static_cast<long long>(seq_len));

    // --- Loop ------------------------------------------------------------------
    RunResult result;
    result.first_step = pos.step;
    StepProfiler profiler(max_steps);
    while (pos.step < max_steps && !(loader.epoch_done() && !endless && !cfg_.max_steps)) {
      profiler.before_step(pos.step + 1);
      const auto t0 = std::chrono::steady_clock::now();
      data::Batch batch = loader.next();
      const double lr = scheduled_lr(cfg_.scheduler, opt.lr, pos.scheduler_step, max_steps);
      state.begin_step(lr, pos.step + 1, batch.micro.size() == 1);
      const double scale = 1.0 / static_cast<double>(std::max<std::int64_t>(1, batch.loss_tokens));
      // Summed on the device, read once per step: the host runs ahead of the GPU
      // across micro-batches.
      Tensor loss_acc = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(setup_.device));
      for (std::size_t m = 0; m < batch.micro.size(); ++m) {
        const auto& mb = batch.micro[m];
        const bool last = m + 1 == batch.micro.size();
        // The inputs are queued before the offload prefetch below: copies share the
        // copy engine in queue order, and the forward pass waits for its inputs.
        const std::array<std::int64_t, 2> shape{mb.rows, mb.seq_len};
        Transformer::Inputs in{to_device(mb.input_ids, shape, setup_.device),
                               to_device(mb.positions, shape, setup_.device), std::nullopt};
        if (!mb.one_doc_per_row) {
          Tensor doc = to_device(mb.doc_ids, shape, setup_.device);
          Tensor same = doc.unsqueeze(2).eq(doc.unsqueeze(1));
          in.mask =
              same.logical_and(torch::ones({mb.seq_len, mb.seq_len}, same.options()).tril()).unsqueeze(1);
        }
        const std::array<std::int64_t, 1> flat{static_cast<std::int64_t>(mb.targets.size())};
        Tensor targets = to_device(mb.targets, flat, setup_.device);
        if (last) state.begin_last_micro_batch(mb.input_ids);
        Tensor loss = model.loss(model.hidden(in, ac, ac_freq, state.block_hook()), targets, scale, ce_chunk,
                                 state.loss_hooks(last), state.loss_chunks(targets.numel()));
        if (last) state.before_backward();
        loss.backward();
        loss_acc += loss.detach().to(torch::kFloat64);
      }
      const double grad_norm = state.finish_step();
      const double loss_sum = loss_acc.item<double>();
      state.end_step();
      ++pos.step;
      ++pos.scheduler_step;
      pos.data_position = loader.position();
      // The step ends when the compute stream is done (for OptimizerOffload the
      // last moment write-backs may still run beside the next forward).
      dev::synchronize(dev::current_stream(setup_.device));
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      result.losses.push_back(loss_sum);
      profiler.after_step(pos.step);

      StepMetrics met;
      met.step = pos.step;
      met.max_steps = max_steps;
      met.loss = loss_sum;
      met.lr = lr;
      met.grad_norm = grad_norm;
      met.step_time = dt;
      met.tokens = batch.tokens;
      met.tokens_per_s = static_cast<double>(batch.tokens) / dt;
      if (peak) met.mfu = met.tokens_per_s * flops_per_token / *peak;
      met.peak_device = peak_device_bytes(setup_.device);
      met.host_rss = rss_bytes("VmRSS:");
      met.host_state = state.host_bytes();
      met.pipeline = state.pipeline_stats();
      reporter.log(met);
      // A NaN or infinite loss or gradient norm has reached (or will reach) the weights:
      // stop before a checkpoint of this step could be written.
      if (!std::isfinite(loss_sum) || !std::isfinite(grad_norm))
        throw run_error(fmt::format(
            "step {}: the loss is {} and the gradient norm {}; stopping (no checkpoint of this step is "
            "written; resume from the last one with a lower optim.lr or with optim.max_norm)",
            pos.step, loss_sum, grad_norm));

      if (cfg_.ckpt && ckpt.interval && pos.step % *ckpt.interval == 0)
        save_checkpoint(ckpt_root, model, state, opt, pos, ckpt, source_dir);
    }
    if (cfg_.ckpt && !(ckpt.interval && pos.step % *ckpt.interval == 0) && pos.step > result.first_step)
      save_checkpoint(ckpt_root, model, state, opt, pos, ckpt, source_dir);
    result.last_step = pos.step;
    state.sync_host();  // the last step's deferred updates

    if (opts_.collect_weights) {
      for (auto& s : state.states()) {
        Tensor m = s.master.to(torch::kCPU).contiguous();
        result.weights.emplace_back(s.p->name,
                                    std::vector<float>(m.data_ptr<float>(), m.data_ptr<float>() + m.numel()));
        Tensor w = s.p->tensor.detach().to(torch::kCPU, torch::kFloat32).contiguous();
        result.model_weights.emplace_back(
            s.p->name, std::vector<float>(w.data_ptr<float>(), w.data_ptr<float>() + w.numel()));
      }
    }
    if (opts_.demo) demo(model);
    return result;
  }

 private:
  // A few held-out reversals, greedy-decoded.
  void demo(Transformer& model) {
    const auto* d = std::get_if<SFTDataConfig>(&cfg_.data);
    if (!d || d->path) return;
    std::fprintf(stderr, "\nreverse-text samples (held out):\n");
    int correct = 0;
    for (int i = 0; i < 6; ++i) {
      auto [prompt, want] = data::reverse_text_pair(d->seed + 7919, i);
      std::vector<std::int64_t> ids{data::ByteTokenizer::bos};
      for (auto t : data::ByteTokenizer::encode(prompt)) ids.push_back(t);
      ids.push_back(data::ByteTokenizer::sep);
      auto got = data::ByteTokenizer::decode(
          model.generate(ids, static_cast<std::int64_t>(want.size()) + 2, data::ByteTokenizer::eos));
      correct += got == want;
      std::string verdict = got == want ? "ok" : "(want " + want + ")";
      std::fprintf(stderr, "  %-10s -> %-12s %s\n", prompt.c_str(), got.c_str(), verdict.c_str());
    }
    std::fprintf(stderr, "%d/6 exact\n", correct);
  }

  const SFTConfig& cfg_;
  RunOptions opts_;
  Setup setup_;
};

}  // namespace

// ===========================================================================
// 4. Entry point
// ===========================================================================

RunResult run_sft(const SFTConfig& cfg, const RunOptions& opts) {
  Setup setup;
  std::string dev = opts.device.value_or(torch::cuda::is_available() ? "cuda" : "cpu");
  try {
    setup.device = torch::Device(dev);
  } catch (const std::exception&) {
    throw run_error(fmt::format("unknown device \"{}\"", dev));
  }
  if (setup.device.is_cuda() && !torch::cuda::is_available())
    throw run_error("device cuda requested but this LibTorch has no usable CUDA device");
  // bf16 where the hardware has it (GPUs); FP32 on CPUs, where bf16 matmuls are emulated.
  setup.dtype = opts.bf16.value_or(setup.device.is_cuda()) ? torch::kBFloat16 : torch::kFloat32;
  return primecfg::visit_offload(
      cfg.model.offload, [&]<class Strategy>(Strategy) { return Trainer<Strategy>(cfg, opts, setup).run(); });
}

}  // namespace primecfg::train
