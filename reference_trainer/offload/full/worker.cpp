#include "offload/full/full_offload.hpp"

#include "offload/full/host_grads.hpp"
#include "offload/full/numa/numa_binding.hpp"
#include "offload/shared/copies.hpp"
#include "optim/cpu/cpu_optim.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <utility>

namespace primecfg::train {

const char* FullOffloadPipeline::part_name(Part p) {
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

void FullOffloadPipeline::worker_main() {
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
          if (dp_)
            update_piece_rows(head_buf_view(), PieceLayout::piece, w.rows, c);
          else
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
FullOffloadPipeline::Work FullOffloadPipeline::next_work_locked() {
  Work w;
  const bool runnable = head_runnable_locked();
  const auto* part = runnable ? head_.part_of(head_.next_row) : nullptr;
  const bool head_ready = part && part->ready.reached();
  // The lookup's rows may lie anywhere: it waits for the whole share (the copies
  // land in order, so for the last one).
  if (runnable && head_.lookup && head_.copied_rows() >= tied_piece_.end_row() &&
      head_.parts.back().ready.reached()) {
    w.kind = Work::Kind::head_lookup;
    w.rows = std::move(*head_.lookup);
    w.head_ready = head_.parts.back().ready;
    head_.lookup.reset();
    return w;
  }
  if (!queue_.empty()) {
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
    w.last = std::min({part->end_row, w.first + head_slice_rows_, tied_piece_.end_row()});
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
// upload thread, after its upload). Tests hold it back (offload/shared/test_seams.hpp) until the next
// forward asks for its lookup rows (then only those run) and then until the loss
// asks for its rows, so that both of those waits matter every step.
bool FullOffloadPipeline::head_runnable_locked() const {
  const bool rows_left =
      head_.active && head_.next_row < std::min(head_.copied_rows(), tied_piece_.end_row());
  if (!rows_left || !seams_.hold_head_share || draining_) return rows_left;
  return (head_.lookup && head_.lookup_requested) || head_.rows_requested;
}

// Among the landed jobs, the one the next forward needs first (earliest deadline
// first: the embedding lookup, then block by block, then the final norm). Backward
// hands gradients over from the last block down, so the blocks left when it ends are
// the top ones, which the next forward reaches last; in arrival order they would be
// the first blocks, and the forward would wait at each of them. The oldest job goes
// first when a hook waits for staging room (ranges are freed in order) and with
// several micro-batches (an accumulation must precede its parameter's update).
std::size_t FullOffloadPipeline::earliest_needed_locked() const {
  if (ring_waiters_ > 0) return 0;
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
int FullOffloadPipeline::needed_at(const Job& j) const {
  if (j.part == Part::batch_rows) return -1;
  return needed_at_[j.param];
}

void FullOffloadPipeline::finish_work_locked(const Work& w, std::int64_t step) {
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
      if (w.last < tied_piece_.end_row() && !error_) return;
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

std::string FullOffloadPipeline::work_name(const Work& w) const {
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
void FullOffloadPipeline::release_in_order_locked(const StagingRing::Range& r) {
  released_.insert(r.id);
  while (auto oldest = grad_ring_.oldest()) {
    if (!released_.erase(oldest->id)) break;
    grad_ring_.release(*oldest);
  }
}

// On the worker: one staged gradient. Earlier micro-batches accumulate into the
// FP32 host accumulator; on the last one the parameter is updated right away.
void FullOffloadPipeline::consume(const Job& job) {
  torch::NoGradGuard ng;
  if (seams_.worker_delay_ms > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(seams_.worker_delay_ms));
  const StepContext& c = *job.ctx;
  ParamState& s = states_[job.param];
  const Tensor& w = s.weight;  // sizes: the parameter's, or this rank's piece
  if (job.part == Part::no_grad) {
    // What earlier micro-batches accumulated, else zero.
    if (!s.grad.defined()) s.grad = torch::empty(w.sizes(), torch::kFloat32);
    if (!acc_valid_[job.param]) s.grad.zero_();
    acc_valid_[job.param] = 0;
    if (!c.single_micro) gsq_host_ += squared_norm(s.grad);
    update_host(job.param, s.grad, c);
    return;
  }
  if (job.part == Part::batch_rows && dp_) {
    update_piece_rows(ring_view(grad_ring_buf_, job.slot.offset, job.dtype, {c.piece_batch_elems}),
                      PieceLayout::rows, c.batch_rows, c);
    return;
  }
  if (job.part == Part::batch_rows) {
    const std::array<std::int64_t, 2> rows{static_cast<std::int64_t>(c.batch_rows.size()), w.size(1)};
    update_embedding_rows(ring_view(grad_ring_buf_, job.slot.offset, w.scalar_type(), rows), false,
                          c.batch_rows, c.batch_rows_dev, c);
    return;
  }
  Tensor staged = ring_view(grad_ring_buf_, job.slot.offset, job.dtype, w.sizes());
  if (!job.last) {
    if (!s.grad.defined()) s.grad = torch::empty(w.sizes(), torch::kFloat32);
    if (acc_valid_[job.param])
      accumulate_grad(s.grad, staged);
    else
      s.grad.copy_(staged);
    acc_valid_[job.param] = 1;
    return;
  }
  Tensor grad = staged;
  if (acc_valid_[job.param]) {
    accumulate_grad(s.grad, staged);
    grad = s.grad;
    acc_valid_[job.param] = 0;  // the next step starts afresh
  }
  if (!c.single_micro) gsq_host_ += squared_norm(grad);
  update_host(job.param, grad, c);
}

// Runs the CPU kernel on one parameter and queues its new weights for the device.
void FullOffloadPipeline::update_host(std::size_t i, const Tensor& grad, const StepContext& c) {
  ParamState& s = states_[i];
  Tensor w = s.weight;
  const bool bf16 = w.scalar_type() == torch::kBFloat16;
  Tensor out;
  if (bf16) out = (w.is_cpu() && w.is_contiguous()) ? w : upload_slot(w);
  const auto t_kernel = std::chrono::steady_clock::now();
  update_on_cpu_kernel(opt_, *pool_, s.master, grad, s.m1.defined() ? &s.m1 : nullptr,
                       s.m2.defined() ? &s.m2 : nullptr,
                       bf16 ? reinterpret_cast<std::uint16_t*>(out.data_ptr()) : nullptr,
                       s.p->frozen ? 0.0 : c.lr, c.step);  // frozen: a zero gradient, a zero rate
  count_update(t_kernel, w.is_cpu() ? 0 : w.nbytes());
  if (w.is_cpu() && bf16) return;  // the kernel wrote the weights
  queue_upload([w, from = bf16 ? out : s.master] { w.copy_(from, /*non_blocking=*/true); },
               bf16 && !w.is_cpu());
}

void FullOffloadPipeline::count_update(std::chrono::steady_clock::time_point t_kernel,
                                       std::size_t upload_bytes) {
  const double kernel_s = seconds_since(t_kernel);
  if (trace_.on()) {  // the kernel inside its job's span
    const auto end = HostTrace::now();
    trace_.span(
        "worker", "kernel",
        end - std::chrono::duration_cast<HostTrace::clock::duration>(std::chrono::duration<double>(kernel_s)),
        end, 0);
  }
  std::lock_guard lk(mu_);
  stats_.cpu_update_s += kernel_s;
  stats_.h2d_bytes += static_cast<double>(upload_bytes);
}

// Queues `copy` (new weights into the model's tensor) on the h2d stream: on the
// upload thread when there is one, else right here. `used_slot`: it reads a slot
// of the upload ring. (On the CPU the copy is a plain copy.)
void FullOffloadPipeline::queue_upload(TaskThread::Task copy, bool used_slot) {
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
void FullOffloadPipeline::note_upload(bool used_slot, const dev::Marker& done) {
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
Tensor FullOffloadPipeline::upload_slot(const Tensor& w) { return upload_slot(w.scalar_type(), w.sizes()); }

Tensor FullOffloadPipeline::upload_slot(torch::ScalarType dtype, torch::IntArrayRef sizes) {
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
      if (!up_cv_.wait_for(lk, timeout_, [&] { return !up_free_.empty(); }))
        throw run_error(fmt::format("offload = \"full\": timed out after {} s waiting for the upload thread",
                                    timeout_.count() / 1000.0));
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

}  // namespace primecfg::train
