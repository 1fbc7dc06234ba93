// The training loop of primecfg-train.
//
// Read top to bottom:
//   1. Trainer<Strategy>: run() is the loop; setup(), train_step() and finish() its parts.
//   2. run_sft(): device/dtype choice and the visit_offload dispatch.
// Checkpoint tensors are checkpoint/tensors.hpp's (the folder's layout checkpoint/dir.hpp's),
// metrics and the progress line metrics.hpp's.
// The optimizers' arithmetic is in optim/math.hpp; where the FP32 state lives and
// when the update runs, per offload strategy, in offload/ (offload/pipeline.hpp).
#include "trainer.hpp"

#include "base/device_graph.hpp"
#include "base/device_streams.hpp"
#include "base/mapped_copies.hpp"
#include "base/safetensors.hpp"
#include "checkpoint/dir.hpp"
#include "checkpoint/tensors.hpp"
#include "data/loader.hpp"
#include "distributed/group_exchange.hpp"
#include "distributed/process_group.hpp"
#include "distributed/sharding.hpp"
#include "metrics.hpp"
#include "model/architecture.hpp"
#include "nn/activation_offload.hpp"
#include "nn/fp8.hpp"
#include "nn/hf_weights.hpp"
#include "nn/kernels/fused_ops.hpp"
#include "nn/loss_chunking.hpp"
#include "nn/transformer.hpp"
#include "offload/pipeline.hpp"
#include "optim/cpu/cpu_optim.hpp"
#include "optim/math.hpp"

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
#include <limits>
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
  Tensor logits =
      torch::matmul(model.hidden(in, Recompute::nothing), model.lm_head().t()).to(torch::kFloat32);
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

// prime-rl's load-balance figures of routed experts, as its SFT loop logs them
// (trainer/model.py's get_load_balance_stats): per micro-batch, the mean over routed blocks
// of max_vio (each expert's slots, the top_k most loaded left out; the largest over their
// mean, less 1) and of the routing confidence (the top-k probability mass per token before
// renormalisation); max_vio the largest of the ranks', the confidence their mean; then
// averaged over the step's micro-batches. Also the step's slots per expert, over all
// blocks and ranks.
struct RoutingFigures {
  // Per micro-batch: the routed blocks' slots per expert [blocks, E] and top-k probability
  // sums [blocks], where the router left them (read back once, at the step's end: not a
  // device sync per block), and the tokens each block routed.
  std::vector<Tensor> counts, confidence_sums;
  std::vector<std::vector<std::int64_t>> tokens;
  std::int64_t top_k = 0;

  void add(const std::vector<MoeStats>& stats, const MoeArgs& m) {
    std::vector<Tensor> c, p;
    std::vector<std::int64_t> t;
    for (const auto& s : stats) {
      if (!s.tokens_per_expert.defined() || s.tokens == 0) continue;
      c.push_back(s.tokens_per_expert);
      p.push_back(s.confidence_sum);
      t.push_back(s.tokens);
    }
    if (c.empty()) return;
    counts.push_back(torch::stack(c));
    confidence_sums.push_back(torch::stack(p));
    tokens.push_back(std::move(t));
    top_k = m.top_k;
  }

  template <class Sharding>
  void finish(StepMetrics& met, Sharding* sharding, torch::Device device) {
    if (counts.empty()) return;
    const Tensor all_counts = torch::stack(counts).to(torch::kCPU).to(torch::kFloat64);  // [M, blocks, E]
    const Tensor all_sums = torch::stack(confidence_sums).to(torch::kCPU).to(torch::kFloat64);
    const std::int64_t E = all_counts.size(2);
    std::vector<double> max_vio, confidence;  // this rank's, one per micro-batch
    for (std::int64_t mb = 0; mb < all_counts.size(0); ++mb) {
      double vio = 0, conf = 0;
      const std::int64_t blocks = all_counts.size(1);
      for (std::int64_t b = 0; b < blocks; ++b) {
        const Tensor sorted = std::get<0>(all_counts[mb][b].sort(0, /*descending=*/true));
        const Tensor rest = E > top_k ? sorted.narrow(0, top_k, E - top_k) : sorted;
        const double mean = rest.mean().item<double>();
        // No slot beyond the top_k most loaded (a micro-batch of one token): 0 / 0, NaN as
        // in prime-rl (written as null), not 0, which would say "balanced".
        vio +=
            mean > 0 ? (rest.max().item<double>() - mean) / mean : std::numeric_limits<double>::quiet_NaN();
        conf += all_sums[mb][b].item<double>() / static_cast<double>(tokens[mb][b]);
      }
      max_vio.push_back(vio / static_cast<double>(blocks));
      confidence.push_back(conf / static_cast<double>(blocks));
    }
    const Tensor per_expert = all_counts.sum(at::IntArrayRef{0, 1});
    const auto M = static_cast<std::int64_t>(max_vio.size());
    const int world = sharding ? sharding->world() : 1, rank = sharding ? sharding->rank() : 0;
    const auto f64 = torch::TensorOptions(torch::kFloat64);
    Tensor vio = torch::zeros({world, M}, f64);
    vio[rank] = torch::tensor(max_vio, f64);
    Tensor conf = torch::tensor(confidence, f64), experts = per_expert;
    if (sharding && world > 1) {
      for (auto [t, what] :
           {std::pair{&vio, "each rank's max_vio"}, std::pair{&conf, "the routing confidence"},
            std::pair{&experts, "the tokens per expert"}}) {
        Tensor d = t->to(device);
        sharding->sum(d, what);
        *t = d.cpu();
      }
    }
    met.moe_max_vio = std::get<0>(vio.max(0)).mean().item<double>();
    met.moe_routing_confidence = (conf / world).mean().item<double>();
    met.moe_tokens_per_expert.assign(experts.data_ptr<double>(),
                                     experts.data_ptr<double>() + experts.numel());
  }
};

struct Setup {
  torch::Device device = torch::kCPU;
  torch::ScalarType dtype = torch::kFloat32;
};

