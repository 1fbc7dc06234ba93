#include "offload/full/full_offload.hpp"

#include "offload/shared/copies.hpp"
#include "optim/cpu/cpu_optim.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <utility>

namespace primecfg::train {

// Transformer::HeadGradHook: rows [first_row, first_row + rows.size(0)) of the LM
// head's share of the tied embedding's gradient, copied into head_buf_ and handed to
// the worker as part of this step's HeadShare. They come in row order: all at once
// as backward starts, or chunk by chunk during the loss (LossChunks::vocabulary).
void FullOffloadPipeline::submit_head_rows(std::int64_t first_row, const Tensor& rows) {
  if (first_row == 0) {
    {
      // The last step's share is done: the forward waited for it at the LM head.
      std::unique_lock lk(mu_);
      if (!cv_.wait_for(lk, timeout_, [&] { return !head_.active || error_; }))
        throw run_error(
            diagnose_locked(fmt::format("timed out after {} s waiting for the last step's update of {}",
                                        timeout_.count() / 1000.0, states_[*tied_].p->name)));
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
  dev::Marker ready = copy_to_host(
      ring_view(head_buf_, static_cast<std::size_t>(first_row) * row_bytes, rows.scalar_type(), rows.sizes()),
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
void FullOffloadPipeline::request_lookup_rows(const std::vector<std::int64_t>& ids) {
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

// The split tied embedding is done for `step` when its batch rows and its head
// share are; the next forward's lookup may read it once the batch rows and the
// lookup's rows (or the whole share) are.
void FullOffloadPipeline::settle_tied_locked(std::int64_t step) {
  if (tied_batch_done_step_ < step) return;
  if (tied_head_done_step_ >= step) {
    done_step_[*tied_] = step;
    lookup_done_step_ = step;
  } else if (head_.lookup_served_step >= step) {
    lookup_done_step_ = step;
  }
}

FullOffloadPipeline::EmbeddingSpans FullOffloadPipeline::embedding_spans(const StepContext& c,
                                                                         const Tensor& grad,
                                                                         std::uint16_t* out16) {
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

Tensor FullOffloadPipeline::head_buf_view() const {
  const Tensor& w = states_[*tied_].p->tensor;
  return ring_view(head_buf_, 0, w.scalar_type(), w.sizes());
}

// Updates the listed rows of the tied embedding and uploads them: the batch's rows
// from their final gradient (`grad` [rows, D], row k of it for rows[k]), or rows of
// the head share (`grad_by_row`: `grad` [vocab, D]) that the next lookup reads.
void FullOffloadPipeline::update_embedding_rows(const Tensor& grad, bool grad_by_row,
                                                const std::vector<std::int64_t>& rows, Tensor rows_dev,
                                                const StepContext& c) {
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
void FullOffloadPipeline::update_head_slice(const StepContext& c, std::int64_t first, std::int64_t last) {
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

}  // namespace primecfg::train
