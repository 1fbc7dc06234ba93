// The training loop and the three offload strategies.
//
// Read top to bottom:
//   1. Optimizer math on tensors (device path) and the per-parameter state.
//   2. OffloadState<Strategy>: where masters, gradients and moments live and when
//      the update runs. One template; `if constexpr` on the strategy's traits.
//   3. Checkpoints (safetensors, written to a temp dir and renamed).
//   4. Metrics (metrics.jsonl, progress bar or plain lines).
//   5. Trainer<Strategy>::run(): the loop.
//   6. run_sft(): device/dtype choice and the visit_offload dispatch.
#include "trainer.hpp"

#include "cpu_optim/cpu_optim.hpp"
#include "data.hpp"
#include "model.hpp"
#include "safetensors.hpp"

#include <primecfg/offload.hpp>

#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#if defined(PRIMECFG_WITH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/cuda.h>
#endif

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <numbers>

namespace primecfg::train {

using torch::Tensor;
namespace fs = std::filesystem;

namespace {

// ===========================================================================
// 1. Optimizer
// ===========================================================================

enum class OptKind { adamw, sign_sgd, sgd, muon };

// The optimizer settings in one flat struct (from the config's tagged union).
struct OptSettings {
  OptKind kind = OptKind::adamw;
  double lr = 0, weight_decay = 0;
  std::optional<double> max_norm;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double momentum = 0.9;
  bool nesterov = true;