// One run: setup() (the run's folder, the model, the data, the offload pipeline, a
// resumed position), then train_step() until the last step, then finish(). The offload
// strategy decides nothing here: its pipeline (offload/pipeline.hpp) is called at fixed
// points of the step.
template <offload_strategy Strategy>
class Trainer {
 public:
  Trainer(const SFTConfig& cfg, const RunOptions& opts, const Setup& setup)
      : cfg_(cfg), opts_(opts), setup_(setup) {}

  RunResult run() {
    try {
      return run_steps();
    } catch (const std::exception& e) {
      if (pg_) pg_->note_failure(e.what());  // the other ranks name this one
      throw;
    }
  }

 private:
  RunResult run_steps() {
    // Before the model's allocations; each rank its own file (the launcher's rank).
    MemoryRecorder memory(opts_.profile.memory, setup_.device, opts_.launch.launched ? opts_.launch.rank : 0);
    setup();
    if (opts_.dump_logits) {
      write_logits(*model_, loader_->next().micro.front(), *opts_.dump_logits);
      return {};
    }
    RunResult result;
    result.first_step = pos_.step;
    StepProfiler profiler(max_steps_, opts_.profile);
    while (pos_.step < max_steps_ && !(loader_->epoch_done() && !endless_ && !cfg_.max_steps)) {
      profiler.before_step(pos_.step + 1);
      const StepMetrics met = train_step();
      result.losses.push_back(met.loss);
      profiler.after_step(pos_.step);
      if (reporter_) reporter_->log(met);
      // A NaN or infinite loss or gradient norm has reached (or will reach) the weights:
      // stop before a checkpoint of this step could be written.
      if (!std::isfinite(met.loss) || !std::isfinite(met.grad_norm))
        throw run_error(fmt::format(
            "step {}: the loss is {} and the gradient norm {}; stopping (no checkpoint of this step is "
            "written; resume from the last one with a lower optim.lr or with optim.max_norm)",
            pos_.step, met.loss, met.grad_norm));
      if (cfg_.ckpt && checkpoint_due()) save();
    }
    if (cfg_.ckpt && !checkpoint_due() && pos_.step > result.first_step) save();
    memory.write();
    return finish(std::move(result));
  }

  // --- setup ------------------------------------------------------------------

  void setup() {
    if (opts_.launch.launched) connect();
    claim_output_dir();  // before anything is loaded: a mistake costs seconds, not a model load
    load_model();
    load_data();
    if (!opts_.dump_logits) start();
  }

  // A sharded run: the other ranks, and the same config on every one of them.
  void connect() {
    if (opts_.dump_logits) throw run_error("--dump-logits runs in one process; launch it without torchrun");
    if (OptSettings::from(cfg_.optim).kind == OptKind::muon)
      throw run_error(fmt::format(
          "optim.type = \"muon\" with {} ranks: Muon orthogonalizes whole matrices, and each rank holds a "
          "piece of every parameter; use adamw, sgd or sign_sgd, or run one process",
          opts_.launch.world));
    // The config check has refused what the mesh cannot be (support.cpp). ep = "auto"
    // depends on whether the model has routed experts; a model that does not resolve
    // fails in load_model, with its own message.
    std::optional<long long> moe_experts;  // unknown where the model does not resolve
    try {
      const auto moe = resolve_model(cfg_.model.name).args.moe;
      moe_experts = moe ? moe->experts : 0;
    } catch (const model_config_error&) {
    }
    MeshDims mesh;
    try {
      mesh = resolve_mesh(MeshRequest::of(cfg_.model, opts_.launch.world, moe_experts));
    } catch (const mesh_error& e) {
      throw run_error(e.what());
    }
    pg_ = std::make_unique<ProcessGroup>(opts_.launch, mesh, setup_.device,
                                         std::chrono::seconds(cfg_.dist_timeout_seconds),
                                         opts_.dist.backend == DistBackend::gloo);
    std::uint64_t h = 1469598103934665603ull;  // FNV-1a of what the run was started with
    for (const std::string* s : {&opts_.resolved_config, &opts_.resolved_options})
      for (unsigned char c : *s) h = (h ^ c) * 1099511628211ull;
    pg_->check_same("the config (the resolved [config] and primecfg-train's options)", h);
    // One rank writes the traces (they would all go to the same paths).
    // (The GPU allocations are each rank's own: MemoryRecorder names each rank's file.)
    if (pg_->rank() != 0) opts_.profile = ProfileOptions{};
  }
  // The run's folder: one writer, never two runs mixed; a resume names a complete
  // checkpoint, and later ones are set aside.
  void claim_output_dir() {
    ckpt_ = cfg_.ckpt.value_or(CheckpointConfig{});
    ckpt_root_ = ckpt_.output_dir.value_or(cfg_.output_dir / "checkpoints");
    if (opts_.dump_logits) return;
    if (!pg_) return claim_output_dir_here();
    // One rank owns the folder; every rank resumes from the step it chose.
    const std::string step = pg_->on_rank0("claiming the output folder", [&] {
      claim_output_dir_here();
      return resume_step_ ? std::to_string(*resume_step_) : std::string();
    });
    if (!step.empty()) resume_step_ = std::stoll(step);
  }

  void claim_output_dir_here() {
    try {
      lock_.emplace(cfg_.output_dir);
      remove_stale_temporaries(ckpt_root_);
      const Launch& launch = opts_.launch;
      const int restart = pg_ ? pg_->restart() : launch.attempt;
      if (restart > 0 && written_by_job(cfg_.output_dir, launch.job_id)) return continue_job(restart);
      try {
        claim_for_config();
      } catch (const std::exception& e) {
        if (restart == 0) throw;
        throw run_error(fmt::format(
            "{} (torchrun restart {}: {})", e.what(), restart,
            launch.job_id.empty()
                ? "the job has no id, so its own folder cannot be told from another run's; start torchrun "
                  "with --rdzv-id=<an id of the job> to have restarts continue it"
                : fmt::format(
                      "the folder was not claimed by this job ({}), so the restart does not take it over",
                      launch.job_id)));
      }
      // Only once the folder passed the checks: a restart must not take over a folder
      // that its first attempt was refused.
      if (!launch.job_id.empty()) record_job(cfg_.output_dir, launch.job_id);
    } catch (const checkpoint_error& e) {
      throw run_error(e.what());
    }
  }

