// The training loop of primecfg-train.
//
// Read top to bottom:
//   1. Trainer<Strategy>::run(): the loop.
//   2. run_sft(): device/dtype choice and the visit_offload dispatch.
// Checkpoint tensors are checkpoint.hpp's (the folder's layout checkpoint_dir.hpp's),
// metrics and the progress line metrics.hpp's.
// The optimizers' arithmetic is in optimizer_math.hpp; where the FP32 state lives and
// when the update runs, per offload strategy, in offload_state.hpp.
#include "trainer.hpp"

#include "checkpoint.hpp"
#include "checkpoint_dir.hpp"
#include "data.hpp"
#include "device_streams.hpp"
#include "metrics.hpp"
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
// 1. The training loop
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
          // Checked before anything moves: a mistyped step must not set later checkpoints aside.
          if (const auto steps = complete_checkpoints(ckpt_root);
              std::find(steps.begin(), steps.end(), *resume_step) == steps.end())
            throw run_error(
                fmt::format("resume: {} is not a complete checkpoint (complete ones: {})",
                            step_dir(ckpt_root, *resume_step).string(),
                            steps.empty() ? std::string("none") : fmt::format("{}", fmt::join(steps, ", "))));
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
        plan::ce_chunk_tokens(cfg_.model.fused_lm_head_token_chunk_size, args->vocab_size,
                              loader.options().micro_batch_size * loader.options().seq_len);

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
// 2. Entry point
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