  static OptSettings from(const OptimizerConfig& cfg) {
    OptSettings s;
    std::visit(
        [&](const auto& o) {
          using O = std::decay_t<decltype(o)>;
          s.lr = o.lr;
          s.weight_decay = o.weight_decay;
          s.max_norm = o.max_norm;
          if constexpr (std::is_same_v<O, AdamWConfig>) {
            s.kind = OptKind::adamw;
            s.beta1 = o.betas1;
            s.beta2 = o.betas2;
          } else if constexpr (std::is_same_v<O, SignSGDConfig>) {
            s.kind = OptKind::sign_sgd;
          } else if constexpr (std::is_same_v<O, SGDConfig>) {
            s.kind = OptKind::sgd;
            s.momentum = o.momentum;
            s.nesterov = o.nesterov;
          } else {
            s.kind = OptKind::muon;
            s.momentum = o.momentum;
            s.beta1 = o.betas1;
            s.beta2 = o.betas2;
          }
        },
        cfg);
    return s;
  }
  std::string_view name() const {
    constexpr std::string_view names[] = {"adamw", "sign_sgd", "sgd", "muon"};
    return names[static_cast<int>(kind)];
  }
};

// Muon orthogonalises the momentum of hidden matrices; embeddings, the LM head
// and vectors take AdamW.
bool muon_handles(const NamedParam& p) { return p.tensor.dim() == 2 && p.block >= 0; }

// Which moment buffers a parameter needs: 0, 1 (momentum) or 2 (AdamW).
int moment_count(const OptSettings& o, const NamedParam& p) {
  switch (o.kind) {
    case OptKind::adamw:
      return 2;
    case OptKind::sign_sgd:
      return 0;
    case OptKind::sgd:
      return o.momentum > 0 ? 1 : 0;
    case OptKind::muon:
      return muon_handles(p) ? 1 : 2;
  }
  return 0;
}

// Quintic Newton-Schulz iteration (coefficients from the Muon reference) that
// maps a matrix to the nearest semi-orthogonal one.
Tensor orthogonalize(const Tensor& g) {
  const double a = 3.4445, b = -4.7750, c = 2.0315;
  Tensor x = g.to(g.is_cuda() ? torch::kBFloat16 : torch::kFloat32);
  const bool tall = x.size(0) > x.size(1);
  if (tall) x = x.t();
  x = x / (x.norm() + 1e-7);
  for (int i = 0; i < 5; ++i) {
    Tensor A = torch::matmul(x, x.t());
    Tensor B = b * A + c * torch::matmul(A, A);
    x = a * x + torch::matmul(B, x);
  }
  if (tall) x = x.t();
  return x.to(torch::kFloat32);
}

// One parameter's update with LibTorch ops on whatever device the tensors are on.
// master, grad and moments are FP32 and on the same device.
void update_on_device(const OptSettings& o, const NamedParam& p, Tensor& master, const Tensor& grad,
                      Tensor* m1, Tensor* m2, double lr, std::int64_t step) {
  auto adamw = [&](double b1, double b2) {
    Tensor step_t = torch::full({}, static_cast<double>(step), master.options());
    at::_fused_adamw_({master}, {grad}, {*m1}, {*m2}, {}, {step_t}, lr, b1, b2, o.weight_decay, o.eps, false,
                      false);
  };
  switch (o.kind) {
    case OptKind::adamw:
      adamw(o.beta1, o.beta2);
      return;
    case OptKind::sign_sgd:
      master.mul_(1.0 - lr * o.weight_decay).add_(grad.sign(), -lr);
      return;
    case OptKind::sgd: {
      Tensor d = grad;
      if (m1) {
        m1->mul_(o.momentum).add_(grad);
        d = o.nesterov ? grad.add(*m1, o.momentum) : *m1;
      }
      master.mul_(1.0 - lr * o.weight_decay).add_(d, -lr);
      return;
    }
    case OptKind::muon: {
      if (!muon_handles(p)) {
        adamw(o.beta1, o.beta2);
        return;
      }
      m1->mul_(o.momentum).add_(grad);
      Tensor u = orthogonalize(grad.add(*m1, o.momentum));
      const double scale = std::sqrt(std::max(1.0, static_cast<double>(master.size(0)) / master.size(1)));
      master.mul_(1.0 - lr * o.weight_decay).add_(u, -lr * scale);
      return;
    }
  }
}

// The same update through the fused CPU kernels (FullOffload). Only the
// element-wise optimizers exist there; the config rules enforce it.
void update_on_cpu_kernel(const OptSettings& o, Tensor& master, const Tensor& grad, Tensor* m1, Tensor* m2,
                          std::uint16_t* weight_bf16_out, double lr, std::int64_t step) {
  const auto n = master.numel();
  switch (o.kind) {
    case OptKind::adamw: {
      cpu::AdamWStep s{static_cast<float>(lr),
                       static_cast<float>(o.beta1),
                       static_cast<float>(o.beta2),
                       static_cast<float>(o.eps),
                       static_cast<float>(o.weight_decay),
                       step,
                       1.0f};
      cpu::adamw(master.data_ptr<float>(), m1->data_ptr<float>(), m2->data_ptr<float>(),
                 grad.data_ptr<float>(), weight_bf16_out, n, s);
      return;
    }
    case OptKind::sign_sgd: {
      cpu::SignSGDStep s{static_cast<float>(lr), static_cast<float>(o.weight_decay), 1.0f};
      cpu::sign_sgd(master.data_ptr<float>(), grad.data_ptr<float>(), weight_bf16_out, n, s);
      return;
    }
    default:
      throw run_error(fmt::format("optimizer {} cannot run with offload = \"full\"", o.name()));
  }
}

// ===========================================================================
// 2. Offload strategies
// ===========================================================================

// FP32 training state of one parameter. Where each tensor lives is the strategy's
// decision (see OffloadState::allocate).
struct ParamState {
  NamedParam* p = nullptr;
  Tensor master;  // FP32 weights the optimizer updates
  Tensor grad;    // FP32 gradient accumulator over micro-batches
  Tensor m1, m2;  // moments (AdamW: exp_avg, exp_avg_sq; SGD/Muon: momentum)
  int chunk = 0;  // update group (FullOffload): one per transformer block
};

// Fires after autograd accumulated a parameter's gradient; forwards to the strategy.
struct GradReadyHook final : torch::autograd::PostAccumulateGradHook {
  std::function<void(const torch::autograd::Variable&)> fn;
  explicit GradReadyHook(std::function<void(const torch::autograd::Variable&)> f) : fn(std::move(f)) {}
  void operator()(const torch::autograd::Variable& t) override { fn(t); }
};

template <offload_strategy Strategy>
class OffloadState {
 public:
  OffloadState(Transformer& model, const OptSettings& opt) : model_(model), opt_(opt) {
    device_ = model.device();
    host_ =
        torch::TensorOptions().dtype(torch::kFloat32).device(torch::kCPU).pinned_memory(device_.is_cuda());
    dev_ = torch::TensorOptions().dtype(torch::kFloat32).device(device_);
    int max_chunk = 0;
    for (auto& p : model.params()) {
      ParamState s;
      s.p = &p;
      s.chunk = p.block < 0 ? model.args().layers : p.block;
      max_chunk = std::max(max_chunk, s.chunk);
      auto where = [&](bool on_host) { return on_host ? host_ : dev_; };
      s.master = torch::empty(p.tensor.sizes(), where(Strategy::masters_on_host));
      s.grad = torch::zeros(p.tensor.sizes(), where(Strategy::grads_on_host));
      const int moments = moment_count(opt, p);
      if (moments >= 1) s.m1 = torch::zeros(p.tensor.sizes(), where(Strategy::moments_on_host));
      if (moments >= 2) s.m2 = torch::zeros(p.tensor.sizes(), where(Strategy::moments_on_host));
      states_.push_back(std::move(s));
    }
    chunk_pending_.assign(max_chunk + 1, 0);
    masters_from_model();
    for (std::size_t i = 0; i < states_.size(); ++i) {
      torch::autograd::impl::set_post_acc_grad_hooks(
          states_[i].p->tensor,
          std::make_unique<GradReadyHook>([this, i](const torch::autograd::Variable&) { on_grad_ready(i); }));
    }
  }

