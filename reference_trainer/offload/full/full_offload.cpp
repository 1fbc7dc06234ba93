#include "offload/full/full_offload.hpp"

#include "nn/loss_chunking.hpp"
#include "offload/full/numa/numa_binding.hpp"
#include "offload/shared/copies.hpp"
#include "offload/shared/ring_size.hpp"
#include "optim/cpu/cpu_optim.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <utility>

namespace primecfg::train {

FullOffloadPipeline::FullOffloadPipeline(Transformer& model, const OptSettings& opt, const RunOptions& run,
                                         Sharding* dp)
    : opt_(opt),
      dp_(dp),
      trace_(run.profile.host_trace),
      device_(model.device()),
      ring_bytes_(run.offload.ring_bytes()),
      timeout_(std::llround(run.offload.timeout_s * 1e3)),
      cpu_threads_(static_cast<int>(run.offload.cpu_threads.value_or(0))),
      seams_(test_seams::full_offload()) {
  const bool cuda = !device_.is_cpu();
  // Sharded, the updates write this rank's pieces, which the next forward gathers
  // block by block: the block hook below waits for a block's pieces before the
  // sharding's hook gathers it.
  defer_ = seams_.defer.value_or(cuda);
  dev_ = torch::TensorOptions().dtype(torch::kFloat32).device(device_);
  const auto pinned = torch::TensorOptions().dtype(torch::kFloat32).device(torch::kCPU).pinned_memory(cuda);
  const auto plain = torch::TensorOptions().dtype(torch::kFloat32).device(torch::kCPU);
  // Masters are uploaded straight from host memory only for FP32 weights; moments and
  // accumulators never leave the host.
  states_ = place_state(model, opt, Placement{plain, pinned, false, plain, plain}, dp);
  masters_from_model();
  if (model.args().tie_embeddings && seams_.split_tied)
    for (std::size_t i = 0; i < states_.size(); ++i)
      if (states_[i].p->tensor.is_same(model.lm_head())) tied_ = i;
  if (tied_) {
    const Tensor& w = states_[*tied_].p->tensor;
    tied_piece_ = {w.size(1), 0, w.numel()};
    if (dp) {
      const ShardSpan& piece = dp->span(*tied_);
      tied_piece_.begin = std::min(piece.offset, w.numel());
      tied_piece_.end = std::min(piece.offset + piece.length, w.numel());
    }
  }
  head_hook_ = [this](std::int64_t first_row, const Tensor& rows) { submit_head_rows(first_row, rows); };
  tied_embeddings_ = model.args().tie_embeddings;
  const int layers = model.args().layers;
  block_hook_.before = [this, layers](int block) {
    wait_for_block(block);
    // Sharded: the sharding's hook, next, may start the gather of the block after this
    // one ahead of its use; that gather reads the pieces this rank updates.
    if (dp_ && dp_->prefetches() && block < layers) wait_for_block(block + 1);
  };
  rows_hook_ = [this](std::int64_t first, std::int64_t end) { wait_for_head_rows(first, end); };
  block_groups_.resize(static_cast<std::size_t>(model.args().layers));
  for (std::size_t i = 0; i < states_.size(); ++i) {
    const int b = states_[i].p->block;
    if (b >= 0)
      block_groups_.at(static_cast<std::size_t>(b)).push_back(i);
    else
      head_group_.push_back(i);  // the embedding, the final norm and an untied LM head
    if (states_[i].p->tensor.is_same(model.param(kEmbeddingParam))) lookup_group_.push_back(i);
  }
  needed_at_.assign(states_.size(), model.args().layers);
  for (std::size_t i = 0; i < states_.size(); ++i)
    if (states_[i].p->block >= 0) needed_at_[i] = states_[i].p->block;
  for (auto i : lookup_group_) needed_at_[i] = -1;
  acc_valid_.assign(states_.size(), 0);
  done_step_.assign(states_.size(), 0);
  got_last_grad_.assign(states_.size(), 0);
  start_host_pipeline();
  hooks_.install(
      states_, trace_, step_, [this](std::size_t i, ParamState&, Tensor& g) { submit_gradient(i, g); }, dp);
}

FullOffloadPipeline::~FullOffloadPipeline() {
  hooks_.remove();
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
  } catch (...) {
  }
}

void FullOffloadPipeline::masters_from_model() {
  torch::NoGradGuard ng;
  sync_host();
  for (auto& s : states_) master_from_weights(s);
}