  // A new run, or the [resume] the config asks for.
  void claim_for_config() {
    if (!cfg_.resume) {
      prepare_fresh_run(cfg_.output_dir, ckpt_root_, cfg_.clean);
      return;
    }
    const auto steps = complete_checkpoints(ckpt_root_);
    resume_step_ = cfg_.resume->step;
    if (!resume_step_) {
      if (steps.empty()) throw run_error(fmt::format("resume: no checkpoint in {}", ckpt_root_.string()));
      resume_step_ = steps.back();
    }
    // Checked before anything moves: a mistyped step must not set later checkpoints aside.
    if (std::find(steps.begin(), steps.end(), *resume_step_) == steps.end())
      throw run_error(
          fmt::format("resume: {} is not a complete checkpoint (complete ones: {})",
                      step_dir(ckpt_root_, *resume_step_).string(),
                      steps.empty() ? std::string("none") : fmt::format("{}", fmt::join(steps, ", "))));
    if (const std::string note = prepare_resume(cfg_.output_dir, ckpt_root_, *resume_step_);
        !note.empty() && opts_.print)
      std::fprintf(stderr, "primecfg-train: note: %s\n", note.c_str());
  }

  // torchrun restarted this job (--max-restarts) after a rank failed: the folder is the
  // job's own, so the job goes on from its latest complete checkpoint, whatever [resume]
  // says (that was where the first attempt started), or from the start when it has none.
  // Either way the later metrics lines move aside, as for any resume.
  void continue_job(int restart) {
    const auto steps = complete_checkpoints(ckpt_root_);
    const std::int64_t from = steps.empty() ? 0 : steps.back();
    if (from > 0) resume_step_ = from;
    const std::string moved = prepare_resume(cfg_.output_dir, ckpt_root_, from);
    if (opts_.print)
      std::fprintf(stderr, "primecfg-train: note: torchrun restart %d of job %s: %s%s%s\n", restart,
                   opts_.launch.job_id.c_str(),
                   from > 0
                       ? fmt::format("continuing from step {}, its latest complete checkpoint", from).c_str()
                       : "no complete checkpoint yet, starting over",
                   moved.empty() ? "" : "; ", moved.c_str());
  }

  // A preset or a local HF directory (its config.json and weights); nothing is downloaded.
  void load_model() {
    const auto& name = cfg_.model.name;
    ResolvedModel model;
    try {
      model = resolve_model(name, cfg_.model.debug ? cfg_.model.debug->num_layers : std::nullopt);
    } catch (const model_config_error& e) {
      throw run_error(fmt::format("model.name: {}", e.what()));
    }
    source_dir_ = model.hf_dir;
    const std::int64_t seed = std::visit(
        [](const auto& d) -> std::int64_t {
          if constexpr (requires { d.seed; }) return d.seed;
          return 0;
        },
        cfg_.data);
    torch::manual_seed(static_cast<std::uint64_t>(seed));
    const bool from_hf = model.hf_dir && !(cfg_.model.debug && cfg_.model.debug->random_init);
    const MoeSettings moe = moe_settings(model.args);
    if (!pg_) {
      model_ = std::make_unique<Transformer>(model.args, setup_.device, setup_.dtype,
                                             static_cast<std::uint64_t>(seed));
      model_->set_moe_settings(moe);
      quantize_linears();
      if (from_hf) model_->load_hf_weights(*model.hf_dir);
      freeze_routers();
      return;
    }
    // Sharded: each parameter is built (and loaded) whole, its piece kept, the whole
    // freed before the next, so no rank holds the whole model at any time.
    const auto reduce = cfg_.model.reduce_dtype == Dtype::bfloat16 ? torch::kBFloat16 : torch::kFloat32;
    sharding_ = std::make_unique<Sharding>(
        *pg_, model.args,
        ShardingOptions{torch::TensorOptions().dtype(setup_.dtype).device(setup_.device), reduce,
                        opts_.dist.bucket_mib, cfg_.model.reshard_after_forward,
                        cfg_.model.moe_use_grouped_mm});
    std::optional<HfWeights> hf;
    if (from_hf) hf.emplace(*model.hf_dir, model.args);
    model_ =
        std::make_unique<Transformer>(model.args, setup_.device, setup_.dtype,
                                      static_cast<std::uint64_t>(seed), [&](std::size_t i, NamedParam& p) {
                                        if (hf) hf->load(p);
                                        sharding_->adopt(i, p);
                                      });
    quantize_linears();
    if (pg_->mesh().ep > 1) {
      // Expert parallelism: each block hands its tokens' rows to the ranks running their
      // experts (nn/moe.hpp), over the expert-parallel group of the mesh.
      experts_exchange_ = std::make_unique<GroupExchange>(*pg_, MeshDim::ep, "the experts' token exchange");
      MoeSettings parallel = moe;
      parallel.exchange = experts_exchange_.get();
      model_->set_moe_settings(parallel);
    } else {
      model_->set_moe_settings(moe);
    }
    if (hf) hf->finish();
    sharding_->attach(*model_);
    freeze_routers();
  }