  OffloadState(const OffloadState&) = delete;
  OffloadState& operator=(const OffloadState&) = delete;

  ~OffloadState() {
    for (auto& s : states_) torch::autograd::impl::set_post_acc_grad_hooks(s.p->tensor, nullptr);
  }

  std::vector<ParamState>& states() { return states_; }

  // Masters start as (or are reset to) the model's forward weights.
  void masters_from_model() {
    torch::NoGradGuard ng;
    for (auto& s : states_) s.master.copy_(s.p->tensor);
  }

  // Called once per optimizer step, before the first micro-batch.
  void begin_step(double lr, std::int64_t step, bool single_micro_batch) {
    lr_ = lr;
    step_ = step;
    last_micro_ = single_micro_batch;
    grad_sq_ = 0.0;
    for (auto& s : states_) s.grad.zero_();
    std::fill(chunk_pending_.begin(), chunk_pending_.end(), 0);
    for (auto& s : states_) ++chunk_pending_[s.chunk];
    updated_.assign(states_.size(), false);
  }
  // Called before the last micro-batch's backward (FullOffload updates during it).
  void begin_last_micro_batch() { last_micro_ = true; }

  // Called after the last micro-batch's backward. Returns the global gradient norm
  // (before clipping).
  double finish_step() {
    if constexpr (Strategy::grads_on_host && !Strategy::supports_grad_clipping) {
      // Parameters that got no gradient this step still take their (zero-gradient) update.
      for (std::size_t i = 0; i < states_.size(); ++i)
        if (!updated_[i]) {
          grad_sq_ += states_[i].grad.square().sum().item<double>();
          update_param(i);
        }
      return std::sqrt(grad_sq_);
    } else {
      double norm = global_grad_norm();
      if (opt_.max_norm && norm > *opt_.max_norm) {
        const double coef = *opt_.max_norm / (norm + 1e-6);
        for (auto& s : states_) s.grad.mul_(coef);
      }
      for (std::size_t i = 0; i < states_.size(); ++i) update_param(i);
      return norm;
    }
  }

  // Bytes of FP32 state in host memory, by category.
  std::map<std::string, double> host_bytes() const {
    std::map<std::string, double> out{{"masters", 0}, {"grads", 0}, {"moments", 0}};
    auto add = [](double& acc, const Tensor& t) {
      if (t.defined() && t.device().is_cpu()) acc += static_cast<double>(t.nbytes());
    };
    for (const auto& s : states_) {
      add(out["masters"], s.master);
      add(out["grads"], s.grad);
      add(out["moments"], s.m1);
      add(out["moments"], s.m2);
    }
    return out;
  }