void FullOffloadPipeline::sync_host() {
  finish_pending();
  dev::synchronize(d2h_);
  dev::synchronize(h2d_);
}

void FullOffloadPipeline::begin_step(double lr, std::int64_t step, bool single_micro_batch) {
  lr_ = lr;
  step_ = step;
  single_micro_ = single_micro_batch;
  last_micro_ = single_micro_batch;
  {
    std::lock_guard lk(mu_);
    stats_ = Stats{};
  }
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
}

void FullOffloadPipeline::begin_last_micro_batch(const std::vector<std::int64_t>& input_ids,
                                                 const std::vector<std::int64_t>& every_ranks_ids) {
  last_micro_ = true;
  spans_.forward_begins();
  // The tied embedding is split only with one micro-batch per step: with more,
  // the FP32 accumulator would have to be added row by row as well.
  split_tied_ = tied_ && single_micro_;
  head_submitted_ = false;
  if (split_tied_) {
    StepContext& c = *ctx_;
    const std::int64_t vocab = states_[*tied_].p->tensor.size(0);
    c.in_batch.assign(static_cast<std::size_t>(vocab), 0);
    // Sharded, the head share is summed over the ranks, and a row is final in it only
    // when no rank's batch reads it: the union of the ranks' rows.
    for (auto id : dp_ ? every_ranks_ids : input_ids)
      if (id >= 0 && id < vocab) c.in_batch[static_cast<std::size_t>(id)] = 1;
    for (std::int64_t r = 0; r < vocab; ++r)
      if (c.in_batch[static_cast<std::size_t>(r)]) c.batch_rows.push_back(r);
    const std::array<std::int64_t, 1> n{static_cast<std::int64_t>(c.batch_rows.size())};
    c.batch_rows_dev = to_device(c.batch_rows, n, device_);
    if (dp_) {
      const PieceRows& pr = tied_piece_;
      std::vector<std::int64_t> local;  // the whole rows of the piece in the batch, as rows of the piece
      for (auto r : c.batch_rows) {
        c.piece_batch_elems += pr.held(r);
        if (r >= pr.first_whole() && r < pr.end_whole()) local.push_back(r - pr.first_whole());
      }
      const std::array<std::int64_t, 1> k{static_cast<std::int64_t>(local.size())};
      if (!local.empty()) c.piece_rows_dev = to_device(local, k, device_);
    }
  }
  // The last step's head share may still be running: the rows this lookup reads go
  // first. Sharded, the lookup reads every rank's rows (the union), gathered by rows
  // (Sharding::lookup_rows), and each rank updates the elements of them its piece holds;
  // without the split the lookup gathers the whole embedding and waits for all of it.
  if (lookup_by_rows()) request_lookup_rows(dp_ ? ctx_->batch_rows : input_ids);
  if (dp_ && split_tied_) dp_->lookup_rows(ctx_->batch_rows, ctx_->batch_rows_dev);
}

Transformer::LossChunks FullOffloadPipeline::loss_chunks(std::int64_t tokens) const {
  return seams_.vocabulary_loss && vocab_chunked_loss(tied_embeddings_, tokens)
             ? Transformer::LossChunks::vocabulary
             : Transformer::LossChunks::tokens;
}

double FullOffloadPipeline::finish_step() {
  const auto began = spans_.finish_begins(step_);
  const double norm = finish_host_step();
  spans_.finish_ends(began, step_);
  return norm;
}

std::map<std::string, double> FullOffloadPipeline::pipeline_stats() const {
  std::map<std::string, double> out{{"d2h_gib", stats_.d2h_bytes / (1024.0 * 1024 * 1024)},
                                    {"h2d_gib", stats_.h2d_bytes / (1024.0 * 1024 * 1024)}};
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
  return out;
}

std::map<std::string, double> FullOffloadPipeline::host_bytes() const {
  auto out = host_state_bytes(states_);
  add_host_bytes(out["staging"], grad_ring_buf_);
  add_host_bytes(out["staging"], up_ring_buf_);
  add_host_bytes(out["staging"], head_buf_);
  return out;
}

std::size_t FullOffloadPipeline::ring_for(std::size_t largest, std::size_t total) const {
  return static_cast<std::size_t>(
      ring_capacity(static_cast<std::int64_t>(largest), static_cast<std::int64_t>(total), ring_bytes_));
}