  // model.quantization = {type = "fp8"}: the linears prime-rl would quantise run in FP8
  // (Transformer::use_fp8), on a GPU that has the FP8 GEMM, or it is an error that says why.
  void quantize_linears() {
    const auto& q = cfg_.model.quantization;
    if (!q) return;
    if (const auto why = fp8::unavailable_on(setup_.device)) throw run_error("model.quantization: " + *why);
    std::vector<Transformer::LinearPrecision> chosen;
    try {
      chosen = model_->use_fp8(q->ignore_patterns);
    } catch (const std::invalid_argument& e) {
      throw run_error(fmt::format("model.quantization.ignore_patterns: {}", e.what()));
    }
    if (!opts_.print || (pg_ && pg_->rank() != 0)) return;
    std::size_t fp8 = 0;
    std::string kept;
    for (const auto& c : chosen) {
      if (!c.bf16_because) {
        ++fp8;
      } else if (kept.size() < 400) {
        kept += fmt::format("{}{} ({})", kept.empty() ? "" : "; ", c.module, *c.bf16_because);
      }
    }
    const char* experts = !model_->args().moe      ? ""
                          : q->enable_grouped_gemm ? "; routed experts in FP8, one expert at a time"
                                                   : "; routed experts in bf16 (enable_grouped_gemm = false)";
    std::fprintf(stderr, "primecfg-train: model.quantization: %zu of %zu linears in FP8; in bf16: %s%s\n",
                 fp8, chosen.size(), kept.empty() ? "none" : kept.c_str(), experts);
  }

  // model.freeze_moe_router (prime-rl's freeze_moe_router): every router keeps the weights
  // it was loaded with, in every mode and sharded or not (NamedParam::frozen).
  void freeze_routers() {
    if (!cfg_.model.freeze_moe_router) return;
    const Architecture& arch = model_->args().architecture();
    int routers = 0;
    for (NamedParam& p : model_->params())
      if (arch.is_router(p.name)) p.frozen = true, ++routers;
    // (The config check says so first; run_sft is also called without it.)
    if (routers == 0)
      throw run_error(
          fmt::format("model.freeze_moe_router: {} has no router (model_type {}), so this would "
                      "do nothing",
                      cfg_.model.name, model_->args().model_type));
  }

  // How routed experts run: model.moe_use_grouped_mm, model.moe_router_dtype,
  // model.debug.force_balanced_routing. On a model without routed experts the last two
  // would do nothing, so they are errors that name the field (the first, a kernel
  // choice, is a note of the config check's).
  MoeSettings moe_settings(const ModelArgs& args) const {
    const auto& m = cfg_.model;
    const bool balanced = m.debug && m.debug->force_balanced_routing;
    if (!args.moe) {
      // (The config check says so first; run_sft is also called without it.)
      const char* field = m.moe_router_dtype != Dtype::float32 ? "model.moe_router_dtype"
                          : balanced                           ? "model.debug.force_balanced_routing"
                                                               : nullptr;
      if (field)
        throw run_error(
            fmt::format("{}: {} has no routed experts (model_type {}), so this setting would do nothing",
                        field, m.name, args.model_type));
      return {};
    }
    MoeSettings s;
    s.top_k = args.moe->top_k;
    s.norm_topk_prob = args.moe->norm_topk_prob;
    s.router_dtype = m.moe_router_dtype == Dtype::bfloat16 ? torch::kBFloat16 : torch::kFloat32;
    s.grouped = m.moe_use_grouped_mm;
    s.force_balanced = balanced;
    // prime-rl's routed experts are parameters, not linears: enable_grouped_gemm quantises
    // their matmuls, which needs every dimension a multiple of 128 (the config check says
    // so first; run_sft is also called without it).
    if (m.quantization && m.quantization->enable_grouped_gemm) {
      if (const auto why = fp8::experts_stay_bf16(args.hidden, args.moe->intermediate))
        throw run_error(
            fmt::format("model.quantization.enable_grouped_gemm: true, and {}'s routed experts {}; "
                        "set it to false to keep them in bf16",
                        m.name, *why));
      s.fp8 = true;
    }
    return s;
  }

  void load_data() {
    loader_.emplace(data::make_loader(cfg_.data, model_->args().vocab_size));
    if (const std::string note = loader_->source_report(); !note.empty() && opts_.print)
      std::fprintf(stderr, "primecfg-train: note: %s\n", note.c_str());
  }