 private:
  // The post-accumulate-grad hook: move the fresh gradient into the FP32
  // accumulator (on the host for FullOffload) and free the model's copy. On the last
  // micro-batch, FullOffload updates a chunk as soon as all its gradients are in,
  // while backward goes on with earlier blocks.
  void on_grad_ready(std::size_t i) {
    torch::NoGradGuard ng;
    ParamState& s = states_[i];
    Tensor& g = s.p->tensor.mutable_grad();
    if (!g.defined()) return;
    if constexpr (Strategy::grads_on_host) {
      // TODO(issue 5): copy stream + pinned ring instead of a blocking copy.
      s.grad.add_(g.to(torch::kCPU, torch::kFloat32));
    } else {
      s.grad.add_(g);
    }
    g = Tensor();
    if constexpr (!Strategy::supports_grad_clipping) {
      if (last_micro_ && !updated_[i]) {
        grad_sq_ += s.grad.square().sum().item<double>();
        if (--chunk_pending_[s.chunk] == 0) {
          for (std::size_t j = 0; j < states_.size(); ++j)
            if (states_[j].chunk == s.chunk && !updated_[j]) update_param(j);
        }
      }
    }
  }

  double global_grad_norm() {
    Tensor total = torch::zeros({}, dev_.dtype(torch::kFloat64));
    for (auto& s : states_) total += s.grad.to(torch::kFloat64).square().sum().to(total.device());
    return std::sqrt(total.item<double>());
  }

  // Runs the optimizer on one parameter and writes the new forward weight.
  void update_param(std::size_t i) {
    torch::NoGradGuard ng;
    ParamState& s = states_[i];
    updated_[i] = true;
    Tensor& w = s.p->tensor;
    if constexpr (Strategy::masters_on_host) {
      // FullOffload: the fused CPU kernel updates the host master and moments and,
      // for bf16 models, writes the bf16 weight in the same pass.
      const bool bf16 = w.scalar_type() == torch::kBFloat16;
      Tensor out;
      if (bf16) out = (w.device().is_cpu() && w.is_contiguous()) ? w.detach() : upload_buffer(w);
      update_on_cpu_kernel(
          opt_, s.master, s.grad, s.m1.defined() ? &s.m1 : nullptr, s.m2.defined() ? &s.m2 : nullptr,
          bf16 ? reinterpret_cast<std::uint16_t*>(out.data_ptr<at::BFloat16>()) : nullptr, lr_, step_);
      if (!bf16)
        w.detach().copy_(s.master, /*non_blocking=*/true);
      else if (!out.is_same(w))
        w.detach().copy_(out, /*non_blocking=*/true);
    } else {
      // NoOffload: everything is on the device already. OptimizerOffload: the
      // moments come over from (pinned) host memory for the update and go back.
      // On a CPU run the "device" is the host and the copies are no-ops.
      Tensor m1 = s.m1.defined() ? s.m1.to(device_, /*non_blocking=*/true) : Tensor();
      Tensor m2 = s.m2.defined() ? s.m2.to(device_, /*non_blocking=*/true) : Tensor();
      update_on_device(opt_, *s.p, s.master, s.grad, m1.defined() ? &m1 : nullptr,
                       m2.defined() ? &m2 : nullptr, lr_, step_);
      if constexpr (Strategy::moments_on_host) {
        if (m1.defined() && !m1.is_same(s.m1)) s.m1.copy_(m1, /*non_blocking=*/true);
        if (m2.defined() && !m2.is_same(s.m2)) s.m2.copy_(m2, /*non_blocking=*/true);
      }
      w.detach().copy_(s.master);
    }
  }

  // A reusable pinned bf16 buffer for the weight upload of a GPU parameter.
  Tensor upload_buffer(const Tensor& w) {
    auto& buf = upload_[w.unsafeGetTensorImpl()];
    if (!buf.defined() || buf.numel() != w.numel())
      buf = torch::empty(w.sizes(),
                         torch::TensorOptions().dtype(torch::kBFloat16).pinned_memory(device_.is_cuda()));
    return buf;
  }

