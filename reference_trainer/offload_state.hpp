// OffloadState<Strategy>: where the FP32 training state lives and when the update
// runs, for the three offload strategies (one template; `if constexpr` on the
// strategy's traits from <primecfg/offload.hpp>; the class comment below says what
// each strategy does).
//
// Read in this order: the per-parameter state and the pipeline knobs, then the class:
// its step interface (begin_step ... finish_step, in the order Trainer::run calls it),
// the device-resident update, OptimizerOffload's moment window, FullOffload's host
// pipeline.
//
// Internal to primecfg-train (included by trainer.cpp only).
#pragma once

#include "device_streams.hpp"
#include "host_trace.hpp"
#include "loss_chunking.hpp"
#include "model.hpp"
#include "numa/numa_binding.hpp"
#include "optimizer_math.hpp"
#include "planner.hpp"
#include "staging_ring.hpp"
#include "task_thread.hpp"
#include "trainer.hpp"
#include "update_groups.hpp"

#include <primecfg/offload.hpp>

#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace primecfg::train {

// FP32 training state of one parameter. Where each tensor lives is the strategy's
// decision (see the OffloadState constructor).
struct ParamState {
  NamedParam* p = nullptr;
  Tensor master;  // FP32 weights the optimizer updates
  Tensor grad;    // FP32 gradient accumulator over micro-batches (FullOffload: host, made when needed)
  Tensor m1, m2;  // moments (AdamW: exp_avg, exp_avg_sq; SGD/Muon: momentum)
};

// Fires after autograd accumulated a parameter's gradient; forwards to the strategy.
struct GradReadyHook final : torch::autograd::PostAccumulateGradHook {
  std::function<void(const torch::autograd::Variable&)> fn;
  explicit GradReadyHook(std::function<void(const torch::autograd::Variable&)> f) : fn(std::move(f)) {}
  void operator()(const torch::autograd::Variable& t) override { fn(t); }
};

inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Knobs of the copy pipelines, from the environment (tests shrink the rings;
// nothing here changes results but PRIMECFG_OFFLOAD_EARLY_HEAD, within FP32 rounding).
//   PRIMECFG_OFFLOAD_RING_MB    size of each staging ring / GPU moment window (default: automatic)
//   PRIMECFG_OFFLOAD_TIMEOUT_S  how long a pipeline wait may take before it fails (default 600)
//   PRIMECFG_OFFLOAD_THREADS    CPU optimizer threads (default: the usable CPUs minus one)
//   PRIMECFG_OFFLOAD_SPLIT_TIED 0 = FullOffload updates a tied embedding only after backward
//   PRIMECFG_OFFLOAD_DEFER      1/0 = FullOffload lets the CPU updates still running after
//                               backward finish beside the next forward (default: on a GPU)
//   PRIMECFG_OFFLOAD_HEAD_LAST  0 = FullOffload updates the tied embedding's head share as soon
//                               as it lands, before the layers' updates (default 1: last)
//   PRIMECFG_OFFLOAD_EDF        0 = FullOffload's worker takes gradients in arrival order
//                               (default 1: the one the next forward needs first)
//   PRIMECFG_OFFLOAD_UPLOAD_THREAD 0 = FullOffload's worker queues each weight upload itself
//                               (default 1: a thread of their own queues them)
//   PRIMECFG_OFFLOAD_GROUP_UPDATES 0 = OptimizerOffload updates each parameter on its own
//                               (default with AdamW: a transformer block's parameters in
//                               multi-tensor launches once all their gradients are in)
//   PRIMECFG_OFFLOAD_EARLY_HEAD 1 / 0 = FullOffload with tied embeddings computes the loss in
//                               vocabulary chunks, each chunk's rows of the head share handed
//                               over as computed / in token chunks, the head share handed over
//                               when backward starts (default: by micro-batch size,
//                               plan::vocab_chunked_loss)
struct PipelineKnobs {
  std::size_t ring_bytes = 0;
  std::chrono::milliseconds timeout{600'000};
  int threads = 0;
  bool split_tied = true;
  bool head_last = true;
  bool edf = true;
  bool upload_thread = true;
  bool group_updates = true;
  std::optional<bool> early_head;
  bool hold_head = false;  // RunOptions::offload_hold_head_share (tests)
  std::optional<bool> defer;

  static PipelineKnobs from_env() {
    PipelineKnobs k;
    auto num = [](const char* name) -> std::optional<double> {
      const char* v = std::getenv(name);
      if (!v || !*v) return std::nullopt;
      try {
        return std::stod(v);
      } catch (...) {
        throw run_error(fmt::format("{}=\"{}\" is not a number", name, v));
      }
    };
    if (auto v = num("PRIMECFG_OFFLOAD_RING_MB")) k.ring_bytes = static_cast<std::size_t>(*v * 1024 * 1024);
    if (auto v = num("PRIMECFG_OFFLOAD_TIMEOUT_S"))
      k.timeout = std::chrono::milliseconds(std::llround(*v * 1e3));
    if (auto v = num("PRIMECFG_OFFLOAD_THREADS")) k.threads = static_cast<int>(*v);
    if (auto v = num("PRIMECFG_OFFLOAD_SPLIT_TIED")) k.split_tied = *v != 0;
    if (auto v = num("PRIMECFG_OFFLOAD_DEFER")) k.defer = *v != 0;
    if (auto v = num("PRIMECFG_OFFLOAD_HEAD_LAST")) k.head_last = *v != 0;
    if (auto v = num("PRIMECFG_OFFLOAD_EDF")) k.edf = *v != 0;
    if (auto v = num("PRIMECFG_OFFLOAD_UPLOAD_THREAD")) k.upload_thread = *v != 0;
    if (auto v = num("PRIMECFG_OFFLOAD_GROUP_UPDATES")) k.group_updates = *v != 0;
    if (auto v = num("PRIMECFG_OFFLOAD_EARLY_HEAD")) k.early_head = *v != 0;
    return k;
  }

  // Capacity of a ring for tensors of at most `largest` bytes, `total` bytes in all:
  // room for two of the largest (so one fills while the other drains), at least
  // 2 GiB when the model has that much (so backward rarely waits for the consumer),
  // never less than the largest.
  std::size_t ring_for(std::size_t largest, std::size_t total) const {
    const std::size_t slack = 4096;
    if (ring_bytes) return std::max(ring_bytes, largest + slack);
    const std::size_t want = std::max<std::size_t>(2 * largest, std::size_t{2} << 30);
    return std::max(largest, std::min(want, total)) + slack;
  }
};

// A typed view of `bytes` bytes at `offset` in a byte buffer.
inline Tensor ring_view(const Tensor& buf, std::size_t offset, torch::ScalarType dtype,
                        torch::IntArrayRef sizes) {
  const auto elem = static_cast<std::int64_t>(c10::elementSize(dtype));
  std::int64_t n = 1;
  for (auto d : sizes) n *= d;
  return buf.narrow(0, static_cast<std::int64_t>(offset), n * elem).view(dtype).view(sizes);
}

// Token ids and the like as a device tensor. On a GPU they go through pinned memory
// with an asynchronous copy: the host goes on queueing the forward pass instead of
// waiting for a copy engine that the offload traffic may keep busy.
inline Tensor to_device(const std::vector<std::int64_t>& values, torch::IntArrayRef shape,
                        torch::Device device) {
  auto host = torch::TensorOptions().dtype(torch::kInt64).pinned_memory(!device.is_cpu());
  Tensor t = torch::empty(shape, host);
  TORCH_CHECK(static_cast<std::size_t>(t.numel()) == values.size(), "to_device: shape does not match");
  std::memcpy(t.data_ptr<std::int64_t>(), values.data(), values.size() * sizeof(std::int64_t));
  return device.is_cpu() ? t : t.to(device, /*non_blocking=*/true);
}

// An asynchronous copy between contiguous tensors of one size, queued in pieces of at
// most 64 MiB. A copy engine runs the copies queued on it in order, so a small copy
// that the compute stream needs (the loss read back with .item(), the next step's
// inputs) would otherwise wait behind a whole 1 GB moment transfer (22 ms at 55 GB/s).
inline void copy_in_pieces(const Tensor& dst, const Tensor& src) {
  Tensor d = dst.view(-1), s = src.view(-1);
  const std::int64_t piece = std::max<std::int64_t>(1, (std::int64_t{64} << 20) / d.element_size());
  for (std::int64_t at = 0, n = d.numel(); at < n; at += piece) {
    const std::int64_t len = std::min(piece, n - at);
    d.narrow(0, at, len).copy_(s.narrow(0, at, len), /*non_blocking=*/true);
  }
}

// Where the FP32 state lives and when the update runs, per strategy:
//
//  NoOffload        all on the device; after backward one multi-tensor update.
//  OptimizerOffload moments in pinned host memory. They go up through a bounded
//                   device window on a copy stream, fetched ahead in the order the
//                   last step's gradients came; without clipping a transformer
//                   block is updated on the compute stream from the hook of its last
//                   gradient (with clipping, every parameter after backward), and the
//                   moments go back on a second copy stream. The copies overlap
//                   backward, and the last write-backs the next forward.
//  FullOffload      masters, moments and accumulators in host RAM. The hook of each
//                   parameter queues its gradient on a copy stream into a pinned
//                   staging ring and hands it to a CPU worker thread; the worker waits
//                   for the copy, runs the fused CPU kernel over the thread pool (bf16
//                   weights written into a pinned upload ring) and queues the upload on
//                   a second copy stream, while backward goes on. finish_step() drains
//                   the worker, updates parameters that got no gradient, and makes the
//                   compute stream wait for the last upload.
// On the CPU the same code runs with host memory: no streams, copies are synchronous.
template <offload_strategy Strategy>
class OffloadState {
  static constexpr bool kHostUpdate = Strategy::masters_on_host;  // FullOffload

 public:
  OffloadState(Transformer& model, const OptSettings& opt, const RunOptions& run) : model_(model), opt_(opt) {
    device_ = model.device();
    knobs_ = PipelineKnobs::from_env();
    if (run.offload_ring_bytes) knobs_.ring_bytes = run.offload_ring_bytes;
    if (run.offload_threads > 0) knobs_.threads = run.offload_threads;
    if (run.offload_split_tied) knobs_.split_tied = *run.offload_split_tied;
    if (run.offload_defer) knobs_.defer = run.offload_defer;
    knobs_.hold_head = run.offload_hold_head_share;
    if (!knobs_.defer) knobs_.defer = !device_.is_cpu();
    const bool cuda = !device_.is_cpu();
    auto pinned = torch::TensorOptions().dtype(torch::kFloat32).device(torch::kCPU).pinned_memory(cuda);
    auto plain = torch::TensorOptions().dtype(torch::kFloat32).device(torch::kCPU);
    dev_ = torch::TensorOptions().dtype(torch::kFloat32).device(device_);
    for (auto& p : model.params()) {
      ParamState s;
      s.p = &p;
      const bool bf16_weights = p.tensor.scalar_type() == torch::kBFloat16;
      if constexpr (kHostUpdate) {
        // Masters are uploaded straight from host memory only for FP32 weights;
        // moments and accumulators never leave the host.
        s.master = torch::empty(p.tensor.sizes(), bf16_weights ? plain : pinned);
      } else {
        s.master = torch::empty(p.tensor.sizes(), dev_);
        s.grad = torch::zeros(p.tensor.sizes(), dev_);
      }
      const auto moments_at = Strategy::moments_on_host ? (kHostUpdate ? plain : pinned) : dev_;
      const int moments = moment_count(opt, p);
      if (moments >= 1) s.m1 = torch::zeros(p.tensor.sizes(), moments_at);
      if (moments >= 2) s.m2 = torch::zeros(p.tensor.sizes(), moments_at);
      states_.push_back(std::move(s));
    }
    masters_from_model();
    if constexpr (kHostUpdate) {
      if (model.args().tie_embeddings && knobs_.split_tied)
        for (std::size_t i = 0; i < states_.size(); ++i)
          if (states_[i].p->tensor.is_same(model.lm_head())) tied_ = i;
      head_hook_ = [this](std::int64_t first_row, const Tensor& rows) { submit_head_rows(first_row, rows); };
      tied_embeddings_ = model.args().tie_embeddings;
      block_hook_ = [this](int block) { wait_for_block(block); };
      rows_hook_ = [this](std::int64_t first, std::int64_t end) { wait_for_head_rows(first, end); };
      block_groups_.resize(static_cast<std::size_t>(model.args().layers));
      for (std::size_t i = 0; i < states_.size(); ++i) {
        const int b = states_[i].p->block;
        if (b >= 0)
          block_groups_.at(static_cast<std::size_t>(b)).push_back(i);
        else
          head_group_.push_back(i);  // the embedding, the final norm and an untied LM head
        if (states_[i].p->tensor.is_same(model.param("model.embed_tokens.weight")))
          lookup_group_.push_back(i);
      }
      needed_at_.assign(states_.size(), model.args().layers);
      for (std::size_t i = 0; i < states_.size(); ++i)
        if (states_[i].p->block >= 0) needed_at_[i] = states_[i].p->block;
      for (auto i : lookup_group_) needed_at_[i] = -1;
      acc_valid_.assign(states_.size(), 0);
      done_step_.assign(states_.size(), 0);
      got_last_grad_.assign(states_.size(), 0);
      start_host_pipeline();
    }
    if constexpr (Strategy::moments_on_host && !kHostUpdate) {
      if (cuda) {
        h2d_ = dev::side_stream(device_);
        d2h_ = dev::side_stream(device_);
        overlap_ = !opt.max_norm;
      }
    }
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
    if (prefetch_.valid()) prefetch_.wait();
    try {
      finish_pending();
    } catch (...) {
    }
    if (worker_.joinable()) {
      {
        std::lock_guard lk(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      worker_.join();
    }
    uploader_.reset();  // runs the uploads and completions still queued
    try {
      dev::synchronize(d2h_);
      dev::synchronize(h2d_);
      dev::synchronize(tail_h2d_);
    } catch (...) {
    }
  }

  std::vector<ParamState>& states() { return states_; }

  // Masters start as (or are reset to) the model's forward weights.
  void masters_from_model() {
    torch::NoGradGuard ng;
    sync_host();
    for (auto& s : states_) s.master.copy_(s.p->tensor);
  }

  // Waits for updates and copies still writing host state (before a checkpoint
  // reads it, and at the end of a run).
  void sync_host() {
    finish_pending();
    flush_tail_write_back();
    dev::synchronize(d2h_);
    dev::synchronize(h2d_);
    dev::synchronize(tail_h2d_);
  }

  // Called once per optimizer step, before the first micro-batch.
  void begin_step(double lr, std::int64_t step, bool single_micro_batch) {
    lr_ = lr;
    step_ = step;
    single_micro_ = single_micro_batch;
    last_micro_ = single_micro_batch;
    {
      std::lock_guard lk(mu_);
      stats_ = Stats{};
    }
    if constexpr (kHostUpdate) {
      // The worker may still run the last step's deferred updates: they keep their own
      // context, and a step that accumulates (and so needs the host norm) waits first.
      if (!single_micro_batch) finish_pending();
      auto c = std::make_shared<StepContext>();
      c->lr = lr;
      c->step = step;
      c->single_micro = single_micro_batch;
      ctx_ = std::move(c);
      std::fill(got_last_grad_.begin(), got_last_grad_.end(), 0);
      gsq_host_ = 0.0;
      // One slot per parameter for its gradient norm, written by its hook (one kernel
      // per hook: the autograd thread queues backward between hooks, and on a host
      // busy with the CPU update every launch costs).
      if (!grad_norms_.defined())
        grad_norms_ = torch::zeros({static_cast<std::int64_t>(states_.size())}, dev_);
      else
        grad_norms_.zero_();
    } else {
      // The first gradient of the step is copied into the accumulator and later
      // ones added, so the accumulators are not zeroed here (a launch per
      // parameter, and a pass over 4 bytes per parameter, saved each step).
      fresh_.assign(states_.size(), 1);
      if (overlap_) {
        ensure_window();
        std::fill(updated_.begin(), updated_.end(), 0);
        // Per-step tensors the hooks use, made once: the step for the fused AdamW and
        // one slot per parameter for its gradient norm (one kernel per hook instead of
        // a fill, and four for a running sum: host time in the hooks is time the
        // backward pass is not being queued).
        step_t_ = torch::full({}, static_cast<double>(step), dev_);
        hooked_.assign(states_.size(), 0);
        if (window_groups_.empty()) make_window_groups();
        for (auto& w : group_waiting_) w.clear();
        if (!grad_norms_.defined())
          grad_norms_ = torch::zeros({static_cast<std::int64_t>(states_.size())}, dev_);
      }
    }
  }
  // Called before the last micro-batch's forward (FullOffload and, without
  // clipping, OptimizerOffload update during its backward), with its input ids.
  void begin_last_micro_batch(const std::vector<std::int64_t>& input_ids) {
    last_micro_ = true;
    h_forward_ = HostTrace::now();
    if constexpr (kHostUpdate) {
      if (tied_) request_lookup_rows(input_ids);
      // The tied embedding is split only with one micro-batch per step: with more,
      // the FP32 accumulator would have to be added row by row as well.
      split_tied_ = tied_ && single_micro_;
      head_submitted_ = false;
      if (split_tied_) {
        StepContext& c = *ctx_;
        const std::int64_t vocab = states_[*tied_].p->tensor.size(0);
        c.in_batch.assign(static_cast<std::size_t>(vocab), 0);
        for (auto id : input_ids)
          if (id >= 0 && id < vocab) c.in_batch[static_cast<std::size_t>(id)] = 1;
        for (std::int64_t r = 0; r < vocab; ++r)
          if (c.in_batch[static_cast<std::size_t>(r)]) c.batch_rows.push_back(r);
        const std::array<std::int64_t, 1> n{static_cast<std::int64_t>(c.batch_rows.size())};
        c.batch_rows_dev = to_device(c.batch_rows, n, device_);
      }
    }
    if (overlap_) {
      // Fetch ahead in the order the last step's hooks fired (the first step has
      // none to go by and fetches as gradients come).
      const bool known = !seen_.empty();
      plan_order(/*split_tail=*/known);
      if (!known) {
        next_fetch_ = order_.size();
      } else {
        // Queued from a helper thread while this one queues the forward: the host work
        // (a copy and a wait per parameter, ~15 ms on Qwen3-0.6B) would otherwise hold
        // the forward's launch back, or start the copies that late. Joined in
        // before_backward(); nothing else touches the window until then.
        prefetch_ = std::async(std::launch::async, [this] {
          torch::NoGradGuard ng;
          const auto h0 = HostTrace::now();
          if (tail_) fetch_tail();
          fetch_ahead();
          trace_.span("prefetch", "prefetch", h0, HostTrace::now(), step_);
        });
      }
    }
  }

  // Called once the last micro-batch's forward is queued, before its backward: the
  // prefetch started in begin_last_micro_batch must be queued in full by now.
  void before_backward() {
    if (prefetch_.valid()) prefetch_.get();
    h_backward_ = HostTrace::now();
    trace_.span("main", "queue forward", h_forward_, h_backward_, step_);
  }

  // Called at the end of a step, once its loss and norm are read back.
  // OptimizerOffload queues the input embedding's moment write-back only now: a
  // read-back to pageable memory (.item()) waits for a running device-to-host copy,
  // and that one takes 22 ms on Qwen3-0.6B. Queued now, it runs beside the next forward.
  void end_step() {
    trace_.span("main", "read back", h_finished_, HostTrace::now(), step_);
    flush_tail_write_back();
  }

  // The hook for Transformer::loss on the last micro-batch; null when this step does
  // not split the tied embedding's update.
  const Transformer::HeadGradHook* head_grad_hook() const { return split_tied_ ? &head_hook_ : nullptr; }
  // How Transformer::loss walks the logits of a micro-batch of `tokens` tokens:
  // vocabulary chunks for FullOffload with a tied embedding (split or not, so that
  // both compute the same loss and gradients: the tests compare them bit for bit)
  // where plan::vocab_chunked_loss or PRIMECFG_OFFLOAD_EARLY_HEAD says so.
  Transformer::LossChunks loss_chunks(std::int64_t tokens) const {
    const bool vocab = kHostUpdate && tied_embeddings_ &&
                       knobs_.early_head.value_or(plan::vocab_chunked_loss(tied_embeddings_, tokens));
    return vocab ? Transformer::LossChunks::vocabulary : Transformer::LossChunks::tokens;
  }

  // The hook for Transformer::hidden: FullOffload's forward waits there for the
  // deferred updates of the weights it is about to use.
  const Transformer::BlockHook* block_hook() const { return kHostUpdate ? &block_hook_ : nullptr; }
  // The hooks for Transformer::loss (`last`: the step's last micro-batch).
  Transformer::LossHooks loss_hooks(bool last) const {
    if constexpr (!kHostUpdate) return {};
    return {last ? head_grad_hook() : nullptr, &rows_hook_};
  }

  // Called after the last micro-batch's backward. Returns the global gradient norm
  // (before clipping).
  double finish_step() {
    const auto h0 = HostTrace::now();
    trace_.span("main", "queue backward", h_backward_, h0, step_);
    const double norm = finish_step_impl();
    h_finished_ = HostTrace::now();
    trace_.span("main", "finish step", h0, h_finished_, step_);
    return norm;
  }

 private:
  double finish_step_impl() {
    if constexpr (!kHostUpdate) {
      for (std::size_t i = 0; i < states_.size(); ++i)
        if (fresh_[i]) states_[i].grad.zero_();  // no gradient this step
    }
    if constexpr (kHostUpdate) {
      return finish_host_step();
    } else if (overlap_) {
      // Groups some of whose parameters got no gradient in the last micro-batch: the
      // others one by one (they need not be consecutive any more), then those (below).
      for (auto& w : group_waiting_)
        for (auto i : std::exchange(w, {})) update_in_hook({i});
      // Parameters that got no gradient in the last micro-batch.
      for (std::size_t i = 0; i < states_.size(); ++i)
        if (!updated_[i]) {
          record_grad_norm(i);
          update_one_streamed(i);
          fetch_ahead();
        }
      // As NoOffload sums them: FP32 norms per parameter, squared and summed in FP64.
      return grad_norms_.to(torch::kFloat64).square().sum().sqrt().item<double>();
    } else {
      // Norm and clipping stay on the device (no host round trip before the update).
      std::vector<Tensor> grads;
      for (auto& s : states_) grads.push_back(s.grad);
      Tensor norm = at::stack(at::_foreach_norm(grads, 2)).to(torch::kFloat64).square().sum().sqrt();
      if (opt_.max_norm)
        at::_foreach_mul_(grads,
                          (norm + 1e-6).reciprocal().mul(*opt_.max_norm).clamp_max(1.0).to(torch::kFloat32));
      if (Strategy::moments_on_host && h2d_)
        update_streamed();
      else
        update_resident();
      return norm.item<double>();
    }
  }

 public:
  // What the copy pipelines did in the last step.
  std::map<std::string, double> pipeline_stats() const {
    if constexpr (!Strategy::moments_on_host) {
      return {};
    } else {
      std::map<std::string, double> out{{"d2h_gib", stats_.d2h_bytes / (1024.0 * 1024 * 1024)},
                                        {"h2d_gib", stats_.h2d_bytes / (1024.0 * 1024 * 1024)}};
      if (kHostUpdate) {
        out["cpu_update_s"] = stats_.cpu_update_s;
        out["copy_wait_s"] = stats_.copy_wait_s;
        out["ring_wait_s"] = stats_.ring_wait_s;
        out["drain_s"] = stats_.drain_s;
        out["defer_wait_s"] = stats_.defer_wait_s;
        out["upload_wait_s"] = stats_.upload_wait_s;
        out["cpu_threads"] = pool_ ? pool_->size() : 0;
        if (split_tied_) {
          out["tied_batch_rows"] = static_cast<double>(ctx_->batch_rows.size());
          out["lookup_rows"] = stats_.lookup_rows;
        }
      }
      return out;
    }
  }

  // Bytes of FP32 state in host memory, by category.
  std::map<std::string, double> host_bytes() const {
    std::map<std::string, double> out{{"masters", 0}, {"grads", 0}, {"moments", 0}, {"staging", 0}};
    auto add = [](double& acc, const Tensor& t) {
      if (t.defined() && t.device().is_cpu()) acc += static_cast<double>(t.nbytes());
    };
    for (const auto& s : states_) {
      add(out["masters"], s.master);
      add(out["grads"], s.grad);
      add(out["moments"], s.m1);
      add(out["moments"], s.m2);
    }
    add(out["staging"], grad_ring_buf_);
    add(out["staging"], up_ring_buf_);
    add(out["staging"], head_buf_);
    return out;
  }

 private:
  // --- Device-resident update (NoOffload; OptimizerOffload on the CPU) -------------

  void update_resident() {
    torch::NoGradGuard ng;
    if (opt_.kind == OptKind::adamw) {
      // One multi-tensor launch for all parameters (the same arithmetic as one
      // call per parameter).
      std::vector<Tensor> ps, gs, a, b;
      for (auto& s : states_) {
        ps.push_back(s.master);
        gs.push_back(s.grad);
        a.push_back(s.m1);
        b.push_back(s.m2);
      }
      Tensor step_t = torch::full({}, static_cast<double>(step_), states_[0].master.options());
      std::vector<Tensor> steps(states_.size(), step_t);
      at::_fused_adamw_(ps, gs, a, b, {}, steps, lr_, opt_.beta1, opt_.beta2, opt_.weight_decay, opt_.eps,
                        false, false);
    } else {
      for (auto& s : states_)
        update_on_device(opt_, *s.p, s.master, s.grad, s.m1.defined() ? &s.m1 : nullptr,
                         s.m2.defined() ? &s.m2 : nullptr, lr_, step_);
    }
    // The new weights, in one multi-tensor launch.
    std::vector<Tensor> weights, masters;
    for (auto& s : states_) {
      weights.push_back(s.p->tensor.detach());
      masters.push_back(s.master);
    }
    at::_foreach_copy_(weights, masters);
  }

  // --- OptimizerOffload on a GPU: moments stream through a bounded window ------------
  //
  // Each parameter's moments go up into the window on the h2d stream, the update
  // waits for them on the compute stream, and they go back on the d2h stream; a
  // window region is reused once its write-back ran (a wait queued on the h2d
  // stream, never on the host). Without clipping the update of a parameter runs in
  // its gradient hook, during backward, and the moments of the parameters whose
  // gradients come next (in the order the previous step saw) are fetched ahead while
  // the window has room; with clipping, all updates run after backward, in the
  // same fetch-ahead order.

  struct WindowEntry {
    std::size_t param = 0;
    bool queued = false;  // its update (and write-back) are queued: the region may be reused after `free`
    dev::Marker free;
  };

  void ensure_window() {
    if (window_.defined()) return;
    std::size_t largest = 0, total = 0;
    for (auto& s : states_) {
      // Without clipping the input embedding's moments get a buffer of their own from
      // the second step on (tail_); the window is sized for the rest, as the planner
      // assumes. In the first step they go through the window or temporaries.
      if (overlap_ && s.p->name == "model.embed_tokens.weight") continue;
      const std::size_t b = moment_bytes(s);
      largest = std::max(largest, b);
      total += b;
    }
    window_ring_ = StagingRing(knobs_.ring_for(largest, total));
    window_ = torch::empty({static_cast<std::int64_t>(window_ring_.capacity())}, dev_.dtype(torch::kUInt8));
    slot_.assign(states_.size(), std::nullopt);
    ready_.assign(states_.size(), dev::Marker());
    written_.assign(states_.size(), dev::Marker());
    updated_.assign(states_.size(), 0);
  }

  std::pair<Tensor, Tensor> window_views(std::size_t i, std::size_t offset) {
    ParamState& s = states_[i];
    const auto n = s.master.numel();
    Tensor region = ring_view(window_, offset, torch::kFloat32, {s.m2.defined() ? 2 * n : n});
    Tensor m1 = region.narrow(0, 0, n).view(s.master.sizes());
    Tensor m2 = s.m2.defined() ? region.narrow(0, n, n).view(s.master.sizes()) : Tensor();
    return {m1, m2};
  }

  // Queues the upload of parameter i's moments into the window; false when the
  // window is full of moments whose updates are not queued yet.
  bool fetch(std::size_t i) {
    ParamState& s = states_[i];
    const std::size_t bytes = moment_bytes(s);
    if (!window_ring_.fits_at_all(bytes)) return false;
    std::optional<StagingRing::Range> r;
    for (;;) {
      if ((r = window_ring_.try_acquire(bytes))) break;
      if (window_entries_.empty() || !window_entries_.front().queued) return false;
      window_entries_.front().free.wait_on(h2d_);
      window_entries_.pop_front();
      window_ring_.release(*window_ring_.oldest());
    }
    written_[i].wait_on(h2d_);  // host moments are read only after their last write-back
    auto [m1, m2] = window_views(i, r->offset);
    {
      dev::StreamScope on(h2d_);
      copy_in_pieces(m1, s.m1);
      if (m2.defined()) copy_in_pieces(m2, s.m2);
    }
    ready_[i] = dev::Marker::record(h2d_);
    slot_[i] = r->offset;
    window_entries_.push_back(WindowEntry{i, false, dev::Marker()});
    stats_.h2d_bytes += static_cast<double>(bytes);
    return true;
  }

  // Fetches ahead along the expected order while the window has room.
  void fetch_ahead() {
    while (next_fetch_ < order_.size()) {
      const std::size_t i = order_[next_fetch_];
      if (!updated_[i] && !slot_[i] && moment_bytes(states_[i]) > 0 && !fetch(i)) return;
      ++next_fetch_;
    }
  }

  // Parameter i's moments on the device for its update, the compute stream made to
  // wait for them: from the window (fetched now if not yet), the tail's buffer, or,
  // when the window is full of moments fetched for parameters whose gradients have not
  // come yet (hooks out of the expected order), temporary memory.
  struct DeviceMoments {
    Tensor m1, m2;
    enum class From { window, tail, temporary } from = From::window;
  };
  DeviceMoments moments_for(std::size_t i) {
    ParamState& s = states_[i];
    const auto compute = dev::current_stream(device_);
    DeviceMoments d;
    if (tail_ && i == *tail_ && tail_fetched_) {
      std::tie(d.m1, d.m2) = tail_views();
      d.from = DeviceMoments::From::tail;
      ready_[i].wait_on(compute);
      tail_fetched_ = false;
    } else if (slot_[i] || fetch(i)) {
      std::tie(d.m1, d.m2) = window_views(i, *slot_[i]);
      ready_[i].wait_on(compute);
    } else {
      d.from = DeviceMoments::From::temporary;
      written_[i].wait_on(compute);
      d.m1 = s.m1.to(device_, /*non_blocking=*/true);
      if (s.m2.defined()) d.m2 = s.m2.to(device_, /*non_blocking=*/true);
      stats_.h2d_bytes += static_cast<double>(moment_bytes(s));
    }
    return d;
  }

  // After parameter i's update and the write-back of its moments are queued:
  // temporary moments are kept until the write-back has read them; a window region
  // is free for reuse once it has.
  void release_moments(std::size_t i, const DeviceMoments& d) {
    if (d.from == DeviceMoments::From::temporary) {
      d.m1.record_stream(*d2h_);
      if (d.m2.defined()) d.m2.record_stream(*d2h_);
      return;
    }
    for (auto& e : window_entries_)
      if (e.param == i && !e.queued) {
        e.queued = true;
        e.free = written_[i];
        break;
      }
    slot_[i].reset();
  }

  // Updates parameter i with its moments from the window (queued work only).
  void update_one_streamed(std::size_t i) {
    torch::NoGradGuard ng;
    ParamState& s = states_[i];
    updated_[i] = 1;
    if (moment_bytes(s) == 0) {
      update_on_device(opt_, *s.p, s.master, s.grad, nullptr, nullptr, lr_, step_,
                       step_t_.defined() ? &step_t_ : nullptr);
      s.p->tensor.detach().copy_(s.master);
      return;
    }
    const DeviceMoments d = moments_for(i);
    Tensor m1 = d.m1, m2 = d.m2;
    update_on_device(opt_, *s.p, s.master, s.grad, &m1, m2.defined() ? &m2 : nullptr, lr_, step_,
                     step_t_.defined() ? &step_t_ : nullptr);
    s.p->tensor.detach().copy_(s.master);
    if (d.from == DeviceMoments::From::tail) {
      tail_write_back_ = true;  // queued by end_step()
      return;
    }
    write_back({i}, {d});
    release_moments(i, d);
  }

  // AdamW over the parameters of one update group (make_window_groups) in
  // multi-tensor launches: one norm, one update and one weight copy for the group
  // instead of each per parameter, and one write-back marker. The same arithmetic as
  // update_one_streamed per parameter (and as NoOffload's update), bit for bit.
  void update_group_streamed(std::vector<std::size_t> members) {
    torch::NoGradGuard ng;
    // In index order: the members are consecutive parameters (make_window_groups), so
    // their norms land in one slice of grad_norms_.
    std::sort(members.begin(), members.end());
    const auto n = members.size();
    TORCH_CHECK(members.back() - members.front() + 1 == n,
                "OptimizerOffload: an update group is not consecutive");  // whole groups only
    std::vector<Tensor> grads, masters, a, b, weights;
    std::vector<DeviceMoments> moments;
    for (auto i : members) {
      ParamState& s = states_[i];
      updated_[i] = 1;
      grads.push_back(s.grad);
      masters.push_back(s.master);
      weights.push_back(s.p->tensor.detach());
      moments.push_back(moments_for(i));
      a.push_back(moments.back().m1);
      b.push_back(moments.back().m2);
    }
    Tensor norms =
        grad_norms_.narrow(0, static_cast<std::int64_t>(members.front()), static_cast<std::int64_t>(n));
    at::stack_out(norms, at::_foreach_norm(grads, 2));
    std::vector<Tensor> steps(n, step_t_);
    at::_fused_adamw_(masters, grads, a, b, {}, steps, lr_, opt_.beta1, opt_.beta2, opt_.weight_decay,
                      opt_.eps, false, false);
    at::_foreach_copy_(weights, masters);
    write_back(members, moments);
    for (std::size_t k = 0; k < n; ++k) release_moments(members[k], moments[k]);
  }

  void record_grad_norm(std::size_t i) {
    Tensor slot = grad_norms_.select(0, static_cast<std::int64_t>(i));
    at::linalg_vector_norm_out(slot, states_[i].grad, 2);
  }

  // Queues the copies of the updated moments of `params` (on the device: `moments`,
  // in the same order) back to host memory after the compute stream's work so far,
  // with one marker for all of them.
  void write_back(const std::vector<std::size_t>& params, const std::vector<DeviceMoments>& moments) {
    dev::Marker::record(dev::current_stream(device_)).wait_on(d2h_);
    {
      dev::StreamScope on(d2h_);
      for (std::size_t k = 0; k < params.size(); ++k) {
        ParamState& s = states_[params[k]];
        copy_in_pieces(s.m1, moments[k].m1);
        if (moments[k].m2.defined()) copy_in_pieces(s.m2, moments[k].m2);
        stats_.d2h_bytes += static_cast<double>(moment_bytes(s));
      }
    }
    const dev::Marker done = dev::Marker::record(d2h_);
    for (auto i : params) written_[i] = done;
  }

  void flush_tail_write_back() {
    if (!tail_write_back_) return;
    tail_write_back_ = false;
    auto [m1, m2] = tail_views();
    write_back({*tail_}, {DeviceMoments{m1, m2, DeviceMoments::From::tail}});
  }

  // The order to fetch in: what the last step's hooks saw, then anything else.
  // With `split_tail`, the parameter whose gradient came last (the input embedding)
  // leaves the window's order for a buffer of its own (see tail_).
  void plan_order(bool split_tail) {
    std::vector<char> in(states_.size(), 0);
    order_ = seen_;
    tail_.reset();
    if (split_tail && !order_.empty() && moment_bytes(states_[order_.back()]) > 0) {
      tail_ = order_.back();
      order_.pop_back();
      const auto bytes = static_cast<std::int64_t>(moment_bytes(states_[*tail_]));
      if (!tail_buf_.defined() || tail_buf_.numel() != bytes) {
        sync_host();  // no copy may still read the old buffer when it is given back
        tail_buf_ = Tensor();
        tail_buf_ = torch::empty({bytes}, dev_.dtype(torch::kUInt8));
      }
      if (!tail_h2d_) tail_h2d_ = dev::side_stream(device_);
      in[*tail_] = 1;
    }
    for (auto i : order_) in[i] = 1;
    for (std::size_t i = 0; i < states_.size(); ++i)
      if (!in[i]) order_.push_back(i);
    next_fetch_ = 0;
    seen_.clear();
  }

  std::pair<Tensor, Tensor> tail_views() {
    ParamState& s = states_[*tail_];
    const auto n = s.master.numel();
    Tensor m1 = ring_view(tail_buf_, 0, torch::kFloat32, {n}).view(s.master.sizes());
    Tensor m2 = s.m2.defined() ? ring_view(tail_buf_, static_cast<std::size_t>(n) * 4, torch::kFloat32, {n})
                                     .view(s.master.sizes())
                               : Tensor();
    return {m1, m2};
  }

  // Queues the tail's moments into its buffer on its own stream, once its last
  // write-back (which read that buffer) has landed in host memory.
  void fetch_tail() {
    ParamState& s = states_[*tail_];
    written_[*tail_].wait_on(tail_h2d_);
    auto [m1, m2] = tail_views();
    {
      dev::StreamScope on(tail_h2d_);
      copy_in_pieces(m1, s.m1);
      if (m2.defined()) copy_in_pieces(m2, s.m2);
    }
    ready_[*tail_] = dev::Marker::record(tail_h2d_);
    tail_fetched_ = true;
    stats_.h2d_bytes += static_cast<double>(moment_bytes(s));
  }

  // After backward, with clipping: every update, in fetch order.
  void update_streamed() {
    ensure_window();
    std::fill(updated_.begin(), updated_.end(), 0);
    plan_order(/*split_tail=*/false);
    fetch_ahead();
    for (std::size_t k = 0; k < order_.size(); ++k) {
      update_one_streamed(order_[k]);
      fetch_ahead();
    }
  }

  static std::size_t moment_bytes(const ParamState& s) {
    return (s.m1.defined() ? s.m1.nbytes() : 0) + (s.m2.defined() ? s.m2.nbytes() : 0);
  }

  // --- FullOffload: the host pipeline -------------------------------------------------

  void start_host_pipeline() {
    const bool cuda = !device_.is_cpu();
    std::size_t largest = 0, total = 0;
    for (auto& s : states_) {
      largest = std::max(largest, s.p->tensor.nbytes());
      total += s.p->tensor.nbytes();
    }
    const auto bytes = torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(cuda);
    grad_ring_ = StagingRing(knobs_.ring_for(largest, total));
    grad_ring_buf_ = torch::empty({static_cast<std::int64_t>(grad_ring_.capacity())}, bytes);
    if (cuda) {
      d2h_ = dev::side_stream(device_);
      h2d_ = dev::side_stream(device_);
      up_ring_ = StagingRing(knobs_.ring_for(largest, total));
      up_ring_buf_ = torch::empty({static_cast<std::int64_t>(up_ring_.capacity())}, bytes);
    }
    if (tied_) {
      const Tensor& w = states_[*tied_].p->tensor;
      head_buf_ = torch::empty({static_cast<std::int64_t>(w.nbytes())}, bytes);
      head_slice_rows_ = std::max<std::int64_t>(1, kHeadSliceElements / w.size(1));
      lookup_done_rows_.assign(static_cast<std::size_t>(w.size(0)), 0);
    }

    // CPU threads: the cores this process may use, less one for the thread that
    // drives the GPU; bound to the GPU's NUMA node when it has one.
    cpu::ThreadPoolOptions po;
    const int usable = static_cast<int>(cpu::allowed_cpus().size());
    po.threads = knobs_.threads > 0 ? knobs_.threads : std::max(1, usable - 1);
    if (cuda) {
      const std::string bus = dev::pci_bus_id(device_);
      auto b = numa::find_gpu_binding(bus);
      if (!b.ok) throw run_error(fmt::format("offload = \"full\": {}", b.message));
      if (!b.message.empty()) std::fprintf(stderr, "primecfg-train: warning: %s\n", b.message.c_str());
      if (b.bind) {
        po.cpus = b.cpus;
        bind_cpus_ = b.cpus;
      }
    }
    pool_ = std::make_unique<cpu::ThreadPool>(po);
    if (knobs_.upload_thread)
      uploader_ = std::make_unique<TaskThread>(
          [this](std::exception_ptr e) {
            {
              std::lock_guard lk(mu_);
              if (!error_) error_ = e;
            }
            cv_.notify_all();
          },
          [this] {
            if (!bind_cpus_.empty()) (void)numa::bind_current_thread(bind_cpus_);  // the worker warns
          });
    worker_ = std::thread([this] { worker_main(); });
  }

  // What the worker needs of the step a job belongs to. With deferred updates the
  // worker still runs step s while the main thread begins step s + 1, so a job
  // carries its step's context instead of reading the current one.
  struct StepContext {
    double lr = 0;
    std::int64_t step = 0;
    bool single_micro = true;
    std::vector<std::int64_t> batch_rows;  // tied split: sorted distinct input ids of the last micro-batch
    std::vector<char> in_batch;            // per embedding row: is it in batch_rows
    Tensor batch_rows_dev;                 // batch_rows on the device
  };
  // What a staged gradient holds.
  enum class Part {
    whole,       // the parameter's gradient
    batch_rows,  // tied embedding: the final gradient of the batch's rows only (the head share: HeadShare)
    no_grad,     // nothing staged: the parameter got no gradient in the last micro-batch
  };

  // The hook's side of FullOffload: stage the gradient and queue it for the worker.
  void submit_gradient(std::size_t i, const Tensor& g) {
    if (single_micro_) {
      // The norm of this step's gradient, on the device, while it is still there.
      Tensor slot = grad_norms_.select(0, static_cast<std::int64_t>(i));
      at::linalg_vector_norm_out(slot, g, 2, std::nullopt, false, torch::kFloat32);
    }
    if (tied_ && i == *tied_ && head_submitted_) {
      // The other rows were updated from the head's share: only the batch's rows move.
      head_submitted_ = false;
      stage(i, g.index_select(0, ctx_->batch_rows_dev), Part::batch_rows);
      return;
    }
    stage(i, g, Part::whole);
  }

  // Transformer::HeadGradHook: rows [first_row, first_row + rows.size(0)) of the LM
  // head's share of the tied embedding's gradient, copied into head_buf_ and handed to
  // the worker as part of this step's HeadShare. They come in row order: all at once
  // as backward starts, or chunk by chunk during the loss (LossChunks::vocabulary).
  void submit_head_rows(std::int64_t first_row, const Tensor& rows) {
    if (first_row == 0) {
      {
        // The last step's share is done: the forward waited for it at the LM head.
        std::unique_lock lk(mu_);
        if (!cv_.wait_for(lk, knobs_.timeout, [&] { return !head_.active || error_; }))
          throw run_error(
              diagnose_locked(fmt::format("timed out after {} s waiting for the last step's update of {}",
                                          knobs_.timeout.count() / 1000.0, states_[*tied_].p->name)));
        if (error_) std::rethrow_exception(error_);
      }
      // The worker is not in a head share now: nothing reads these.
      std::fill(lookup_done_rows_.begin(), lookup_done_rows_.end(), 0);
      {
        std::lock_guard lk(mu_);
        head_ = HeadShare{};
        head_.ctx = ctx_;
        head_.active = true;
        ++submitted_;
      }
      head_submitted_ = true;
    }
    const auto row_bytes = static_cast<std::size_t>(rows.size(1) * rows.element_size());
    dev::Marker ready = copy_to_host(ring_view(head_buf_, static_cast<std::size_t>(first_row) * row_bytes,
                                               rows.scalar_type(), rows.sizes()),
                                     rows);
    {
      std::lock_guard lk(mu_);
      head_.parts.push_back({first_row + rows.size(0), std::move(ready)});
      stats_.d2h_bytes += static_cast<double>(rows.nbytes());
    }
    cv_.notify_all();
  }

  // Called with the next step's input ids while the last step's head share may still
  // be running: the rows its embedding lookup reads are updated before the rest.
  void request_lookup_rows(const std::vector<std::int64_t>& ids) {
    {
      std::lock_guard lk(mu_);
      if (!head_.active) return;
      const StepContext& c = *head_.ctx;
      const auto vocab = static_cast<std::int64_t>(c.in_batch.size());
      std::vector<char> want(c.in_batch.size(), 0);
      for (auto id : ids)  // rows below next_row are done, or in the slice running now
        if (id >= head_.next_row && id < vocab && !c.in_batch[static_cast<std::size_t>(id)])
          want[static_cast<std::size_t>(id)] = 1;
      std::vector<std::int64_t> rows;
      for (std::int64_t r = head_.next_row; r < vocab; ++r)
        if (want[static_cast<std::size_t>(r)]) rows.push_back(r);
      stats_.lookup_rows = static_cast<double>(rows.size());
      head_.lookup = std::move(rows);
      head_.lookup_requested = true;
    }
    cv_.notify_all();
  }

  // Queues the copy of the device gradient g into pinned `staged` on the d2h stream,
  // after the compute stream's work so far; the marker says when it has landed.
  dev::Marker copy_to_host(const Tensor& staged, const Tensor& g) {
    if (!d2h_) {
      staged.copy_(g);
      return {};
    }
    dev::Marker::record(dev::current_stream(device_)).wait_on(d2h_);
    {
      dev::StreamScope on(d2h_);
      staged.copy_(g, /*non_blocking=*/true);
    }
    g.record_stream(*d2h_);  // the caching allocator keeps g until the copy ran
    return dev::Marker::record(d2h_);
  }

  // Copies g into the staging ring (copy_to_host) and queues it for the worker.
  void stage(std::size_t i, const Tensor& g, Part part) {
    const std::size_t bytes = g.nbytes();
    StagingRing::Range r;
    const auto t_ring = std::chrono::steady_clock::now();
    {
      std::unique_lock lk(mu_);
      const auto deadline = std::chrono::steady_clock::now() + knobs_.timeout;
      for (;;) {
        if (error_) std::rethrow_exception(error_);
        if (auto got = grad_ring_.try_acquire(bytes)) {
          r = *got;
          break;
        }
        if (std::chrono::steady_clock::now() >= deadline)
          throw run_error(diagnose_locked(
              fmt::format("timed out after {} s waiting for room for the gradient of {} ({} bytes)",
                          knobs_.timeout.count() / 1000.0, states_[i].p->name, bytes)));
        ++ring_waiters_;  // the worker frees the oldest ranges first meanwhile
        cv_.wait_until(lk, deadline);
        --ring_waiters_;
      }
      stats_.ring_wait_s += seconds_since(t_ring);
      stats_.d2h_bytes += static_cast<double>(bytes);
    }
    dev::Marker ready = copy_to_host(ring_view(grad_ring_buf_, r.offset, g.scalar_type(), g.sizes()), g);
    if (last_micro_) got_last_grad_[i] = 1;
    {
      std::lock_guard lk(mu_);
      queue_.push_back(Job{i, r, std::move(ready), last_micro_, part, ctx_, true});
      ++submitted_;
    }
    cv_.notify_all();
  }

  static const char* part_name(Part p) {
    switch (p) {
      case Part::whole:
        return "whole";
      case Part::batch_rows:
        return "batch rows";
      case Part::no_grad:
        return "no gradient";
    }
    return "?";
  }

  struct Job {
    std::size_t param = 0;
    StagingRing::Range slot;
    dev::Marker ready;
    bool last = false;
    Part part = Part::whole;
    std::shared_ptr<const StepContext> ctx;
    bool has_slot = true;  // holds a range of the staging ring
  };

  // What the worker runs next (next_work_locked).
  struct Work {
    enum class Kind { job, head_slice, head_lookup, head_wait } kind = Kind::job;
    Job job;                           // job
    std::int64_t first = 0, last = 0;  // head_slice: rows [first, last)
    std::vector<std::int64_t> rows;    // head_lookup
    dev::Marker head_ready;            // the other kinds: the copy of the head share's rows they read
  };

  void worker_main() {
    if (!bind_cpus_.empty()) {
      std::string err = numa::bind_current_thread(bind_cpus_);
      if (!err.empty()) std::fprintf(stderr, "primecfg-train: warning: %s\n", err.c_str());
    }
    for (;;) {
      Work w;
      bool skip = false;
      std::shared_ptr<const StepContext> head_ctx;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !queue_.empty() || head_runnable_locked(); });
        if (stop_) return;
        w = next_work_locked();
        head_ctx = head_.ctx;
        busy_ = static_cast<std::ptrdiff_t>(w.kind == Work::Kind::job ? w.job.param : *tied_);
        skip = error_ != nullptr;
      }
      const StepContext& c = w.kind == Work::Kind::job ? *w.job.ctx : *head_ctx;
      try {
        const auto t_wait = std::chrono::steady_clock::now();
        const auto h_wait = HostTrace::now();
        (w.kind == Work::Kind::job ? w.job.ready : w.head_ready).synchronize();
        const double waited = seconds_since(t_wait);
        {
          std::lock_guard lk(mu_);
          stats_.copy_wait_s += waited;
        }
        const auto h_run = HostTrace::now();
        if (!skip) {
          if (w.kind == Work::Kind::job) consume(w.job);
          if (w.kind == Work::Kind::head_slice) update_head_slice(c, w.first, w.last);
          if (w.kind == Work::Kind::head_lookup) {
            update_embedding_rows(head_buf_view(), true, w.rows, Tensor(), c);
            for (auto r : w.rows) lookup_done_rows_[static_cast<std::size_t>(r)] = 1;
          }
        }
        if (trace_.on()) {
          trace_.span("worker", "copy wait", h_wait, h_run, c.step);
          if (w.kind != Work::Kind::head_wait)
            trace_.span("worker", work_name(w), h_run, HostTrace::now(), c.step);
        }
      } catch (...) {
        std::lock_guard lk(mu_);
        if (!error_) error_ = std::current_exception();
      }
      {
        std::lock_guard lk(mu_);
        // The staged gradient was read: its range may take the next one now.
        if (w.kind == Work::Kind::job && w.job.has_slot) release_in_order_locked(w.job.slot);
        busy_ = -1;
      }
      // The work counts as done (and the forward may read its weights) once its
      // upload is queued: with an upload thread, after it in that thread's queue.
      // Work that uploads nothing goes there too, as done must also mean that the
      // uploads of the work before it are queued (an empty lookup job marks the rows
      // of the slice before it as readable).
      auto finish = [this, step = c.step, w = std::move(w)] {
        {
          std::lock_guard lk(mu_);
          finish_work_locked(w, step);
        }
        cv_.notify_all();
      };
      if (uploader_)
        uploader_->post(std::move(finish));
      else
        finish();
    }
  }

  // The worker's choice, in this order: the rows the next forward's embedding lookup
  // needs; a staged gradient whose copy has landed (or any, when the head share has
  // nothing to run); a slice of the head share; waiting for the head share's copy.
  // The head share so fills the time the worker would spend waiting for backward,
  // and what is left of it runs after every other update, since only the LM head at
  // the end of the next forward needs it.
  Work next_work_locked() {
    Work w;
    const bool runnable = head_runnable_locked();
    const auto* part = runnable ? head_.part_of(head_.next_row) : nullptr;
    const bool head_ready = part && part->ready.reached();
    // The lookup's rows may lie anywhere: it waits for the whole share (the copies
    // land in order, so for the last one).
    if (runnable && head_.lookup && head_.copied_rows() == states_[*tied_].p->tensor.size(0) &&
        head_.parts.back().ready.reached()) {
      w.kind = Work::Kind::head_lookup;
      w.rows = std::move(*head_.lookup);
      w.head_ready = head_.parts.back().ready;
      head_.lookup.reset();
      return w;
    }
    const bool head_first = !knobs_.head_last && head_ready;
    if (!queue_.empty() && !head_first) {
      // Copies land in the order they were queued: the landed jobs are a prefix.
      while (landed_ < queue_.size() && queue_[landed_].ready.reached()) ++landed_;
      if (landed_ > 0 || !head_ready) {
        const std::size_t k = landed_ > 0 ? earliest_needed_locked() : 0;
        w.job = std::move(queue_[k]);
        queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(k));
        if (k < landed_) --landed_;
        return w;
      }
    }
    if (head_ready) {  // a slice within the copied part
      w.kind = Work::Kind::head_slice;
      w.first = head_.next_row;
      w.last = std::min(part->end_row, w.first + head_slice_rows_);
      w.head_ready = part->ready;
      head_.next_row = w.last;
      return w;
    }
    w.kind = Work::Kind::head_wait;
    if (part) w.head_ready = part->ready;
    return w;
  }

  // Whether the head share may run. Only rows whose copy is queued can run. Once its
  // last slice is handed out it is not runnable: that slice still ends it (on the
  // upload thread, after its upload). Tests hold it back (RunOptions) until the next
  // forward asks for its lookup rows (then only those run) and then until the loss
  // asks for its rows, so that both of those waits matter every step.
  bool head_runnable_locked() const {
    const bool rows_left = head_.active && head_.next_row < head_.copied_rows();
    if (!rows_left || !knobs_.hold_head || draining_) return rows_left;
    return (head_.lookup && head_.lookup_requested) || head_.rows_requested;
  }

  // Among the landed jobs, the one the next forward needs first (earliest deadline
  // first: the embedding lookup, then block by block, then the final norm). Backward
  // hands gradients over from the last block down, so the blocks left when it ends are
  // the top ones, which the next forward reaches last; in arrival order they would be
  // the first blocks, and the forward would wait at each of them. The oldest job goes
  // first when a hook waits for staging room (ranges are freed in order), with several
  // micro-batches (an accumulation must precede its parameter's update), and with
  // PRIMECFG_OFFLOAD_EDF=0.
  std::size_t earliest_needed_locked() const {
    if (!knobs_.edf || ring_waiters_ > 0) return 0;
    std::size_t best = 0;
    for (std::size_t k = 0; k < landed_; ++k) {
      const Job& j = queue_[k];
      if (!j.ctx->single_micro) return 0;
      if (needed_at(j) < needed_at(queue_[best])) best = k;
    }
    return best;
  }
  // Where the forward first reads a job's parameter: -1 the embedding lookup, b block
  // b, the layer count the final norm and LM head.
  int needed_at(const Job& j) const {
    if (j.part == Part::batch_rows) return -1;
    return needed_at_[j.param];
  }

  void finish_work_locked(const Work& w, std::int64_t step) {
    switch (w.kind) {
      case Work::Kind::job: {
        const Job& j = w.job;  // its staged gradient went back in worker_main
        if (j.last) {
          if (j.part == Part::batch_rows) {
            tied_batch_done_step_ = step;
            settle_tied_locked(step);
          } else {
            done_step_[j.param] = step;
            if (tied_ && j.param == *tied_) lookup_done_step_ = step;
          }
        }
        ++processed_;
        return;
      }
      case Work::Kind::head_slice:
        head_.done_row = w.last;  // slices are handed out and finished in row order
        if (w.last < states_[*tied_].p->tensor.size(0) && !error_) return;
        head_.active = false;
        tied_head_done_step_ = step;
        settle_tied_locked(step);
        ++processed_;
        return;
      case Work::Kind::head_lookup:
        head_.lookup_served_step = step;
        settle_tied_locked(step);
        return;
      case Work::Kind::head_wait:
        if (error_) {  // the copy failed: the share will not run
          head_.active = false;
          ++processed_;
        }
        return;
    }
  }

  // The split tied embedding is done for `step` when its batch rows and its head
  // share are; the next forward's lookup may read it once the batch rows and the
  // lookup's rows (or the whole share) are.
  void settle_tied_locked(std::int64_t step) {
    if (tied_batch_done_step_ < step) return;
    if (tied_head_done_step_ >= step) {
      done_step_[*tied_] = step;
      lookup_done_step_ = step;
    } else if (head_.lookup_served_step >= step) {
      lookup_done_step_ = step;
    }
  }

  std::string work_name(const Work& w) const {
    if (w.kind == Work::Kind::job)
      return fmt::format("{} ({})", states_[w.job.param].p->name, part_name(w.job.part));
    const std::string& name = states_[*tied_].p->name;  // the other kinds exist only with tied_
    switch (w.kind) {
      case Work::Kind::job:
        break;
      case Work::Kind::head_slice:
        return fmt::format("{} (head share, rows {}-{})", name, w.first, w.last);
      case Work::Kind::head_lookup:
        return fmt::format("{} (head share, {} rows of the next lookup)", name, w.rows.size());
      case Work::Kind::head_wait:
        return "head share copy wait";
    }
    return "?";
  }

  // Ranges of the staging ring go back in allocation order; one whose job ran out of
  // order (deferred jobs run in forward order) waits in released_ for the older ones.
  void release_in_order_locked(const StagingRing::Range& r) {
    released_.insert(r.id);
    while (auto oldest = grad_ring_.oldest()) {
      if (!released_.erase(oldest->id)) break;
      grad_ring_.release(*oldest);
    }
  }

  // On the worker: one staged gradient. Earlier micro-batches accumulate into the
  // FP32 host accumulator; on the last one the parameter is updated right away.
  void consume(const Job& job) {
    torch::NoGradGuard ng;
    const StepContext& c = *job.ctx;
    ParamState& s = states_[job.param];
    const Tensor& w = s.p->tensor;
    if (job.part == Part::no_grad) {
      // What earlier micro-batches accumulated, else zero.
      if (!s.grad.defined()) s.grad = torch::empty(w.sizes(), torch::kFloat32);
      if (!acc_valid_[job.param]) s.grad.zero_();
      acc_valid_[job.param] = 0;
      if (!c.single_micro) gsq_host_ += s.grad.square().sum().item<double>();
      update_host(job.param, s.grad, c);
      return;
    }
    if (job.part == Part::batch_rows) {
      const std::array<std::int64_t, 2> rows{static_cast<std::int64_t>(c.batch_rows.size()), w.size(1)};
      update_embedding_rows(ring_view(grad_ring_buf_, job.slot.offset, w.scalar_type(), rows), false,
                            c.batch_rows, c.batch_rows_dev, c);
      return;
    }
    Tensor staged = ring_view(grad_ring_buf_, job.slot.offset, w.scalar_type(), w.sizes());
    if (!job.last) {
      if (!s.grad.defined()) s.grad = torch::empty(w.sizes(), torch::kFloat32);
      if (acc_valid_[job.param])
        s.grad.add_(staged);
      else
        s.grad.copy_(staged);
      acc_valid_[job.param] = 1;
      return;
    }
    Tensor grad = staged;
    if (acc_valid_[job.param]) {
      s.grad.add_(staged);
      grad = s.grad;
      acc_valid_[job.param] = 0;  // the next step starts afresh
    }
    if (!c.single_micro) gsq_host_ += grad.to(torch::kFloat32).square().sum().item<double>();
    update_host(job.param, grad, c);
  }

  // Runs the CPU kernel on one parameter and queues its new weights for the device.
  void update_host(std::size_t i, const Tensor& grad, const StepContext& c) {
    ParamState& s = states_[i];
    Tensor w = s.p->tensor.detach();
    const bool bf16 = w.scalar_type() == torch::kBFloat16;
    Tensor out;
    if (bf16) out = (w.is_cpu() && w.is_contiguous()) ? w : upload_slot(w);
    const auto t_kernel = std::chrono::steady_clock::now();
    update_on_cpu_kernel(opt_, *pool_, s.master, grad, s.m1.defined() ? &s.m1 : nullptr,
                         s.m2.defined() ? &s.m2 : nullptr,
                         bf16 ? reinterpret_cast<std::uint16_t*>(out.data_ptr()) : nullptr, c.lr, c.step);
    count_update(t_kernel, w.is_cpu() ? 0 : w.nbytes());
    if (w.is_cpu() && bf16) return;  // the kernel wrote the weights
    queue_upload([w, from = bf16 ? out : s.master] { w.copy_(from, /*non_blocking=*/true); },
                 bf16 && !w.is_cpu());
  }

  void count_update(std::chrono::steady_clock::time_point t_kernel, std::size_t upload_bytes) {
    const double kernel_s = seconds_since(t_kernel);
    if (trace_.on()) {  // the kernel inside its job's span
      const auto end = HostTrace::now();
      trace_.span("worker", "kernel",
                  end - std::chrono::duration_cast<HostTrace::clock::duration>(
                            std::chrono::duration<double>(kernel_s)),
                  end, 0);
    }
    std::lock_guard lk(mu_);
    stats_.cpu_update_s += kernel_s;
    stats_.h2d_bytes += static_cast<double>(upload_bytes);
  }

  // Queues `copy` (new weights into the model's tensor) on the h2d stream: on the
  // upload thread when there is one, else right here. `used_slot`: it reads a slot
  // of the upload ring. (On the CPU the copy is a plain copy.)
  void queue_upload(TaskThread::Task copy, bool used_slot) {
    auto issue = [this, copy = std::move(copy), used_slot] {
      torch::NoGradGuard ng;
      const auto h0 = HostTrace::now();
      try {
        dev::StreamScope on(h2d_);
        copy();
      } catch (...) {
        note_upload(used_slot, dev::Marker());  // keep the ring's count; the error stops the run
        throw;
      }
      note_upload(used_slot, dev::Marker::record(h2d_));
      if (uploader_) trace_.span("upload", "upload", h0, HostTrace::now(), 0);
    };
    if (!uploader_) return issue();
    uploader_->post(std::move(issue));
  }

  // After an upload was queued on h2d_ (`done` marks it): its slot of the upload ring
  // (when it used one) is free once it ran, and the compute stream will wait for it.
  void note_upload(bool used_slot, const dev::Marker& done) {
    if (used_slot) {
      {
        std::lock_guard lk(up_mu_);
        up_free_.push_back(done);
      }
      up_cv_.notify_all();
    }
    std::lock_guard lk(mu_);
    last_upload_ = done;
  }

  // A pinned bf16 buffer for w's new weights; waits for old uploads to finish
  // when the ring is full (they depend on nothing but the copy engine).
  Tensor upload_slot(const Tensor& w) { return upload_slot(w.scalar_type(), w.sizes()); }
  Tensor upload_slot(torch::ScalarType dtype, torch::IntArrayRef sizes) {
    std::int64_t n = 1;
    for (auto d : sizes) n *= d;
    const auto bytes = static_cast<std::size_t>(n) * c10::elementSize(dtype);
    std::optional<StagingRing::Range> r;
    const auto t_wait = std::chrono::steady_clock::now();
    const auto h_wait = HostTrace::now();
    bool waited = false;
    while (!(r = up_ring_.try_acquire(bytes))) {
      dev::Marker oldest;  // the upload that reads the oldest slot
      {
        std::unique_lock lk(up_mu_);
        waited = waited || up_free_.empty();
        if (!up_cv_.wait_for(lk, knobs_.timeout, [&] { return !up_free_.empty(); }))
          throw run_error(
              fmt::format("offload = \"full\": timed out after {} s waiting for the upload thread",
                          knobs_.timeout.count() / 1000.0));
        oldest = std::move(up_free_.front());
        up_free_.pop_front();
      }
      waited = waited || !oldest.reached();
      oldest.synchronize();
      up_ring_.release(*up_ring_.oldest());
    }
    if (waited) {
      trace_.span("worker", "upload slot wait", h_wait, HostTrace::now(), 0);
      std::lock_guard lk(mu_);
      stats_.upload_wait_s += seconds_since(t_wait);
    }
    return ring_view(up_ring_buf_, r->offset, dtype, sizes);
  }

  // The tied embedding's update comes in parts (see HeadShare); rows are independent
  // in an element-wise optimizer, so the parts give the same bits as one update of
  // the whole matrix.
  //
  // Runs `n` elements of it: master and moments at element `at`, the gradient at
  // element `grad_at` of `grad`, the bf16 copy at element `out_at` of `out16`.
  struct EmbeddingSpans {
    const OptSettings& opt;
    const StepContext& c;
    float *master, *m1, *m2;
    const char* g;
    std::int64_t g_elem;
    bool g16;
    std::uint16_t* out16;
    void operator()(std::int64_t at, std::int64_t grad_at, std::int64_t out_at, std::int64_t n) const {
      update_span_on_cpu(opt, master + at, m1 ? m1 + at : nullptr, m2 ? m2 + at : nullptr,
                         g + grad_at * g_elem, g16, out16 ? out16 + out_at : nullptr, n, c.lr, c.step);
    }
  };
  EmbeddingSpans embedding_spans(const StepContext& c, const Tensor& grad, std::uint16_t* out16) {
    ParamState& s = states_[*tied_];
    return EmbeddingSpans{opt_,
                          c,
                          s.master.data_ptr<float>(),
                          s.m1.defined() ? s.m1.data_ptr<float>() : nullptr,
                          s.m2.defined() ? s.m2.data_ptr<float>() : nullptr,
                          static_cast<const char*>(grad.data_ptr()),
                          static_cast<std::int64_t>(grad.element_size()),
                          grad.scalar_type() == torch::kBFloat16,
                          out16};
  }
  Tensor head_buf_view() const {
    const Tensor& w = states_[*tied_].p->tensor;
    return ring_view(head_buf_, 0, w.scalar_type(), w.sizes());
  }

  // Updates the listed rows of the tied embedding and uploads them: the batch's rows
  // from their final gradient (`grad` [rows, D], row k of it for rows[k]), or rows of
  // the head share (`grad_by_row`: `grad` [vocab, D]) that the next lookup reads.
  void update_embedding_rows(const Tensor& grad, bool grad_by_row, const std::vector<std::int64_t>& rows,
                             Tensor rows_dev, const StepContext& c) {
    if (rows.empty()) return;
    ParamState& s = states_[*tied_];
    Tensor w = s.p->tensor.detach();
    const bool bf16 = w.scalar_type() == torch::kBFloat16;
    const bool direct = w.is_cpu() && w.is_contiguous();  // bf16 rows written straight into w
    const std::int64_t dim = w.size(1);
    const auto k = static_cast<std::int64_t>(rows.size());
    Tensor out;
    if (bf16 && !direct) out = upload_slot(w.scalar_type(), {k, dim});
    const EmbeddingSpans run = embedding_spans(
        c, grad, bf16 ? reinterpret_cast<std::uint16_t*>((direct ? w : out).data_ptr()) : nullptr);
    const auto t_kernel = std::chrono::steady_clock::now();
    pool_->parallel_for(k, std::max<std::int64_t>(1, cpu::kDefaultGrain / dim),
                        [&](std::int64_t b, std::int64_t e) {
                          for (std::int64_t j = b; j < e; ++j) {
                            const std::int64_t at = rows[static_cast<std::size_t>(j)] * dim;
                            run(at, grad_by_row ? at : j * dim, direct ? at : j * dim, dim);
                          }
                        });
    count_update(t_kernel, w.is_cpu() ? 0 : (bf16 ? out : s.master).nbytes());
    if (w.is_cpu() && bf16) return;  // the kernel wrote the rows
    if (!bf16) {
      // FP32 weights (tests): the whole master; this upload follows the earlier ones.
      queue_upload([w, master = s.master] { w.copy_(master, /*non_blocking=*/true); }, false);
      return;
    }
    queue_upload(
        [this, w, out, rows_dev, ids = rows_dev.defined() ? std::vector<std::int64_t>{} : rows, k]() mutable {
          if (!rows_dev.defined()) rows_dev = to_device(ids, {k}, device_);  // queued on h2d_
          w.index_copy_(0, rows_dev, out.to(device_, /*non_blocking=*/true));
          rows_dev.record_stream(*h2d_);
        },
        true);
  }

  // Rows [first, last) of the tied embedding from the head share: each row outside the
  // step's batch and not yet updated for the lookup is updated; then the whole range
  // is uploaded, the other rows as the bf16 of their masters (the bits the kernel
  // wrote, or will write and upload later for batch rows not done yet).
  void update_head_slice(const StepContext& c, std::int64_t first, std::int64_t last) {
    ParamState& s = states_[*tied_];
    Tensor w = s.p->tensor.detach();
    const bool bf16 = w.scalar_type() == torch::kBFloat16;
    const bool direct = w.is_cpu() && w.is_contiguous();
    const std::int64_t dim = w.size(1), rows = last - first;
    Tensor out;
    if (bf16 && !direct) out = upload_slot(w.scalar_type(), {rows, dim});
    auto* out16 = bf16 ? reinterpret_cast<std::uint16_t*>((direct ? w : out).data_ptr()) : nullptr;
    const EmbeddingSpans run = embedding_spans(c, head_buf_view(), out16);
    const float* master = s.master.data_ptr<float>();
    auto skip = [&](std::int64_t r) {
      return c.in_batch[static_cast<std::size_t>(r)] || lookup_done_rows_[static_cast<std::size_t>(r)];
    };
    const auto t_kernel = std::chrono::steady_clock::now();
    pool_->parallel_for(rows, std::max<std::int64_t>(1, cpu::kDefaultGrain / dim),
                        [&](std::int64_t b, std::int64_t e) {
                          for (std::int64_t r = first + b; r < first + e;) {
                            if (skip(r)) {
                              if (out16 && !direct)
                                cpu::float_to_bf16(master + r * dim, out16 + (r - first) * dim, dim);
                              ++r;
                              continue;
                            }
                            const std::int64_t from = r;
                            while (r < first + e && !skip(r)) ++r;
                            run(from * dim, from * dim, (direct ? from : from - first) * dim,
                                (r - from) * dim);  // out: rows [first, last)
                          }
                        });
    count_update(t_kernel, w.is_cpu() ? 0 : static_cast<std::size_t>(rows * dim) * w.element_size());
    if (w.is_cpu() && bf16) return;  // the kernel wrote the rows
    queue_upload(
        [to = w.narrow(0, first, rows), from = bf16 ? out : s.master.narrow(0, first, rows)] {
          to.copy_(from, /*non_blocking=*/true);
        },
        bf16 && !w.is_cpu());
  }

  std::string diagnose_locked(const std::string& what) const {
    std::string busy = busy_ >= 0 ? states_[static_cast<std::size_t>(busy_)].p->name : "nothing";
    std::string head;
    if (head_.active)
      head = fmt::format("; head share of step {} at row {} of {}", head_.ctx->step, head_.next_row,
                         states_[*tied_].p->tensor.size(0));
    return fmt::format(
        "offload = \"full\" pipeline: {}; gradients queued {}, processed {}, waiting {}; staging ring "
        "{} of {} bytes in use in {} ranges; worker busy with {}{}",
        what, submitted_, processed_, queue_.size(), grad_ring_.in_use(), grad_ring_.capacity(),
        grad_ring_.live(), busy, head);
  }

  // End of backward. Parameters without a gradient in the last micro-batch are
  // queued as jobs of their own. Then either every update finishes here and the
  // compute stream waits for the last upload, or (defer) the updates still queued
  // run beside the next forward, in the order it needs the weights, and the forward
  // waits block by block (wait_for_block).
  double finish_host_step() {
    const auto t_drain = std::chrono::steady_clock::now();
    if (head_submitted_)
      throw run_error(
          fmt::format("offload = \"full\": the gradient of {} ended at the LM head's share; the "
                      "input embedding's share never arrived",
                      states_[*tied_].p->name));
    const bool defer = *knobs_.defer && ctx_->single_micro;
    {
      std::lock_guard lk(mu_);
      for (std::size_t i = 0; i < states_.size(); ++i)
        if (!got_last_grad_[i]) {
          queue_.push_back(Job{i, StagingRing::Range{}, dev::Marker(), true, Part::no_grad, ctx_, false});
          ++submitted_;
        }
      if (defer) {
        // Backward queued the first layers' gradients last, and the next forward needs
        // them first: in first-in-first-out order (PRIMECFG_OFFLOAD_EDF=0) run what is
        // left in reverse. (The head share of a split embedding runs after all of it:
        // next_work_locked.)
        if (!knobs_.edf) {
          std::reverse(queue_.begin(), queue_.end());
          landed_ = 0;
        }
        pending_step_ = ctx_->step;
      }
    }
    cv_.notify_all();
    if (defer) {
      // One micro-batch: the whole norm was summed on the device, in the hooks.
      const double norm = std::sqrt(device_norm_sq());
      std::lock_guard lk(mu_);
      stats_.drain_s = seconds_since(t_drain);
      return norm;
    }
    finish_pending();
    const double norm_sq = gsq_host_ + (ctx_->single_micro ? device_norm_sq() : 0.0);
    std::lock_guard lk(mu_);
    stats_.drain_s = seconds_since(t_drain);
    return std::sqrt(norm_sq);
  }

  // The squared global norm of the norms the hooks wrote (FP32 per parameter, summed
  // in FP64, as NoOffload does).
  double device_norm_sq() const { return grad_norms_.to(torch::kFloat64).square().sum().item<double>(); }

  // Waits until the worker has run every queued job; the compute stream then waits
  // for the last upload. A no-op except for FullOffload.
  void finish_pending() {
    if constexpr (kHostUpdate) {
      if (!worker_.joinable()) return;
      dev::Marker last;
      {
        std::unique_lock lk(mu_);
        draining_ = true;
        cv_.notify_all();
        const bool done =
            cv_.wait_for(lk, knobs_.timeout, [&] { return processed_ == submitted_ || error_; });
        draining_ = false;
        if (error_) std::rethrow_exception(error_);
        if (!done)
          throw run_error(diagnose_locked(fmt::format("timed out after {} s waiting for the CPU optimizer",
                                                      knobs_.timeout.count() / 1000.0)));
        last = std::move(last_upload_);
        last_upload_ = dev::Marker();
        pending_step_ = 0;
      }
      last.wait_on(dev::current_stream(device_));
    }
  }

  // Transformer::BlockHook: before the forward uses the weights of `block` (-1: the
  // embedding lookup; the layer count: the final norm and the LM head), wait on the
  // host until the deferred updates of those parameters are queued, then make the
  // compute stream wait for their uploads.
  void wait_for_block(int block) {
    if constexpr (kHostUpdate) {
      const std::vector<std::size_t>& group = block < 0 ? lookup_group_
                                              : static_cast<std::size_t>(block) < block_groups_.size()
                                                  ? block_groups_[static_cast<std::size_t>(block)]
                                                  : head_group_;
      const auto t_wait = std::chrono::steady_clock::now();
      const auto h_wait = HostTrace::now();
      dev::Marker uploaded;
      {
        std::unique_lock lk(mu_);
        if (!pending_step_) return;
        auto ready = [&] {
          if (error_) return true;
          for (auto i : group) {
            // A split tied embedding: the lookup reads only the batch's rows; the LM head
            // waits for its rows in the loss (wait_for_head_rows).
            if (block >= 0 && tied_ && i == *tied_) continue;
            const bool lookup_of_tied = block < 0 && tied_ && i == *tied_;
            if ((lookup_of_tied ? lookup_done_step_ : done_step_[i]) < pending_step_) return false;
          }
          return true;
        };
        if (!cv_.wait_for(lk, knobs_.timeout, ready))
          throw run_error(diagnose_locked(fmt::format(
              "timed out after {} s waiting for the updates the forward pass needs before block {}",
              knobs_.timeout.count() / 1000.0, block)));
        if (error_) std::rethrow_exception(error_);
        uploaded = last_upload_;  // the h2d stream is one queue: this covers the group's uploads
        if (trace_.on())
          trace_.span("main", fmt::format("wait for block {}", block), h_wait, HostTrace::now(),
                      pending_step_);
        if (&group == &head_group_ && !tied_) pending_step_ = 0;  // every parameter is in some group
        stats_.defer_wait_s += seconds_since(t_wait);
      }
      uploaded.wait_on(dev::current_stream(device_));
    } else {
      (void)block;
    }
  }

  // Transformer::HeadRowsHook: before the loss reads rows [first, end) of a split tied
  // embedding, wait until the last step's deferred update of them is queued: its batch
  // rows, and the head share's slices (done in row order) up to `end`. With vocabulary
  // chunks the rest of the head share so runs beside the loss's first pass.
  void wait_for_head_rows(std::int64_t first, std::int64_t end) {
    if constexpr (kHostUpdate) {
      if (!tied_) return;  // not split: the LM head is one job of the head group
      const auto t_wait = std::chrono::steady_clock::now();
      const auto h_wait = HostTrace::now();
      dev::Marker uploaded;
      {
        std::unique_lock lk(mu_);
        if (!pending_step_) return;
        if (head_.active && !head_.rows_requested) {
          head_.rows_requested = true;
          cv_.notify_all();
        }
        auto ready = [&] {
          if (error_ || done_step_[*tied_] >= pending_step_) return true;
          return tied_batch_done_step_ >= pending_step_ && head_.ctx && head_.ctx->step == pending_step_ &&
                 head_.done_row >= end;
        };
        if (!cv_.wait_for(lk, knobs_.timeout, ready))
          throw run_error(diagnose_locked(
              fmt::format("timed out after {} s waiting for the updates of rows {} to {} of the LM head",
                          knobs_.timeout.count() / 1000.0, first, end)));
        if (error_) std::rethrow_exception(error_);
        uploaded = last_upload_;
        if (trace_.on())
          trace_.span("main",
                      fmt::format("wait for block {} (LM head rows {}-{})", block_groups_.size(), first, end),
                      h_wait, HostTrace::now(), pending_step_);
        if (end >= states_[*tied_].p->tensor.size(0)) pending_step_ = 0;  // the last group
        stats_.defer_wait_s += seconds_since(t_wait);
      }
      uploaded.wait_on(dev::current_stream(device_));
    } else {
      (void)first, (void)end;
    }
  }

  // --- Hook -------------------------------------------------------------------------

  // The post-accumulate-grad hook: move the fresh gradient on (device accumulator,
  // or the host pipeline for FullOffload) and free the model's copy.
  void on_grad_ready(std::size_t i) {
    torch::NoGradGuard ng;
    ParamState& s = states_[i];
    Tensor& g = s.p->tensor.mutable_grad();
    if (!g.defined()) return;
    const auto h_hook = HostTrace::now();
    on_grad_ready_impl(i, s, g);
    if (trace_.on()) trace_.span("hooks", "hook " + s.p->name, h_hook, HostTrace::now(), step_);
  }

  void on_grad_ready_impl(std::size_t i, ParamState& s, Tensor& g) {
    if constexpr (kHostUpdate) {
      submit_gradient(i, g);
    } else {
      if (fresh_[i]) {
        s.grad.copy_(g);
        fresh_[i] = 0;
      } else {
        s.grad.add_(g);
      }
      if (overlap_ && last_micro_ && !hooked_[i]) {
        hooked_[i] = 1;
        auto& waiting = group_waiting_[group_of_[i]];
        waiting.push_back(i);
        if (waiting.size() == window_groups_[group_of_[i]].size()) update_in_hook(std::exchange(waiting, {}));
      }
    }
    g = Tensor();
  }

  // OptimizerOffload without clipping: the update of a group whose gradients are all
  // final, from the hook of its last one (members in the order their hooks ran).
  void update_in_hook(const std::vector<std::size_t>& members) {
    seen_.insert(seen_.end(), members.begin(), members.end());
    if (members.size() > 1) {
      update_group_streamed(members);
    } else {
      record_grad_norm(members.front());
      update_one_streamed(members.front());
    }
    fetch_ahead();
  }

  // OptimizerOffload's update groups (update_groups.hpp): with AdamW (and
  // knobs_.group_updates) a transformer block's parameters, up to a quarter of the
  // window's moments per group; with other optimizers every parameter alone.
  void make_window_groups() {
    std::vector<int> block(states_.size(), -1);
    std::vector<std::size_t> bytes(states_.size(), 0);
    for (std::size_t i = 0; i < states_.size(); ++i) {
      if (opt_.kind == OptKind::adamw && knobs_.group_updates) block[i] = states_[i].p->block;
      bytes[i] = moment_bytes(states_[i]);
    }
    window_groups_ = update_groups(block, bytes, window_ring_.capacity() / 4);
    group_of_.assign(states_.size(), 0);
    for (std::size_t g = 0; g < window_groups_.size(); ++g)
      for (auto i : window_groups_[g]) group_of_[i] = g;
    group_waiting_.assign(window_groups_.size(), {});
  }

  Transformer& model_;
  OptSettings opt_;
  HostTrace trace_;  // PRIMECFG_HOST_TRACE
  HostTrace::clock::time_point h_forward_, h_backward_, h_finished_;
  torch::Device device_ = torch::kCPU;
  torch::TensorOptions dev_;
  PipelineKnobs knobs_;
  std::vector<ParamState> states_;
  double lr_ = 0;
  std::int64_t step_ = 0;
  bool single_micro_ = true, last_micro_ = false;
  dev::MaybeStream h2d_, d2h_;  // copy streams (none on the CPU)

  // OptimizerOffload on a GPU
  bool overlap_ = false;  // updates run in the gradient hooks (no clipping)
  Tensor step_t_;         // this step's number, on the device (set when updates run in the hooks)
  Tensor grad_norms_;     // FP32 gradient norm per parameter, this step (FullOffload too)
  Tensor window_;
  StagingRing window_ring_;
  std::deque<WindowEntry> window_entries_;        // one per live window region, oldest first
  std::vector<std::optional<std::size_t>> slot_;  // window offset of a fetched parameter
  std::vector<dev::Marker> ready_;                // its fetch has landed
  std::vector<std::size_t> order_, seen_;         // fetch order; hook order of this step
  std::size_t next_fetch_ = 0;
  std::vector<dev::Marker> written_;  // a parameter's last write-back to host memory
  // The parameter whose gradient comes last in backward (the input embedding; on
  // Qwen3-0.6B the tied embedding, 1.2 GB of moments) keeps its moments in a buffer of
  // its own, fetched on a stream of its own as soon as its last write-back is done
  // (beside the forward pass). In the window it would be fetched last, into room
  // that frees only as the last write-backs of backward finish, and the compute
  // stream would wait for that fetch after backward (22 ms on Qwen3-0.6B).
  std::optional<std::size_t> tail_;
  Tensor tail_buf_;
  dev::MaybeStream tail_h2d_;
  bool tail_fetched_ = false;     // its moments are queued into tail_buf_ for this step
  bool tail_write_back_ = false;  // updated; the copy back to host memory waits for end_step()
  std::future<void> prefetch_;    // the prefetch of this step, queued beside the forward
  std::vector<char> hooked_;      // hook thread: parameter i's hook ran in the last micro-batch
  std::vector<std::vector<std::size_t>> window_groups_;  // update groups (make_window_groups)
  std::vector<std::size_t> group_of_;                    // parameter -> its group
  std::vector<std::vector<std::size_t>>
      group_waiting_;  // hook thread: hooked members of a group not complete yet

  // FullOffload
  // With tied embeddings and one micro-batch per step, the LM head's share of the
  // embedding's gradient comes as backward starts (Transformer::HeadGradHook), and it
  // is final for every row the step's input ids do not touch. Those rows are updated
  // right then; the batch's rows are gathered from the full gradient after backward
  // and updated last. The largest update (a quarter of Qwen3-0.6B's parameters) then
  // runs beside backward instead of after it.
  std::optional<std::size_t> tied_;  // the tied embedding's index in states_
  Transformer::HeadGradHook head_hook_;
  // The head share of one step: every row outside the step's batch, updated in slices
  // of rows whenever the worker has nothing else it can run, so that it neither holds
  // the layers' updates back during backward nor the next forward's first blocks after
  // it (next_work_locked). The next forward's lookup waits only for the rows it reads
  // (request_lookup_rows), its LM head for all of them.
  struct HeadShare {
    std::shared_ptr<const StepContext> ctx;
    struct Part {
      std::int64_t end_row = 0;  // rows up to here
      dev::Marker ready;         // their copy into head_buf_ has landed
    };
    std::vector<Part> parts;                          // copies queued so far, in row order
    std::int64_t next_row = 0;                        // the next slice starts here
    std::int64_t done_row = 0;                        // slices are done (and uploaded) up to here
    std::optional<std::vector<std::int64_t>> lookup;  // rows to update next, for the next lookup
    std::int64_t lookup_served_step = 0;
    bool active = false;            // rows are left to update (guarded by mu_)
    bool lookup_requested = false;  // request_lookup_rows() ran for it
    bool rows_requested = false;    // wait_for_head_rows() ran for it

    std::int64_t copied_rows() const { return parts.empty() ? 0 : parts.back().end_row; }
    // The part that holds `row`, null when its copy is not queued yet.
    const Part* part_of(std::int64_t row) const {
      for (const Part& p : parts)
        if (row < p.end_row) return &p;
      return nullptr;
    }
  } head_;
  bool tied_embeddings_ = false;  // the model's (tied_ is set only when split: knobs_.split_tied)
  static constexpr std::int64_t kHeadSliceElements = std::int64_t{1} << 22;  // ~1 ms of CPU update
  std::int64_t head_slice_rows_ = 1;
  Tensor head_buf_;                     // pinned: the head share's gradient
  std::vector<char> lookup_done_rows_;  // worker: rows of the head share the lookup job updated
  std::int64_t tied_batch_done_step_ = 0, tied_head_done_step_ = 0;  // the tied embedding's two parts
  std::int64_t lookup_done_step_ = 0;  // the step whose update of the next lookup's rows is done
  bool split_tied_ = false;            // this step splits it (main thread, before backward)
  bool head_submitted_ = false;        // the head's share is queued (hook thread; main after backward)

  std::shared_ptr<StepContext> ctx_ = std::make_shared<StepContext>();

  // Deferred updates (knobs_.defer): with one micro-batch per step the CPU update
  // cannot finish with backward (it is bound by host memory bandwidth and starts
  // when the first gradient lands), so what is left runs beside the next forward,
  // which waits per block for the parameters it is about to use.
  Transformer::BlockHook block_hook_;
  Transformer::HeadRowsHook rows_hook_;
  std::vector<std::vector<std::size_t>> block_groups_;  // parameters of each transformer block
  std::vector<std::size_t> head_group_;                 // the rest (used at the start and the end)
  std::vector<std::size_t> lookup_group_;               // the input embedding
  std::int64_t pending_step_ = 0;                       // step whose updates may still run (0: none)
  std::vector<std::int64_t> done_step_;                 // per parameter: the last step it was updated for
  std::set<std::uint64_t> released_;                    // ring ranges done, waiting for older ones
  std::vector<char> got_last_grad_;  // hook thread: a gradient was staged in the last micro-batch
  std::unique_ptr<cpu::ThreadPool> pool_;
  std::vector<int> bind_cpus_;
  StagingRing grad_ring_, up_ring_;
  Tensor grad_ring_buf_, up_ring_buf_;
  // The uploads that read the upload ring, in its order (the upload thread appends,
  // the worker takes them off as it reuses their slots).
  std::deque<dev::Marker> up_free_;
  std::mutex up_mu_;  // guards up_free_
  std::condition_variable up_cv_;
  std::unique_ptr<TaskThread> uploader_;  // queues the weight uploads (knobs_.upload_thread)
  std::thread worker_;
  std::mutex mu_;  // guards the queue, the gradient ring, the counters, error_, last_upload_
  std::condition_variable cv_;
  std::deque<Job> queue_;       // in the order the hooks staged them (but see finish_host_step)
  std::size_t landed_ = 0;      // queue_'s first landed_ jobs have their gradients in host memory
  int ring_waiters_ = 0;        // hooks waiting for room in the staging ring
  bool draining_ = false;       // finish_pending() waits for every job
  std::vector<int> needed_at_;  // per parameter: see needed_at()
  std::uint64_t submitted_ = 0, processed_ = 0;
  std::ptrdiff_t busy_ = -1;
  std::exception_ptr error_;
  bool stop_ = false;
  dev::Marker last_upload_;
  std::vector<char>
      fresh_;  // device accumulators: no gradient yet this step (hooks write, main reads after backward)
  std::vector<char> updated_;    // OptimizerOffload: updated in this step
  std::vector<char> acc_valid_;  // FullOffload, worker only: the host accumulator holds this step's sum
  double gsq_host_ = 0;  // FullOffload with several micro-batches: the worker sums the norm on the host

  // Per-step pipeline figures for the metrics (seconds and bytes).
  struct Stats {
    double cpu_update_s = 0;   // inside the CPU kernels
    double copy_wait_s = 0;    // worker waiting for gradient copies to land
    double ring_wait_s = 0;    // hooks waiting for staging space
    double drain_s = 0;        // end of backward to the last update queued (deferred: to the hand-over)
    double defer_wait_s = 0;   // the forward waiting on the host for the last step's deferred updates
    double lookup_rows = 0;    // rows of the last step's head share updated first for this lookup
    double upload_wait_s = 0;  // worker waiting for room in the upload ring
    double d2h_bytes = 0, h2d_bytes = 0;
  } stats_;  // worker and hooks write under mu_ or while the other side is idle
};

}  // namespace primecfg::train