void FullOffloadPipeline::start_host_pipeline() {
  const bool cuda = !device_.is_cpu();
  std::size_t largest = 0, total = 0, largest_grad = 0;
  for (std::size_t i = 0; i < states_.size(); ++i) {
    const std::size_t n = states_[i].p->tensor.nbytes();
    largest = std::max(largest, n);
    total += n;
    largest_grad = std::max(
        largest_grad,
        dp_ ? static_cast<std::size_t>(dp_->span(i).per_rank) * c10::elementSize(staged_dtype(i)) : n);
  }
  const auto bytes = torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(cuda);
  // Sized as the planner counts it, but never below one gradient: sharded, a gradient
  // arrives as this rank's piece in the reduce dtype, which with FP32 reductions is
  // 4/W bytes a parameter (a small offload.ring_mib would not hold it).
  grad_ring_ = StagingRing(std::max(ring_for(largest, total), ring_for(largest_grad, largest_grad)));
  grad_ring_buf_ = torch::empty({static_cast<std::int64_t>(grad_ring_.capacity())}, bytes);
  if (cuda) {
    d2h_ = dev::side_stream(device_);
    h2d_ = dev::side_stream(device_);
    up_ring_ = StagingRing(ring_for(largest, total));
    up_ring_buf_ = torch::empty({static_cast<std::int64_t>(up_ring_.capacity())}, bytes);
  }
  if (tied_) {
    const Tensor& w = states_[*tied_].p->tensor;
    head_buf_ = torch::empty(
        {(tied_piece_.end - tied_piece_.begin) * static_cast<std::int64_t>(w.element_size())}, bytes);
    head_slice_rows_ = std::max<std::int64_t>(1, kHeadSliceElements / w.size(1));
    lookup_done_rows_.assign(static_cast<std::size_t>(w.size(0)), 0);
  }

  // CPU threads: the cores this process may use, less one for the thread that
  // drives the GPU; bound to the GPU's NUMA node when it has one.
  // Several ranks on one node share its cores: each takes its slice (cores / local
  // ranks), and of its GPU's NUMA node the part that the ranks whose GPUs sit on that
  // node do not take.
  cpu::ThreadPoolOptions po;
  const int usable = static_cast<int>(cpu::allowed_cpus().size());
  const int local = dp_ ? dp_->group().launch().local_world : 1;
  const int local_rank = dp_ ? dp_->group().launch().local_rank : 0;
  po.threads = cpu_threads_ > 0 ? cpu_threads_ : std::max(1, usable / local - 1);
  if (cuda) {
    const std::string bus = dev::pci_bus_id(device_);
    auto b = numa::find_gpu_binding(bus);
    if (!b.ok) throw run_error(fmt::format("offload = \"full\": {}", b.message));
    if (!b.message.empty()) std::fprintf(stderr, "primecfg-train: warning: %s\n", b.message.c_str());
    if (b.bind) {
      std::vector<int> cpus = b.cpus;
      if (local > 1) {
        std::vector<int> peers;  // local ranks (cuda:k is local rank k's) on this node
        for (int k = 0; k < local; ++k) {
          if (k == local_rank) {
            peers.push_back(k);
            continue;
          }
          auto other = numa::find_gpu_binding(
              dev::pci_bus_id(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(k))));
          if (other.bind && other.cpus == b.cpus) peers.push_back(k);
        }
        const auto me =
            static_cast<std::size_t>(std::find(peers.begin(), peers.end(), local_rank) - peers.begin());
        const std::size_t n = b.cpus.size(), p = peers.size();
        cpus.assign(b.cpus.begin() + static_cast<std::ptrdiff_t>(me * n / p),
                    b.cpus.begin() + static_cast<std::ptrdiff_t>((me + 1) * n / p));
        if (cpu_threads_ == 0) po.threads = std::max(1, static_cast<int>(cpus.size()) - 1);
      }
      po.cpus = cpus;
      bind_cpus_ = cpus;
    }
  }
  pool_ = std::make_unique<cpu::ThreadPool>(po);
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

torch::ScalarType FullOffloadPipeline::staged_dtype(std::size_t i) const {
  const torch::ScalarType param = states_[i].p->tensor.scalar_type();
  if (!dp_) return param;
  const torch::ScalarType piece = dp_->reduce_dtype();
  return dp_->world() == 1 && c10::elementSize(param) < c10::elementSize(piece) ? param : piece;
}