  // The optimizer and its FP32 state in the strategy's pipeline, a resumed position,
  // the step budget, and the run's reporting.
  void start() {
    const ModelArgs& args = model_->args();
    opt_ = OptSettings::from(cfg_.optim);
    if (sharding_) {
      const auto& lo = loader_->options();
      const std::int64_t micro = lo.batch_size / lo.micro_batch_size;
      if (micro % sharding_->world() != 0)
        throw run_error(fmt::format(
            "data.batch_size = {} with data.micro_batch_size = {} makes {} micro-batches per step, which {} "
            "ranks cannot share evenly; make batch_size a multiple of micro_batch_size x {}",
            lo.batch_size, lo.micro_batch_size, micro, sharding_->world(), sharding_->world()));
    }
    state_ = std::make_unique<Pipeline<Strategy>>(*model_, opt_, opts_, sharding_.get());
    // Selective mode is the routed experts' recompute, on a model that has them (the config
    // check says so first; run_sft is also called without it).
    recompute_ = !cfg_.model.ac                             ? Recompute::nothing
                 : cfg_.model.ac->mode == AcMode::selective ? Recompute::routed_experts
                                                            : Recompute::blocks;
    if (recompute_ == Recompute::routed_experts &&
        (!args.moe || cfg_.model.ac->targets != std::vector<std::string>{"routed_experts"}))
      throw run_error(
          fmt::format("model.ac.targets: selective checkpointing recomputes \"routed_experts\" "
                      "alone, on a model with routed experts ({} has {})",
                      cfg_.model.name, args.moe ? "them" : "none"));
    ac_freq_ = cfg_.model.ac ? cfg_.model.ac->freq : 1;
    if (const auto& off = cfg_.model.ac_offloading)  // support.cpp: only with ac, freq 1
      act_offload_ = std::make_unique<ActivationOffload>(
          setup_.device, args.layers,
          ActivationOffload::Settings{off->pin_memory, off->max_inflight_activations});
    const std::int64_t seq_len = loader_->options().seq_len;
    ce_chunk_ = ce_chunk_tokens(cfg_.model.fused_lm_head_token_chunk_size, args.vocab_size,
                                loader_->options().micro_batch_size * seq_len);
    if (resume_step_) {
      pos_ = load_checkpoint(step_dir(ckpt_root_, *resume_step_), *resume_step_, *model_, *state_, opt_,
                             ckpt_, sharding_.get());
      loader_->set_position(pos_.data_position);
    }
    endless_ = std::holds_alternative<FakeDataConfig>(cfg_.data) ||
               (std::get<SFTDataConfig>(cfg_.data).path == std::nullopt && !cfg_.max_steps);
    if (!cfg_.max_steps && std::holds_alternative<FakeDataConfig>(cfg_.data))
      throw run_error("max_steps: fake data is endless; set max_steps");
    max_steps_ = cfg_.max_steps.value_or(endless_ ? 1000 : std::numeric_limits<std::int64_t>::max());

    fs::create_directories(cfg_.output_dir);
    if (!pg_ || pg_->rank() == 0) {  // one writer of the folder's files
      if (!opts_.resolved_config.empty()) write_file(cfg_.output_dir / "config.toml", opts_.resolved_config);
      if (!opts_.resolved_options.empty())
        write_file(cfg_.output_dir / "options.toml", opts_.resolved_options);
      reporter_ = std::make_unique<Reporter>(cfg_.output_dir, opts_.print, Strategy::name);
    }
    flops_per_token_ = args.flops_per_token(seq_len);
    peak_ = peak_flops(setup_.device, opts_.peak_tflops);
    if (opts_.print && pg_)
      std::fprintf(
          stderr,
          "primecfg-train: %d rank%s (%s), FP32 state sharded over them, %lld of %lld micro-batches each\n",
          pg_->world(), pg_->world() == 1 ? "" : "s", std::string(pg_->backend_name()).c_str(),
          static_cast<long long>(loader_->options().batch_size / loader_->options().micro_batch_size /
                                 pg_->world()),
          static_cast<long long>(loader_->options().batch_size / loader_->options().micro_batch_size));
    if (opts_.print)
      std::fprintf(stderr,
                   "primecfg-train: %s, %.2fM params, offload = %.*s, optim = %.*s, %s %s, seq_len %lld\n",
                   cfg_.model.name.c_str(), static_cast<double>(args.total_params()) / 1e6,
                   static_cast<int>(Strategy::name.size()), Strategy::name.data(),
                   static_cast<int>(opt_.name().size()), opt_.name().data(), setup_.device.str().c_str(),
                   setup_.dtype == torch::kBFloat16 ? "bf16" : "fp32", static_cast<long long>(seq_len));
    decide_graph();
  }

  // --- one optimizer step ---------------------------------------------------------

  StepMetrics train_step() {
    Pipeline<Strategy>& state = *state_;
    Transformer& model = *model_;
    const auto t0 = std::chrono::steady_clock::now();
    data::Batch batch = loader_->next();
    // Every rank reads the whole batch: the ids of each rank's last micro-batch are
    // known here without a collective (the tied embedding's split needs their union).
    std::vector<std::int64_t> every_ranks_ids;
    if (sharding_) {
      every_ranks_ids = last_ids_of_every_rank(batch);
      keep_this_ranks_part(batch);
    }
    if (pg_) pg_->note_step(pos_.step + 1);
    const double lr = scheduled_lr(cfg_.scheduler, opt_.lr, pos_.scheduler_step, max_steps_);
    state.begin_step(lr, pos_.step + 1, batch.micro.size() == 1);
    const double scale = 1.0 / static_cast<double>(std::max<std::int64_t>(1, batch.loss_tokens));
    // prime-rl's backward carries the loss summed over tokens, over the micro-batches; FP8's
    // scale floor is meant for gradients of that size (nn/fp8.hpp).
    if (cfg_.model.quantization)
      fp8::set_output_grad_ratio(1.0 / (scale * static_cast<double>(batch.micro.size())));
    // Summed on the device, read once per step: the host runs ahead of the GPU
    // across micro-batches.
    Tensor loss_acc = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(setup_.device));
    // The pipeline's hook (FullOffload: wait for last step's updates) and the
    // parallelism's (gather a sharded block's weights) around each block's forward.
    const Transformer::BlockHooks block_hooks = {state.block_hook(),
                                                 sharding_ ? sharding_->block_hook() : nullptr};
    bool replayed = false;  // the step's forward and backward came from its CUDA graph
    RoutingFigures routing;
    for (std::size_t m = 0; m < batch.micro.size(); ++m) {
      const data::MicroBatch& mb = batch.micro[m];
      const bool last = m + 1 == batch.micro.size();
      // The inputs go up by a kernel on the compute stream (base/mapped_copies.hpp), never
      // behind the offload pipeline's copies.
      const auto [in, targets] = inputs(mb);
      if (last) state.begin_last_micro_batch(mb.input_ids, sharding_ ? every_ranks_ids : mb.input_ids);
      auto forward_backward = [&](const Transformer::Inputs& x, const Tensor& t) {
        Tensor loss = model.loss(model.hidden(x, recompute_, ac_freq_, block_hooks, act_offload_.get()), t,
                                 scale, ce_chunk_, state.loss_hooks(last), state.loss_chunks(t.numel()));
        if (last) state.before_backward();
        if (last && sharding_) sharding_->note_forward_end();
        loss.backward();
        return loss;
      };
      replayed = use_graph(mb, batch.micro.size(), scale);
      Tensor loss =
          replayed ? from_graph(in, targets, scale, forward_backward) : forward_backward(in, targets);
      replayed = replayed && !graph_failed_;  // a capture that failed ran the micro-batch eagerly
      if (sharding_) sharding_->flush();
      loss_acc += loss.detach().to(torch::kFloat64);
      if (model.args().moe) routing.add(model.take_moe_stats(), *model.args().moe);
    }
    if (!replayed) ++eager_steps_;
    const double grad_norm = state.finish_step();
    if (sharding_) {
      sharding_->gather_weights();
      sharding_->sum(loss_acc, "the sum of the step's loss");
    }
    const double loss_sum = loss_acc.item<double>();
    state.end_step();
    ++pos_.step;
    ++pos_.scheduler_step;
    pos_.data_position = loader_->position();
    // The step ends when the compute stream is done (for OptimizerOffload the
    // last moment write-backs may still run beside the next forward).
    dev::synchronize(dev::current_stream(setup_.device));
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    StepMetrics met;
    met.step = pos_.step;
    met.max_steps = max_steps_;
    met.loss = loss_sum;
    met.lr = lr;
    met.grad_norm = grad_norm;
    met.step_time = dt;
    met.tokens = batch.tokens;
    met.tokens_per_s = static_cast<double>(batch.tokens) / dt;
    // Per GPU: each rank computes its share of the tokens.
    if (peak_) met.mfu = met.tokens_per_s / (sharding_ ? sharding_->world() : 1) * flops_per_token_ / *peak_;
    met.peak_device = peak_device_bytes(setup_.device);
    if (sharding_ && sharding_->world() > 1) {
      // Every rank's peak in rank 0's line: ranks differ (rank 0 writes the files, pieces
      // round up), and ranks sharing one GPU each measure their own.
      auto peaks =
          torch::zeros({sharding_->world()}, torch::TensorOptions(torch::kFloat64).device(setup_.device));
      peaks[sharding_->rank()] = met.peak_device;
      sharding_->sum(peaks, "each rank's peak memory");
      const auto host = peaks.cpu();
      met.peak_device_ranks.assign(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
    }
    if (model.args().moe) routing.finish(met, sharding_.get(), setup_.device);
    met.host_rss = rss_bytes("VmRSS:");
    met.peak_host = rss_bytes("VmHWM:");
    met.host_state = state.host_bytes();
    met.pipeline = state.pipeline_stats();
    if (graph_on_) met.pipeline["cuda_graph_replayed"] = replayed ? 1 : 0;
    if (act_offload_) {
      // Per step; the host peak is one forward pass's (a micro-batch's) block inputs.
      const ActivationOffload::Stats& a = act_offload_->stats();
      met.pipeline["ac_offload_to_host_gib"] =
          static_cast<double>(a.bytes_to_host - act_seen_.bytes_to_host) / GiB;
      met.pipeline["ac_offload_to_device_gib"] =
          static_cast<double>(a.bytes_to_device - act_seen_.bytes_to_device) / GiB;
      met.pipeline["ac_offload_wait_s"] = a.wait_s - act_seen_.wait_s;
      met.pipeline["ac_offload_host_gib"] = static_cast<double>(a.host_bytes) / GiB;
      act_seen_ = a;
    }
    if (sharding_)
      for (auto& [name, value] : sharding_->take_metrics()) met.pipeline[name] = value;
    return met;
  }