  Transformer& model_;
  OptSettings opt_;
  torch::Device device_ = torch::kCPU;
  torch::TensorOptions host_, dev_;
  std::vector<ParamState> states_;
  std::vector<int> chunk_pending_;
  std::vector<bool> updated_;
  std::map<const void*, Tensor> upload_;
  double lr_ = 0, grad_sq_ = 0;
  std::int64_t step_ = 0;
  bool last_micro_ = false;
};

// ===========================================================================
// 3. Checkpoints
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

struct TrainPosition {
  std::int64_t step = 0;
  std::int64_t data_position = 0;
  std::int64_t scheduler_step = 0;
};

fs::path step_dir(const fs::path& root, std::int64_t step) { return root / fmt::format("step_{}", step); }

std::optional<std::int64_t> newest_checkpoint(const fs::path& root) {
  std::optional<std::int64_t> best;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return best;
  for (const auto& e : fs::directory_iterator(root)) {
    auto name = e.path().filename().string();
    if (name.rfind("step_", 0) != 0 || !fs::exists(e.path() / "trainer_state.safetensors")) continue;
    try {
      auto s = std::stoll(name.substr(5));
      if (!best || s > *best) best = s;
    } catch (...) {
    }
  }
  return best;
}

template <class Strategy>
void save_checkpoint(const fs::path& root, Transformer& model, OffloadState<Strategy>& state,
                     const OptSettings& opt, const TrainPosition& pos, const CheckpointConfig& cfg) {
  fs::create_directories(root);
  const fs::path final_dir = step_dir(root, pos.step);
  const fs::path tmp = root / fmt::format(".step_{}.tmp", pos.step);
  fs::remove_all(tmp);
  fs::create_directories(tmp);

  // model.safetensors + config.json: the folder is also an HF model directory.
  {
    TensorBundle b;
    for (const auto& p : model.params()) b.add(p.name, p.tensor);
    safetensors::write(tmp / "model.safetensors", b.entries, {{"format", "pt"}});
    write_hf_config(tmp / "config.json", model.args());
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
  fs::remove_all(final_dir);
  fs::rename(tmp, final_dir);

  if (cfg.keep_last) {
    std::vector<std::int64_t> steps;
    for (const auto& e : fs::directory_iterator(root)) {
      auto name = e.path().filename().string();
      if (name.rfind("step_", 0) == 0) try {
          steps.push_back(std::stoll(name.substr(5)));
        } catch (...) {
        }
    }
    std::sort(steps.begin(), steps.end());
    for (std::size_t i = 0; i + *cfg.keep_last < steps.size(); ++i) fs::remove_all(step_dir(root, steps[i]));
  }
}

// Copies a checkpoint tensor into dst, checking the shape (a checkpoint of
// another model fails here with the tensor's name).
void load_into(const safetensors::file& f, const std::string& name, Tensor dst) {
  const auto* t = f.find(name);
  if (!t)
    throw run_error(fmt::format("{}: tensor {} missing (checkpoint of another model or optimizer?)",
                                f.path().string(), name));
  std::vector<std::int64_t> want(dst.sizes().begin(), dst.sizes().end());
  if (t->shape != want)
    throw run_error(fmt::format("{}: tensor {} has shape [{}], this model needs [{}]", f.path().string(),
                                name, fmt::join(t->shape, ", "), fmt::join(want, ", ")));
  torch::ScalarType st = t->type == safetensors::dtype::BF16  ? torch::kBFloat16
                         : t->type == safetensors::dtype::F32 ? torch::kFloat32
                         : t->type == safetensors::dtype::U8  ? torch::kUInt8
                                                              : torch::kFloat16;
  torch::NoGradGuard ng;
  dst.detach().copy_(
      torch::from_blob(const_cast<std::byte*>(t->data), t->shape, torch::TensorOptions().dtype(st)));
}

template <class Strategy>
TrainPosition load_checkpoint(const fs::path& dir, Transformer& model, OffloadState<Strategy>& state,
                              const OptSettings& opt, const CheckpointConfig& cfg) {
  if (!fs::is_directory(dir)) throw run_error(dir.string() + ": no such checkpoint");
  try {
    auto mf = safetensors::file::open(dir / "model.safetensors");
    for (auto& p : model.params()) load_into(mf, p.name, p.tensor);
    const bool have_opt = fs::exists(dir / "optimizer.safetensors");
    if (!cfg.skip_optimizer && have_opt) {
      auto of = safetensors::file::open(dir / "optimizer.safetensors");
      auto it = of.metadata().find("optimizer");
      if (it != of.metadata().end() && it->second != opt.name())
        throw run_error(
            fmt::format("{}: optimizer state is {}, the config asks for {} (set ckpt.skip_optimizer to "
                        "load weights only)",
                        of.path().string(), it->second, opt.name()));
      for (auto& s : state.states()) {
        load_into(of, "master." + s.p->name, s.master);
        if (s.m1.defined()) load_into(of, "m1." + s.p->name, s.m1);
        if (s.m2.defined()) load_into(of, "m2." + s.p->name, s.m2);
      }
    } else {
      state.masters_from_model();  // model-only resume: masters are the weights
    }
    auto sf = safetensors::file::open(dir / "trainer_state.safetensors");
    auto meta = [&](const char* k) -> std::int64_t {
      auto it = sf.metadata().find(k);
      if (it == sf.metadata().end()) throw run_error(sf.path().string() + ": missing " + k);
      return std::stoll(it->second);
    };
    TrainPosition pos{meta("step"), meta("data_position"), cfg.skip_scheduler ? 0 : meta("scheduler_step")};
    if (const auto* rng = sf.find("rng.cpu")) {
      auto t = torch::empty({static_cast<std::int64_t>(rng->nbytes)}, torch::kUInt8);
      std::memcpy(t.data_ptr(), rng->data, rng->nbytes);
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      gen.set_state(t);
    }
    return pos;
  } catch (const safetensors::error& e) {
    throw run_error(e.what());
  }
}

// ===========================================================================
// 4. Metrics
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
#if defined(PRIMECFG_WITH_CUDA)
  if (d.is_cuda()) {
    auto* prop = at::cuda::getDeviceProperties(d.index() < 0 ? 0 : d.index());
    std::string name = prop->name;
    if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) return 989e12;
  }
#endif
  (void)d;
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
  std::int64_t tokens = 0;
};

class Reporter {
 public:
  Reporter(const fs::path& out_dir, bool print, std::string_view mode) : print_(print), mode_(mode) {
    fs::create_directories(out_dir);
    jsonl_.open(out_dir / "metrics.jsonl", std::ios::app);
    if (!jsonl_) throw run_error((out_dir / "metrics.jsonl").string() + ": cannot open for writing");
    tty_ = ::isatty(::fileno(stderr));
  }
  ~Reporter() {
    if (tty_ && print_ && bar_shown_) std::fputc('\n', stderr);
  }

