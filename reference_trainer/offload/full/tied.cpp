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
// Sharded, each chunk is first summed over the ranks (each saw other data), and only
// this rank's piece of it goes to the host.
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
      head_.next_row = head_.done_row = tied_piece_.first_row();
      head_.ctx = ctx_;
      head_.active = true;
      ++submitted_;
    }
    head_submitted_ = true;
    if (tied_piece_.first_row() >= tied_piece_.end_row()) {
      // Sharded, this rank's piece is padding only: no row of the share is its own.
      // It still takes part in the split's sums, as every rank must.
      std::lock_guard lk(mu_);
      head_.active = false;
      tied_head_done_step_ = head_.ctx->step;
      ++processed_;
    }
  }
  Tensor share = rows;
  if (dp_) {
    share = rows.contiguous().clone();  // the gradient itself goes on into the embedding's
    dp_->sum(share, "the sum of the LM head's share of the tied embedding's gradient");
  }
  // This rank's elements of the chunk (all of it in one process).
  const std::int64_t dim = rows.size(1), at = first_row * dim;
  const std::int64_t e0 = std::max(at, tied_piece_.begin), e1 = std::min(at + rows.numel(), tied_piece_.end);
  dev::Marker ready;
  if (e1 > e0)
    ready = copy_to_host(
        ring_view(head_buf_, static_cast<std::size_t>((e0 - tied_piece_.begin) * rows.element_size()),
                  rows.scalar_type(), {e1 - e0}),
        share.reshape({-1}).narrow(0, e0 - at, e1 - e0));
  {
    std::lock_guard lk(mu_);
    head_.parts.push_back({first_row + rows.size(0), std::move(ready)});
    stats_.d2h_bytes += static_cast<double>(std::max<std::int64_t>(0, e1 - e0) * rows.element_size());
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
    // Rows below next_row are done, or in the slice running now; sharded, rows past
    // tied_piece_.end_row() are other ranks' pieces.
    const std::int64_t end = std::min(vocab, tied_piece_.end_row());
    for (auto id : ids)
      if (id >= head_.next_row && id < end && !c.in_batch[static_cast<std::size_t>(id)])
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

// The head share of this rank's elements, flat: element e of the tied embedding at
// e - tied_piece_.begin.
Tensor FullOffloadPipeline::head_buf_view() const {
  return ring_view(head_buf_, 0, states_[*tied_].p->tensor.scalar_type(),
                   {tied_piece_.end - tied_piece_.begin});
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
// wrote, or will write and upload later for batch rows not done yet). Sharded, only
// this rank's elements of the rows (its piece may start or end inside a row).
void FullOffloadPipeline::update_head_slice(const StepContext& c, std::int64_t first, std::int64_t last) {
  ParamState& s = states_[*tied_];
  const Tensor flat = s.weight.reshape({-1});  // the weights this rank writes: element e at e - base
  const bool bf16 = flat.scalar_type() == torch::kBFloat16;
  const bool direct = flat.is_cpu() && flat.is_contiguous();
  const std::int64_t dim = s.p->tensor.size(1), base = tied_piece_.begin;
  const std::int64_t e0 = std::max(first * dim, tied_piece_.begin),
                     e1 = std::min(last * dim, tied_piece_.end);
  if (e1 <= e0) return;
  Tensor out;
  if (bf16 && !direct) out = upload_slot(flat.scalar_type(), {e1 - e0});
  auto* out16 = bf16 ? reinterpret_cast<std::uint16_t*>((direct ? flat : out).data_ptr()) : nullptr;
  const std::int64_t out_base = direct ? base : e0;  // out16 holds element e at e - out_base
  const EmbeddingSpans run = embedding_spans(c, head_buf_view(), out16);
  const float* master = s.master.data_ptr<float>();
  auto skip = [&](std::int64_t r) {
    return c.in_batch[static_cast<std::size_t>(r)] || lookup_done_rows_[static_cast<std::size_t>(r)];
  };
  const auto t_kernel = std::chrono::steady_clock::now();
  pool_->parallel_for(
      last - first, std::max<std::int64_t>(1, cpu::kDefaultGrain / dim), [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t r = first + b; r < first + e;) {
          if (skip(r)) {
            const std::int64_t from = std::max(r * dim, e0), to = std::min((r + 1) * dim, e1);
            if (out16 && !direct && to > from)
              cpu::float_to_bf16(master + (from - base), out16 + (from - out_base), to - from);
            ++r;
            continue;
          }
          const std::int64_t row = r;
          while (r < first + e && !skip(r)) ++r;
          const std::int64_t from = std::max(row * dim, e0), to = std::min(r * dim, e1);
          if (to > from) run(from - base, from - base, from - out_base, to - from);
        }
      });
  count_update(t_kernel, flat.is_cpu() ? 0 : static_cast<std::size_t>(e1 - e0) * flat.element_size());
  if (flat.is_cpu() && bf16) return;  // the kernel wrote the rows
  queue_upload(
      [to = flat.narrow(0, e0 - base, e1 - e0),
       from = bf16 ? out : s.master.reshape({-1}).narrow(0, e0 - base, e1 - e0)] {
        to.copy_(from, /*non_blocking=*/true);
      },
      bf16 && !flat.is_cpu());
}

// Sharded: the listed rows (sorted) of this rank's piece, from a gradient laid out as
// the piece (PieceLayout::piece: flat, element e at e - tied_piece_.begin; the next lookup's
// rows from the head share) or as the rows' elements in the piece one after another
// (PieceLayout::rows: the batch's rows from the piece's final gradient, as
// piece_batch_rows() staged it). Whole rows go up through one index_copy_; the rows
// the piece's ends cut (two at most) apart.
void FullOffloadPipeline::update_piece_rows(const Tensor& grad, PieceLayout layout,
                                            const std::vector<std::int64_t>& rows, const StepContext& c) {
  ParamState& s = states_[*tied_];
  const Tensor flat = s.weight.reshape({-1});
  const bool bf16 = flat.scalar_type() == torch::kBFloat16;
  const bool direct = flat.is_cpu() && flat.is_contiguous();
  const std::int64_t dim = s.p->tensor.size(1), base = tied_piece_.begin;
  struct Span {
    std::int64_t row, from, to, out;  // elements [from, to) of `row`, at `out` in the upload slot
  };
  std::vector<Span> spans;
  std::int64_t total = 0;
  const PieceRows& pr = tied_piece_;
  for (auto r : rows) {
    if (pr.held(r) == 0) continue;
    spans.push_back({r, pr.from(r), pr.to(r), total});
    total += pr.held(r);
  }
  if (spans.empty()) return;
  Tensor out;
  if (bf16 && !direct) out = upload_slot(flat.scalar_type(), {total});
  auto* out16 = bf16 ? reinterpret_cast<std::uint16_t*>((direct ? flat : out).data_ptr()) : nullptr;
  const EmbeddingSpans run = embedding_spans(c, grad, out16);
  const auto t_kernel = std::chrono::steady_clock::now();
  pool_->parallel_for(static_cast<std::int64_t>(spans.size()),
                      std::max<std::int64_t>(1, cpu::kDefaultGrain / dim),
                      [&](std::int64_t b, std::int64_t e) {
                        for (std::int64_t j = b; j < e; ++j) {
                          const Span& p = spans[static_cast<std::size_t>(j)];
                          const std::int64_t g = layout == PieceLayout::rows ? p.out : p.from - base;
                          run(p.from - base, g, direct ? p.from - base : p.out, p.to - p.from);
                        }
                      });
  count_update(t_kernel, flat.is_cpu() ? 0 : static_cast<std::size_t>(total) * flat.element_size());
  if (flat.is_cpu() && bf16) return;  // the kernel wrote the rows
  if (!bf16) {
    // FP32 weights (tests): the whole piece's master; this upload follows the earlier ones.
    queue_upload([flat, master = s.master.reshape({-1})] { flat.copy_(master, /*non_blocking=*/true); },
                 false);
    return;
  }
  std::vector<std::int64_t> whole;  // rows whole in the piece, in slot order (consecutive there)
  std::int64_t whole_at = -1;
  std::vector<Span> cut;
  for (const Span& p : spans) {
    if (p.to - p.from == dim) {
      if (whole.empty()) whole_at = p.out;
      whole.push_back(p.row);
    } else {
      cut.push_back(p);
    }
  }
  const std::int64_t row0 = pr.first_whole(), rows_in_piece = pr.end_whole() - row0;
  queue_upload(
      [this, flat, out, whole = std::move(whole), whole_at, cut = std::move(cut), row0, rows_in_piece, dim,
       base]() mutable {
        for (const Span& p : cut)
          flat.narrow(0, p.from - base, p.to - p.from)
              .copy_(out.narrow(0, p.out, p.to - p.from), /*non_blocking=*/true);
        if (whole.empty()) return;
        const auto k = static_cast<std::int64_t>(whole.size());
        for (auto& r : whole) r -= row0;
        Tensor rows_dev = to_device(whole, {k}, device_);  // queued on h2d_
        flat.narrow(0, row0 * dim - base, rows_in_piece * dim)
            .view({rows_in_piece, dim})
            .index_copy_(0, rows_dev, out.narrow(0, whole_at, k * dim).view({k, dim}).to(device_, true));
        rows_dev.record_stream(*h2d_);
      },
      true);
}

// Sharded: of this rank's piece of the tied embedding's final gradient (flat), the
// elements of the batch's rows, in row order (the layout update_piece_rows reads as
// PieceLayout::rows): the rest of the piece was updated from the head share and need
// not cross to the host. The row the piece's start cuts comes first, the whole rows
// next, the row its end cuts last.
Tensor FullOffloadPipeline::piece_batch_rows(const Tensor& piece) const {
  const StepContext& c = *ctx_;
  const PieceRows& pr = tied_piece_;
  auto in_batch = [&](std::int64_t r) { return c.in_batch[static_cast<std::size_t>(r)] != 0; };
  std::vector<Tensor> parts;
  Tensor last_cut;  // the row the piece's end cuts goes after the whole rows
  pr.for_each_cut_row([&](std::int64_t r) {
    if (!in_batch(r)) return;
    Tensor part = piece.narrow(0, pr.from(r) - pr.begin, pr.held(r));
    if (r == pr.begin / pr.dim)
      parts.push_back(part);
    else
      last_cut = part;
  });
  if (c.piece_rows_dev.defined()) {
    const std::int64_t row0 = pr.first_whole(), n = pr.end_whole() - row0;
    parts.push_back(piece.narrow(0, row0 * pr.dim - pr.begin, n * pr.dim)
                        .view({n, pr.dim})
                        .index_select(0, c.piece_rows_dev)
                        .reshape({-1}));
  }
  if (last_cut.defined()) parts.push_back(last_cut);
  if (parts.empty()) return piece.narrow(0, 0, 0);
  return parts.size() == 1 ? parts.front() : torch::cat(parts);
}

}  // namespace primecfg::train