  // A sharded run: this rank's consecutive share of the step's micro-batches. The loss
  // stays scaled by the whole batch's loss tokens, so the sum over the ranks is the
  // one-process gradient. (Packing is sequential, so every rank packs the whole batch.)
  std::vector<std::int64_t> last_ids_of_every_rank(const data::Batch& batch) const {
    const auto per_rank = batch.micro.size() / static_cast<std::size_t>(sharding_->world());
    std::vector<std::int64_t> ids;
    for (int r = 0; r < sharding_->world(); ++r) {
      const auto& last = batch.micro[per_rank * static_cast<std::size_t>(r + 1) - 1].input_ids;
      ids.insert(ids.end(), last.begin(), last.end());
    }
    return ids;
  }

  void keep_this_ranks_part(data::Batch& batch) {
    const auto per_rank = batch.micro.size() / static_cast<std::size_t>(sharding_->world());
    const auto first = per_rank * static_cast<std::size_t>(sharding_->rank());
    std::vector<data::MicroBatch> mine(
        std::make_move_iterator(batch.micro.begin() + static_cast<std::ptrdiff_t>(first)),
        std::make_move_iterator(batch.micro.begin() + static_cast<std::ptrdiff_t>(first + per_rank)));
    batch.micro = std::move(mine);
  }

  // --- the forward and backward as one CUDA graph (opts_.cuda_graph) ------------------

  // Eager steps before the capture: the first ones make what is made once (the
  // pipeline's state and tables, cuBLAS's workspaces), which a capture may not.
  static constexpr std::int64_t kGraphWarmup = 2;

  // Why this run's forward and backward cannot be one graph ("" where they can).
  std::string graph_refusal() const {
    if (!dev::DeviceGraph::supported(setup_.device)) return "it needs a CUDA device";
    if (sharding_) return "a sharded run's collectives are driven by the host";
    if (act_offload_) return "activation offloading waits for its copies on the host";
    if (!state_->replayable())
      return fmt::format(
          "offload = \"{}\" runs host work in its gradient hooks (only \"none\" handing autograd's gradients "
          "to the fused AdamW replays: bf16, AdamW)",
          Strategy::name);
    return "";
  }

  void decide_graph() {
    if (!opts_.cuda_graph.value_or(true)) return;
    const std::string why = graph_refusal();
    if (why.empty()) {
      graph_on_ = true;
    } else if (opts_.cuda_graph) {
      throw run_error("cuda_graph = true: the forward and backward cannot be one CUDA graph here: " + why);
    } else if (opts_.print && setup_.device.is_cuda()) {
      std::fprintf(stderr, "primecfg-train: note: cuda_graph: eager: %s\n", why.c_str());
    }
  }