  void log(const StepMetrics& m) {
    std::string host;
    for (const auto& [k, v] : m.host_state) host += fmt::format(",\"{}\":{:.6f}", k, v / GiB);
    jsonl_ << fmt::format(
        "{{\"step\":{},\"loss\":{:.6f},\"lr\":{:.6g},\"grad_norm\":{:.6g},\"tokens\":{},\"tokens_per_s\":{:."
        "2f},"
        "\"mfu\":{},\"step_time_s\":{:.4f},\"peak_device_mem_gib\":{:.4f},\"host_mem_gib\":{{\"rss\":{:.4f}{}"
        "}},"
        "\"offload\":\"{}\"}}\n",
        m.step, m.loss, m.lr, m.grad_norm, m.tokens, m.tokens_per_s,
        m.mfu ? fmt::format("{:.4f}", *m.mfu) : "null", m.step_time, m.peak_device / GiB, m.host_rss / GiB,
        host, mode_);
    jsonl_.flush();
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
  std::ofstream jsonl_;
  bool print_, tty_ = false, bar_shown_ = false;
  std::string mode_;
};

// ===========================================================================
// 5. The training loop
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
    // --- Model -----------------------------------------------------------
    const auto& name = cfg_.model.name;
    std::optional<ModelArgs> args = preset(name);
    const bool hf_dir = !args && fs::exists(fs::path(name) / "config.json");
    if (hf_dir) args = args_from_hf_config(fs::path(name) / "config.json");
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
    const std::int64_t seq_len = loader.options().seq_len;
    const auto opt = OptSettings::from(cfg_.optim);
    OffloadState<Strategy> state(model, opt);
    const bool ac = cfg_.model.ac.has_value();
    const std::int64_t ac_freq = ac ? cfg_.model.ac->freq : 1;
    const std::int64_t ce_chunk = cfg_.model.fused_lm_head_token_chunk_size.value_or(
        std::max<std::int64_t>(256, (std::int64_t{1} << 27) / args->vocab_size));

