// offload = "full": masters, moments and gradient accumulators in host RAM, updated
// by CPU threads while backward goes on. The hook of each parameter queues its
// gradient on a copy stream into a pinned staging ring and hands it to a CPU worker
// thread; the worker waits for the copy, runs the fused CPU kernel over the thread
// pool (bf16 weights written into a pinned upload ring) and an upload thread queues
// the upload on a second copy stream. finish_step() hands over the parameters that
// got no gradient; with one micro-batch per step the updates still running then
// finish beside the next forward, which waits block by block for its weights, and
// a tied embedding is updated in two parts (the rows the batch does not touch from
// the LM head's share of its gradient, as backward starts). On the CPU the same code
// runs with host memory: no streams, copies are synchronous.
//
// The code is in three files: full_offload.cpp (the calls the training loop makes,
// the hook's side, the waits of the next forward), worker.cpp (the CPU worker and
// the uploads) and tied.cpp (the tied embedding's two parts).
//
// Internal to primecfg-train. The calls the training loop makes are listed in
// offload/pipeline.hpp.
#pragma once

#include "base/device_streams.hpp"
#include "base/host_trace.hpp"
#include "base/run_error.hpp"
#include "base/staging_ring.hpp"
#include "base/task_thread.hpp"
#include "offload/shared/param_state.hpp"
#include "offload/shared/test_seams.hpp"
#include "optim/cpu/thread_pool.hpp"
#include "options.hpp"

#include <primecfg/offload.hpp>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace primecfg::train {

class FullOffloadPipeline {
 public:
  using strategy = FullOffload;

  FullOffloadPipeline(Transformer& model, const OptSettings& opt, const RunOptions& run, Sharding* dp);
  FullOffloadPipeline(const FullOffloadPipeline&) = delete;
  FullOffloadPipeline& operator=(const FullOffloadPipeline&) = delete;
  ~FullOffloadPipeline();

  std::vector<ParamState>& states() { return states_; }
  // Masters start as (or are reset to) the model's forward weights.
  void masters_from_model();
  // Waits for the updates and copies still writing host state (before a checkpoint
  // reads it, and at the end of a run).
  void sync_host();

  void begin_step(double lr, std::int64_t step, bool single_micro_batch);
  // Before the last micro-batch's forward, with its input ids and those of every rank's
  // last micro-batch (sharded; the same ids in one process): the tied embedding's split
  // needs the rows they touch. Every rank reads the whole batch, so no collective is
  // needed for the union (one would wait for the copies queued before it).
  void begin_last_micro_batch(const std::vector<std::int64_t>& input_ids,
                              const std::vector<std::int64_t>& every_ranks_ids);
  void before_backward() { spans_.backward_begins(step_); }
  // Transformer::hidden's hook: the forward waits there for the deferred updates of
  // the weights it is about to use.
  const Transformer::BlockHook* block_hook() const { return &block_hook_; }
  // The hooks for Transformer::loss (`last`: the step's last micro-batch).
  Transformer::LossHooks loss_hooks(bool last) const {
    return {last ? head_grad_hook() : nullptr, &rows_hook_};
  }
  // How Transformer::loss walks the logits of a micro-batch of `tokens` tokens:
  // vocabulary chunks with a tied embedding (split or not, so that both compute the
  // same loss and gradients: the tests compare them bit for bit) where
  // vocab_chunked_loss says so.
  Transformer::LossChunks loss_chunks(std::int64_t tokens) const;
  // After the last backward: hands over what is left; the global norm before clipping.
  double finish_step();
  void end_step() { spans_.step_ends(step_); }
  // Its hooks run host work each step (copies, waits, the CPU worker): never replayed.
  bool replayable() const { return false; }
  void captured() { throw std::logic_error("a CUDA graph of this pipeline's step"); }
  void replayed() { throw std::logic_error("a CUDA graph of this pipeline's step"); }
  void capture_failed() { throw std::logic_error("a CUDA graph of this pipeline's step"); }