  // Whether this micro-batch's forward and backward replay the graph (captured first, at
  // the step after the warm-up).
  bool use_graph(const data::MicroBatch& mb, std::size_t micro_batches, double loss_scale) {
    if (!graph_on_ || graph_failed_) return false;
    std::string why;
    if (model_->args().moe)
      why = "routed experts (the tokens each expert gets are read back to size its groups)";
    else if (micro_batches != 1)
      why = fmt::format("{} micro-batches a step (the gradients are summed across them)", micro_batches);
    else if (!mb.one_doc_per_row)
      why = "a document mask (packed rows)";
    else if (graph_ &&
             (graph_->in.input_ids.size(0) != mb.rows || graph_->in.input_ids.size(1) != mb.seq_len))
      why = "a micro-batch of another shape than the captured one";
    else if (graph_ && graph_->loss_scale != loss_scale)
      // The loss's 1 / (loss tokens) is a constant of the captured kernels: a replay would
      // scale this step's loss and gradients by the captured step's count.
      why = fmt::format("{} loss tokens where the captured step had {} (its 1 / tokens is in the graph)",
                        mb.loss_tokens, std::llround(1.0 / graph_->loss_scale));
    if (why.empty()) return graph_ || eager_steps_ >= kGraphWarmup;
    if (opts_.cuda_graph)
      throw run_error(fmt::format("cuda_graph = true: step {} has {}, which a CUDA graph does not replay",
                                  pos_.step + 1, why));
    if (!graph_refused_ && opts_.print)
      std::fprintf(stderr, "primecfg-train: note: cuda_graph: eager: %s\n", why.c_str());
    graph_refused_ = true;
    return false;
  }

  // The forward and backward replayed from the graph: the inputs copied into the tensors
  // the capture read, the loss read from the one it wrote. The first call captures.
  template <class ForwardBackward>
  Tensor from_graph(const Transformer::Inputs& in, const Tensor& targets, double loss_scale,
                    ForwardBackward& forward_backward) {
    if (!graph_) {
      StepGraph& g = graph_.emplace();
      g.loss_scale = loss_scale;
      g.in = {in.input_ids.clone(), in.positions.clone(), std::nullopt};
      g.targets = targets.clone();
      try {
        g.graph.capture(setup_.device, [&] { g.loss = forward_backward(g.in, g.targets); });
      } catch (const std::exception& e) {
        // What the capture's hooks kept goes first: it lives in the graph's pool.
        state_->capture_failed();
        graph_.reset();
        // A graph the run was not asked for, out of memory: the capture holds its pool's
        // freed blocks apart from the rest (docs/trainer.md, "CUDA graph"), so a step that
        // fits eagerly may not fit as a capture. Eager from here, said once.
        if (!opts_.cuda_graph && dev::DeviceGraph::out_of_memory(e)) {
          dev::DeviceGraph::release_cached(setup_.device);
          graph_failed_ = true;
          if (opts_.print)
            std::fprintf(
                stderr,
                "primecfg-train: note: cuda_graph: eager: step %lld's capture ran out of GPU memory, "
                "which its eager steps did not (--no-cuda-graph says so from the start)\n",
                static_cast<long long>(pos_.step + 1));
          return forward_backward(in, targets);
        }
        throw run_error(fmt::format(
            "step {}: capturing the forward and backward as a CUDA graph failed ({}); --no-cuda-graph runs "
            "them eagerly",
            pos_.step + 1, e.what()));
      }
      state_->captured();
      if (opts_.print)
        std::fprintf(stderr,
                     "primecfg-train: the forward and backward replay one CUDA graph from step %lld\n",
                     static_cast<long long>(pos_.step + 1));
    } else {
      graph_->in.input_ids.copy_(in.input_ids);
      graph_->in.positions.copy_(in.positions);
      graph_->targets.copy_(targets);
      state_->before_backward();
    }
    graph_->graph.replay();
    state_->replayed();
    return graph_->loss;
  }

  // A micro-batch's token ids, positions and (for packed rows) document mask, and its
  // targets, on the device.
  std::pair<Transformer::Inputs, Tensor> inputs(const data::MicroBatch& mb) const {
    const std::array<std::int64_t, 2> shape{mb.rows, mb.seq_len};
    Transformer::Inputs in{dev::upload_ints(mb.input_ids, shape, setup_.device),
                           dev::upload_ints(mb.positions, shape, setup_.device), std::nullopt};
    if (!mb.one_doc_per_row) {
      Tensor doc = dev::upload_ints(mb.doc_ids, shape, setup_.device);
      Tensor same = doc.unsqueeze(2).eq(doc.unsqueeze(1));
      in.mask = same.logical_and(torch::ones({mb.seq_len, mb.seq_len}, same.options()).tril()).unsqueeze(1);
    }
    const std::array<std::int64_t, 1> flat{static_cast<std::int64_t>(mb.targets.size())};
    return {std::move(in), dev::upload_ints(mb.targets, flat, setup_.device)};
  }

  // --- checkpoints and the end --------------------------------------------------

  bool checkpoint_due() const { return ckpt_.interval && pos_.step % *ckpt_.interval == 0; }
  void save() {
    save_checkpoint(ckpt_root_, *model_, *state_, opt_, pos_, ckpt_, source_dir_, sharding_.get(),
                    static_cast<std::uint64_t>(opts_.save.max_shard_bytes));
  }

  RunResult finish(RunResult result) {
    result.last_step = pos_.step;
    state_->sync_host();  // the last step's deferred updates
    if (opts_.collect_weights && sharding_ && sharding_->world() > 1)
      throw run_error("collect_weights: the masters are sharded over the ranks");
    // The whole weights, for what reads them below. The gather is a collective: every
    // rank takes part, whether or not it prints (only rank 0 does), so the condition
    // is the config's and the options', the same on every rank.
    if (sharding_ && (opts_.collect_weights || demo_data())) {
      sharding_->gather_all();
      // Every expert is here now: the demo (rank 0 alone) runs them without the others.
      if (experts_exchange_) model_->set_moe_settings(moe_settings(model_->args()));
    }
    if (opts_.collect_weights) {
      for (auto& s : state_->states()) {
        Tensor m = s.master.to(torch::kCPU).contiguous();
        result.weights.emplace_back(s.p->name,
                                    std::vector<float>(m.data_ptr<float>(), m.data_ptr<float>() + m.numel()));
        Tensor w = s.p->tensor.detach().to(torch::kCPU, torch::kFloat32).contiguous();
        result.model_weights.emplace_back(
            s.p->name, std::vector<float>(w.data_ptr<float>(), w.data_ptr<float>() + w.numel()));
      }
    }
    if (opts_.demo && demo_data() && (!pg_ || pg_->rank() == 0)) demo(*model_);
    return result;
  }