// The hook's side of FullOffload: stage the gradient and queue it for the worker.
void FullOffloadPipeline::submit_gradient(std::size_t i, const Tensor& piece) {
  const torch::ScalarType dtype = staged_dtype(i);
  const Tensor g = piece.scalar_type() == dtype ? piece : piece.to(dtype);
  if (single_micro_) {
    // The norm of this step's gradient, on the device, while it is still there.
    Tensor slot = grad_norms_.select(0, static_cast<std::int64_t>(i));
    at::linalg_vector_norm_out(slot, g, 2, std::nullopt, false, torch::kFloat32);
  }
  if (tied_ && i == *tied_ && head_submitted_) {
    // The other rows were updated from the head's share: only the batch's rows move.
    head_submitted_ = false;
    // Sharded, g is this rank's piece (flat): its elements of the batch's rows go.
    stage(i, dp_ ? piece_batch_rows(g) : g.index_select(0, ctx_->batch_rows_dev), Part::batch_rows);
    return;
  }
  stage(i, g, Part::whole);
}

// Queues the copy of the device gradient g into pinned `staged` on the d2h stream,
// after the compute stream's work so far; the marker says when it has landed.
dev::Marker FullOffloadPipeline::copy_to_host(const Tensor& staged, const Tensor& g) {
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
void FullOffloadPipeline::stage(std::size_t i, const Tensor& g, Part part) {
  const std::size_t bytes = g.nbytes();
  if (bytes == 0) {
    // Nothing to copy (a sharded piece that holds none of the batch's rows); the job
    // still says that the parameter's part is in.
    if (last_micro_) got_last_grad_[i] = 1;
    {
      std::lock_guard lk(mu_);
      queue_.push_back(
          Job{i, StagingRing::Range{}, dev::Marker(), last_micro_, part, ctx_, false, g.scalar_type()});
      ++submitted_;
    }
    cv_.notify_all();
    return;
  }
  StagingRing::Range r;
  const auto t_ring = std::chrono::steady_clock::now();
  {
    std::unique_lock lk(mu_);
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (;;) {
      if (error_) std::rethrow_exception(error_);
      if (auto got = grad_ring_.try_acquire(bytes)) {
        r = *got;
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline)
        throw run_error(diagnose_locked(
            fmt::format("timed out after {} s waiting for room for the gradient of {} ({} bytes)",
                        timeout_.count() / 1000.0, states_[i].p->name, bytes)));
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
    queue_.push_back(Job{i, r, std::move(ready), last_micro_, part, ctx_, true, g.scalar_type()});
    ++submitted_;
  }
  cv_.notify_all();
}

std::string FullOffloadPipeline::diagnose_locked(const std::string& what) const {
  std::string busy = busy_ >= 0 ? states_[static_cast<std::size_t>(busy_)].p->name : "nothing";
  std::string head;
  if (head_.active)
    head = fmt::format("; head share of step {} at row {} of rows {} to {}", head_.ctx->step, head_.next_row,
                       tied_piece_.first_row(), tied_piece_.end_row());
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
double FullOffloadPipeline::finish_host_step() {
  const auto t_drain = std::chrono::steady_clock::now();
  if (head_submitted_)
    throw run_error(
        fmt::format("offload = \"full\": the gradient of {} ended at the LM head's share; the "
                    "input embedding's share never arrived",
                    states_[*tied_].p->name));
  const bool defer = defer_ && ctx_->single_micro;
  {
    std::lock_guard lk(mu_);
    for (std::size_t i = 0; i < states_.size(); ++i)
      if (!got_last_grad_[i]) {
        queue_.push_back(Job{i, StagingRing::Range{}, dev::Marker(), true, Part::no_grad, ctx_, false});
        ++submitted_;
      }
    // What is left runs in the order the next forward needs it (earliest_needed_locked;
    // the head share of a split embedding after all of it: next_work_locked).
    if (defer) pending_step_ = ctx_->step;
  }
  cv_.notify_all();
  if (defer) {
    // One micro-batch: the whole norm was summed on the device, in the hooks.
    double norm_sq = device_norm_sq();
    if (dp_) norm_sq = dp_->sum_pieces(norm_sq, "the sum of the gradient norms");
    const double norm = std::sqrt(norm_sq);
    std::lock_guard lk(mu_);
    stats_.drain_s = seconds_since(t_drain);
    return norm;
  }
  finish_pending();
  double norm_sq = gsq_host_ + (ctx_->single_micro ? device_norm_sq() : 0.0);
  if (dp_) norm_sq = dp_->sum_pieces(norm_sq, "the sum of the gradient norms");
  std::lock_guard lk(mu_);
  stats_.drain_s = seconds_since(t_drain);
  return std::sqrt(norm_sq);
}

// The squared global norm of the norms the hooks wrote (FP32 per parameter, summed
// in FP64, as NoOffload does).
double FullOffloadPipeline::device_norm_sq() const {
  return grad_norms_.to(torch::kFloat64).square().sum().item<double>();
}

// Waits until the worker has run every queued job; the compute stream then waits
// for the last upload.
void FullOffloadPipeline::finish_pending() {
  if (!worker_.joinable()) return;
  dev::Marker last;
  {
    std::unique_lock lk(mu_);
    draining_ = true;
    cv_.notify_all();
    const bool done = cv_.wait_for(lk, timeout_, [&] { return processed_ == submitted_ || error_; });
    draining_ = false;
    if (error_) std::rethrow_exception(error_);
    if (!done)
      throw run_error(diagnose_locked(
          fmt::format("timed out after {} s waiting for the CPU optimizer", timeout_.count() / 1000.0)));
    last = std::move(last_upload_);
    last_upload_ = dev::Marker();
    pending_step_ = 0;
  }
  last.wait_on(dev::current_stream(device_));
}

// Transformer::BlockHook: before the forward uses the weights of `block` (-1: the
// embedding lookup; the layer count: the final norm and the LM head), wait on the
// host until the deferred updates of those parameters are queued, then make the
// compute stream wait for their uploads.
void FullOffloadPipeline::wait_for_block(int block) {
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
    if (&group == &head_group_ && tied_ && dp_ && head_.active && !head_.rows_requested) {
      head_.rows_requested = true;  // sharded, the LM head asks for the whole share here
      cv_.notify_all();
    }
    auto ready = [&] {
      if (error_) return true;
      for (auto i : group) {
        // A split tied embedding: the lookup reads only the batch's rows; the LM head
        // waits for its rows in the loss (wait_for_head_rows). Sharded, the LM head's
        // unit gathers the whole embedding, so it waits for all of it here.
        if (block >= 0 && tied_ && i == *tied_ && !dp_) continue;
        const bool lookup_of_tied = block < 0 && tied_ && i == *tied_ && lookup_by_rows();
        if ((lookup_of_tied ? lookup_done_step_ : done_step_[i]) < pending_step_) return false;
      }
      return true;
    };
    if (!cv_.wait_for(lk, timeout_, ready))
      throw run_error(diagnose_locked(
          fmt::format("timed out after {} s waiting for the updates the forward pass needs before block {}",
                      timeout_.count() / 1000.0, block)));
    if (error_) std::rethrow_exception(error_);
    uploaded = last_upload_;  // the h2d stream is one queue: this covers the group's uploads
    if (trace_.on())
      trace_.span("main", fmt::format("wait for block {}", block), h_wait, HostTrace::now(), pending_step_);
    if (&group == &head_group_ && (!tied_ || dp_)) pending_step_ = 0;  // every parameter is in some group
    stats_.defer_wait_s += seconds_since(t_wait);
  }
  uploaded.wait_on(dev::current_stream(device_));
}

// Transformer::HeadRowsHook: before the loss reads rows [first, end) of a split tied
// embedding, wait until the last step's deferred update of them is queued: its batch
// rows, and the head share's slices (done in row order) up to `end`. With vocabulary
// chunks the rest of the head share so runs beside the loss's first pass.
void FullOffloadPipeline::wait_for_head_rows(std::int64_t first, std::int64_t end) {
  // Not split: the LM head is one job of the head group. Sharded: the head's unit
  // waited for the whole tied embedding before it was gathered.
  if (!tied_ || dp_) return;
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
    if (!cv_.wait_for(lk, timeout_, ready))
      throw run_error(diagnose_locked(
          fmt::format("timed out after {} s waiting for the updates of rows {} to {} of the LM head",
                      timeout_.count() / 1000.0, first, end)));
    if (error_) std::rethrow_exception(error_);
    uploaded = last_upload_;
    if (trace_.on())
      trace_.span("main",
                  fmt::format("wait for block {} (LM head rows {}-{})", block_groups_.size(), first, end),
                  h_wait, HostTrace::now(), pending_step_);
    if (end >= tied_piece_.end_row()) pending_step_ = 0;  // the last group
    stats_.defer_wait_s += seconds_since(t_wait);
  }
  uploaded.wait_on(dev::current_stream(device_));
}

}  // namespace primecfg::train