  // What the copy pipelines and the CPU worker did in the last step.
  std::map<std::string, double> pipeline_stats() const;
  std::map<std::string, double> host_bytes() const;

 private:
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
    // Sharded: the batch rows whole in this rank's piece (rows of the piece, on the
    // device), and the elements of the batch rows the piece holds (cut rows too): the
    // staged final gradient holds those only (piece_batch_rows).
    Tensor piece_rows_dev;
    std::int64_t piece_batch_elems = 0;
  };
  // What a staged gradient holds.
  enum class Part {
    whole,       // the parameter's gradient
    batch_rows,  // tied embedding: the final gradient of the batch's rows only (the head share: HeadShare)
    no_grad,     // nothing staged: the parameter got no gradient in the last micro-batch
  };

  struct Job {
    std::size_t param = 0;
    StagingRing::Range slot;
    dev::Marker ready;
    bool last = false;
    Part part = Part::whole;
    std::shared_ptr<const StepContext> ctx;
    bool has_slot = true;                        // holds a range of the staging ring
    torch::ScalarType dtype = torch::kBFloat16;  // of the staged gradient
  };

  // What the worker runs next (next_work_locked).
  struct Work {
    enum class Kind { job, head_slice, head_lookup, head_wait } kind = Kind::job;
    Job job;                           // job
    std::int64_t first = 0, last = 0;  // head_slice: rows [first, last)
    std::vector<std::int64_t> rows;    // head_lookup
    dev::Marker head_ready;            // the other kinds: the copy of the head share's rows they read
  };

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

  // --- offload/full/full_offload.cpp: the hook's side, the hand-over, the next forward's waits ---
  void start_host_pipeline();
  std::size_t ring_for(std::size_t largest, std::size_t total) const;
  void submit_gradient(std::size_t i, const Tensor& g);
  // The dtype parameter i's gradient is staged in: the parameter's, or sharded the
  // reduce dtype of its piece. Sharded over one rank, a piece is the gradient widened to
  // the reduce dtype (a sum of one term): narrowed back to the parameter's dtype it holds
  // the same values, in half the bytes over PCIe and in the staging ring (FP32
  // reductions of bf16 gradients), so it is staged in the parameter's.
  torch::ScalarType staged_dtype(std::size_t i) const;
  dev::Marker copy_to_host(const Tensor& staged, const Tensor& g);
  void stage(std::size_t i, const Tensor& g, Part part);
  std::string diagnose_locked(const std::string& what) const;
  double finish_host_step();
  double device_norm_sq() const;
  void finish_pending();
  void wait_for_block(int block);
  void wait_for_head_rows(std::int64_t first, std::int64_t end);

  // --- worker.cpp: the CPU worker and the uploads -----------------------------------
  static const char* part_name(Part p);
  void worker_main();
  Work next_work_locked();
  bool head_runnable_locked() const;
  std::size_t earliest_needed_locked() const;
  int needed_at(const Job& j) const;
  void finish_work_locked(const Work& w, std::int64_t step);
  std::string work_name(const Work& w) const;
  void release_in_order_locked(const StagingRing::Range& r);
  void consume(const Job& job);
  void update_host(std::size_t i, const Tensor& grad, const StepContext& c);
  void count_update(std::chrono::steady_clock::time_point t_kernel, std::size_t upload_bytes);
  void queue_upload(TaskThread::Task copy, bool used_slot);
  void note_upload(bool used_slot, const dev::Marker& done);
  Tensor upload_slot(const Tensor& w);
  Tensor upload_slot(torch::ScalarType dtype, torch::IntArrayRef sizes);

  // --- tied.cpp: the tied embedding in two parts ------------------------------------
  // The hook for Transformer::loss on the last micro-batch; null when this step does
  // not split the tied embedding's update.
  const Transformer::HeadGradHook* head_grad_hook() const { return split_tied_ ? &head_hook_ : nullptr; }
  void submit_head_rows(std::int64_t first_row, const Tensor& rows);
  void request_lookup_rows(const std::vector<std::int64_t>& ids);
  void settle_tied_locked(std::int64_t step);
  EmbeddingSpans embedding_spans(const StepContext& c, const Tensor& grad, std::uint16_t* out16);
  Tensor head_buf_view() const;
  void update_embedding_rows(const Tensor& grad, bool grad_by_row, const std::vector<std::int64_t>& rows,
                             Tensor rows_dev, const StepContext& c);
  void update_head_slice(const StepContext& c, std::int64_t first, std::int64_t last);
  enum class PieceLayout {
    piece,
    rows
  };  // grad laid out as the piece, or as the rows' spans one after another
  void update_piece_rows(const Tensor& grad, PieceLayout layout, const std::vector<std::int64_t>& rows,
                         const StepContext& c);
  Tensor piece_batch_rows(const Tensor& piece) const;

  OptSettings opt_;
  Sharding* dp_;
  HostTrace trace_;
  StepSpans spans_{trace_};
  torch::Device device_ = torch::kCPU;
  torch::TensorOptions dev_;
  std::optional<std::int64_t> ring_bytes_;  // offload.ring_mib
  std::chrono::milliseconds timeout_;       // offload.timeout_s: one wait of the pipeline at most
  int cpu_threads_ = 0;                     // offload.cpu_threads (0: automatic)
  test_seams::FullOffload seams_;
  bool defer_ = false;  // updates left when backward ends run beside the next forward (a GPU)
  std::vector<ParamState> states_;
  GradHooks hooks_;
  double lr_ = 0;
  std::int64_t step_ = 0;
  bool single_micro_ = true, last_micro_ = false;
  dev::MaybeStream h2d_, d2h_;  // copy streams (none on the CPU)
  Tensor grad_norms_;           // FP32 gradient norm per parameter, this step

  // With tied embeddings and one micro-batch per step, the LM head's share of the
  // embedding's gradient comes as backward starts (Transformer::HeadGradHook), and it
  // is final for every row the step's input ids do not touch. Those rows are updated
  // right then; the batch's rows are gathered from the full gradient after backward
  // and updated last. The largest update (a quarter of Qwen3-0.6B's parameters) then
  // runs beside backward instead of after it.
  std::optional<std::size_t> tied_;  // the tied embedding's index in states_
  // The tied embedding's elements this rank updates, of the flattened vocab x hidden
  // ([begin, end)): all in one process, its piece when sharded; and the rows they touch,
  // whole and cut.
  PieceRows tied_piece_;
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
  bool tied_embeddings_ = false;  // the model's (tied_ is set only when split: seams_.split_tied)
  static constexpr std::int64_t kHeadSliceElements = std::int64_t{1} << 22;  // ~1 ms of CPU update
  std::int64_t head_slice_rows_ = 1;
  Tensor head_buf_;                     // pinned: the head share's gradient
  std::vector<char> lookup_done_rows_;  // worker: rows of the head share the lookup job updated
  std::int64_t tied_batch_done_step_ = 0, tied_head_done_step_ = 0;  // the tied embedding's two parts
  std::int64_t lookup_done_step_ = 0;  // the step whose update of the next lookup's rows is done
  bool split_tied_ = false;            // this step splits it (main thread, before backward)
  // This forward's lookup waits for its rows only (sharded: read by rows, with the split).
  bool lookup_by_rows() const { return tied_ && (!dp_ || split_tied_); }
  bool head_submitted_ = false;  // the head's share is queued (hook thread; main after backward)

  std::shared_ptr<StepContext> ctx_ = std::make_shared<StepContext>();

  // Deferred updates (defer_): with one micro-batch per step the CPU update
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
  std::unique_ptr<TaskThread> uploader_;  // queues the weight uploads
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
  std::vector<char> acc_valid_;  // worker only: the host accumulator holds this step's sum
  double gsq_host_ = 0;          // with several micro-batches the worker sums the norm on the host

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