    // --- Resume --------------------------------------------------------------
    const CheckpointConfig ckpt = cfg_.ckpt.value_or(CheckpointConfig{});
    const fs::path ckpt_root = ckpt.output_dir.value_or(cfg_.output_dir / "checkpoints");
    TrainPosition pos;
    if (cfg_.resume) {
      auto step = cfg_.resume->step ? cfg_.resume->step : newest_checkpoint(ckpt_root);
      if (!step) throw run_error(fmt::format("resume: no checkpoint in {}", ckpt_root.string()));
      pos = load_checkpoint(step_dir(ckpt_root, *step), model, state, opt, ckpt);
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
    if (!opts_.resolved_config.empty())
      std::ofstream(cfg_.output_dir / "config.toml") << opts_.resolved_config;
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
    auto i64 = torch::TensorOptions().dtype(torch::kInt64);
    while (pos.step < max_steps && !(loader.epoch_done() && !endless && !cfg_.max_steps)) {
      const auto t0 = std::chrono::steady_clock::now();
      data::Batch batch = loader.next();
      const double lr = scheduled_lr(cfg_.scheduler, opt.lr, pos.scheduler_step, max_steps);
      state.begin_step(lr, pos.step + 1, batch.micro.size() == 1);
      const double scale = 1.0 / static_cast<double>(std::max<std::int64_t>(1, batch.loss_tokens));
      double loss_sum = 0;
      for (std::size_t m = 0; m < batch.micro.size(); ++m) {
        const auto& mb = batch.micro[m];
        if (m + 1 == batch.micro.size()) state.begin_last_micro_batch();
        auto shape = std::vector<std::int64_t>{mb.rows, mb.seq_len};
        Transformer::Inputs in{torch::tensor(mb.input_ids, i64).view(shape).to(setup_.device),
                               torch::tensor(mb.positions, i64).view(shape).to(setup_.device), std::nullopt};
        if (!mb.one_doc_per_row) {
          Tensor doc = torch::tensor(mb.doc_ids, i64).view(shape).to(setup_.device);
          Tensor same = doc.unsqueeze(2).eq(doc.unsqueeze(1));
          in.mask =
              same.logical_and(torch::ones({mb.seq_len, mb.seq_len}, same.options()).tril()).unsqueeze(1);
        }
        Tensor targets = torch::tensor(mb.targets, i64).to(setup_.device);
        Tensor loss = model.loss(model.hidden(in, ac, ac_freq), targets, scale, ce_chunk);
        loss.backward();
        loss_sum += loss.item<double>();
      }
      const double grad_norm = state.finish_step();
      ++pos.step;
      ++pos.scheduler_step;
      pos.data_position = loader.position();
#if defined(PRIMECFG_WITH_CUDA)
      if (setup_.device.is_cuda()) torch::cuda::synchronize();
#endif
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      result.losses.push_back(loss_sum);

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
      reporter.log(met);

      if (cfg_.ckpt && ckpt.interval && pos.step % *ckpt.interval == 0)
        save_checkpoint(ckpt_root, model, state, opt, pos, ckpt);
    }
    if (cfg_.ckpt && !(ckpt.interval && pos.step % *ckpt.interval == 0) && pos.step > result.first_step)
      save_checkpoint(ckpt_root, model, state, opt, pos, ckpt);
    result.last_step = pos.step;

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
// 6. Entry point
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