  // The reverse-text default, which the demo samples from.
  const SFTDataConfig* demo_data() const {
    const auto* d = std::get_if<SFTDataConfig>(&cfg_.data);
    return d && !d->path ? d : nullptr;
  }

  // A few held-out reversals, greedy-decoded.
  void demo(Transformer& model) {
    const SFTDataConfig* d = demo_data();
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
  // The run's folder and checkpoints.
  std::optional<OutputDirLock> lock_;
  CheckpointConfig ckpt_;
  fs::path ckpt_root_;
  std::optional<std::int64_t> resume_step_;
  std::optional<fs::path> source_dir_;  // the HF directory the model came from
  // What trains.
  std::unique_ptr<Transformer> model_;
  std::optional<data::Loader> loader_;
  OptSettings opt_;
  std::unique_ptr<ProcessGroup> pg_;  // a sharded run's ranks (none: one process)
  std::unique_ptr<Sharding> sharding_;
  std::unique_ptr<TokenExchange> experts_exchange_;  // expert parallelism (model.ep > 1)
  std::unique_ptr<Pipeline<Strategy>> state_;
  Recompute recompute_ = Recompute::nothing;
  std::int64_t ac_freq_ = 1, ce_chunk_ = 0;
  std::unique_ptr<ActivationOffload> act_offload_;  // model.ac_offloading
  // The forward and backward as one CUDA graph: the tensors its capture read and wrote.
  struct StepGraph {
    dev::DeviceGraph graph;
    Transformer::Inputs in;
    Tensor targets, loss;
    double loss_scale = 0;  // the captured step's 1 / (loss tokens)
  };
  bool graph_on_ = false;       // opts_.cuda_graph, where it applies
  bool graph_refused_ = false;  // a step it does not apply to was said
  bool graph_failed_ = false;   // its capture ran out of memory: eager since
  std::optional<StepGraph> graph_;
  std::int64_t eager_steps_ = 0;       // in this process
  ActivationOffload::Stats act_seen_;  // its counters at the last step's end
  // Where it stands.
  TrainPosition pos_;
  bool endless_ = false;
  std::int64_t max_steps_ = 0;
  std::unique_ptr<Reporter> reporter_;
  double flops_per_token_ = 0;
  std::optional<double> peak_;
  // FP8's gradient units are the process's (nn/fp8.hpp): prime-rl's again when this trainer goes.
  struct Fp8UnitsReset {
    ~Fp8UnitsReset() { fp8::set_output_grad_ratio(1.0); }
  } fp8_units_reset_;
};

}  // namespace

// ===========================================================================
// 2. Entry point
// ===========================================================================

RunResult run_sft(const SFTConfig& cfg, const RunOptions& opts) {
  Setup setup;
  std::string dev = opts.device.value_or(torch::cuda::is_available() ? "cuda" : "cpu");
  // One GPU per rank: LOCAL_RANK's (of those CUDA_VISIBLE_DEVICES leaves). Gloo's
  // collectives may also put every rank on one named GPU (NCCL refuses two ranks on
  // one device): per-rank memory measured where there is one GPU.
  if (opts.launch.several() && dev.rfind("cuda", 0) == 0) {
    if (dev != "cuda" && opts.dist.backend != DistBackend::gloo)
      throw run_error(
          fmt::format("device = \"{}\" with {} ranks: each rank uses cuda:LOCAL_RANK; set device = "
                      "\"cuda\" (CUDA_VISIBLE_DEVICES picks the GPUs), or dist.backend = \"gloo\" to put "
                      "every rank on {}",
                      dev, opts.launch.world, dev));
    if (dev == "cuda") dev = fmt::format("cuda:{}", opts.launch.local_rank);
  }
  try {
    setup.device = torch::Device(dev);
  } catch (const std::exception&) {
    throw run_error(fmt::format("unknown device \"{}\"", dev));
  }
  if (opts.dist.backend == DistBackend::nccl && !setup.device.is_cuda())
    throw run_error(
        fmt::format("dist.backend = \"nccl\" runs on CUDA devices only, and this run is on {}", dev));
  if (setup.device.is_cuda() && !torch::cuda::is_available())
    throw run_error("device cuda requested but this LibTorch has no usable CUDA device");
  if (setup.device.is_cuda() && setup.device.has_index() &&
      setup.device.index() >= static_cast<int>(torch::cuda::device_count()))
    throw run_error(fmt::format(
        "device {}: this process sees {} GPU(s){}", dev, torch::cuda::device_count(),
        opts.launch.several() ? " (each rank uses cuda:LOCAL_RANK: start at most that many ranks per node)"
                              : ""));
  if (opts.offload.cpu_isa) {
    const cpu::Isa isa = *opts.offload.cpu_isa == CpuIsa::avx512 ? cpu::Isa::avx512
                         : *opts.offload.cpu_isa == CpuIsa::avx2 ? cpu::Isa::avx2
                                                                 : cpu::Isa::scalar;
    if (!cpu::set_active_isa(isa))
      throw run_error(fmt::format("offload.cpu_isa = \"{}\": this CPU cannot run it (it has {})",
                                  cpu::to_string(isa), cpu::to_string(cpu::best_isa())));
  }
  // Process-wide switches of the fused CUDA kernels (bf16 GPU tensors only).
  fused::set_enabled(opts.kernels.fused);
  fused::set_norm_rope_enabled(opts.kernels.norm_rope);
  fused::set_cross_entropy_enabled(opts.kernels.cross_entropy);
  fused::set_fp8_cast_enabled(opts.kernels.fp8_cast);
  // bf16 where the hardware has it (GPUs); FP32 on CPUs, where bf16 matmuls are emulated.
  setup.dtype = opts.bf16.value_or(setup.device.is_cuda()) ? torch::kBFloat16 : torch::kFloat32;
  return primecfg::visit_offload(
      cfg.model.offload, [&]<class Strategy>(Strategy) { return Trainer<Strategy>(cfg, opts, setup).run(); });
}

}  // namespace primecfg::train
