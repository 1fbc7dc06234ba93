#include "offload/optimizer/optimizer_offload.hpp"

#include "offload/shared/copies.hpp"
#include "offload/shared/ring_size.hpp"
#include "optim/update_groups.hpp"

#include <algorithm>
#include <tuple>
#include <utility>

namespace primecfg::train {

OptimizerOffloadPipeline::OptimizerOffloadPipeline(Transformer& model, const OptSettings& opt,
                                                   const RunOptions& run, Sharding* dp)
    : opt_(opt),
      dp_(dp),
      trace_(run.profile.host_trace),
      device_(model.device()),
      ring_bytes_(run.offload.ring_bytes()),
      deferred_share_(run.offload.deferred_share.value_or(0)) {
  const bool cuda = !device_.is_cpu();
  dev_ = torch::TensorOptions().dtype(torch::kFloat32).device(device_);
  const auto pinned = torch::TensorOptions().dtype(torch::kFloat32).device(torch::kCPU).pinned_memory(cuda);
  states_ = place_state(model, opt, Placement{dev_, dev_, true, dev_, pinned}, dp);
  masters_from_model();
  if (cuda) {
    h2d_ = dev::side_stream(device_);
    d2h_ = dev::side_stream(device_);
    overlap_ = !opt.max_norm;
  }
  hooks_.install(
      states_, trace_, step_, [this](std::size_t i, ParamState& s, Tensor& g) { on_grad(i, s, g); }, dp);
}

OptimizerOffloadPipeline::~OptimizerOffloadPipeline() {
  hooks_.remove();
  if (prefetch_.valid()) prefetch_.wait();
  try {
    dev::synchronize(d2h_);
    dev::synchronize(h2d_);
    dev::synchronize(tail_h2d_);
  } catch (...) {
  }
}

void OptimizerOffloadPipeline::masters_from_model() {
  torch::NoGradGuard ng;
  sync_host();
  for (auto& s : states_) master_from_weights(s);
}

void OptimizerOffloadPipeline::sync_host() {
  flush_tail_write_back();
  flush_deferred();
  dev::synchronize(d2h_);
  dev::synchronize(h2d_);
  dev::synchronize(tail_h2d_);
}

void OptimizerOffloadPipeline::begin_step(double lr, std::int64_t step, bool single_micro_batch) {
  lr_ = lr;
  step_ = step;
  last_micro_ = single_micro_batch;
  stats_ = Stats{};
  grads_.begin_step(states_.size());
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
    if (!grad_norms_.defined()) grad_norms_ = torch::zeros({static_cast<std::int64_t>(states_.size())}, dev_);
  }
}

void OptimizerOffloadPipeline::begin_last_micro_batch(const std::vector<std::int64_t>&,
                                                      const std::vector<std::int64_t>&) {
  last_micro_ = true;
  spans_.forward_begins();
  if (!overlap_) return;
  // Fetch ahead in the order the last step's hooks fired (the first step has
  // none to go by and fetches as gradients come).
  const bool known = !seen_.empty();
  plan_order(/*split_tail=*/known);
  if (!known) {
    next_fetch_ = order_.size();
    return;
  }
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

void OptimizerOffloadPipeline::before_backward() {
  if (prefetch_.valid()) prefetch_.get();
  spans_.backward_begins(step_);
}

double OptimizerOffloadPipeline::finish_step() {
  const auto began = spans_.finish_begins(step_);
  const double norm = finish_updates();
  spans_.finish_ends(began, step_);
  return norm;
}

double OptimizerOffloadPipeline::finish_updates() {
  grads_.zero_missing(states_);
  if (overlap_) {
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
    Tensor sq = grad_norms_.to(torch::kFloat64).square().sum();
    if (dp_) dp_->sum_pieces(sq, "the sum of the gradient norms");
    return sq.sqrt().item<double>();
  }
  Tensor norm = clip_grad_norm(states_, opt_.max_norm, dp_);
  if (h2d_)
    update_streamed();
  else
    update_resident(states_, opt_, lr_, step_);
  return norm.item<double>();
}

void OptimizerOffloadPipeline::end_step() {
  spans_.step_ends(step_);
  flush_tail_write_back();
  flush_deferred();
}

std::map<std::string, double> OptimizerOffloadPipeline::pipeline_stats() const {
  return {{"d2h_gib", stats_.d2h_bytes / (1024.0 * 1024 * 1024)},
          {"h2d_gib", stats_.h2d_bytes / (1024.0 * 1024 * 1024)}};
}

// The gradient hook: into the device accumulator; without clipping, the update of a
// group once the last micro-batch's gradients of all its members are in.
void OptimizerOffloadPipeline::on_grad(std::size_t i, ParamState& s, Tensor& g) {
  grads_.add(i, s, g);
  if (overlap_ && last_micro_ && !hooked_[i]) {
    hooked_[i] = 1;
    auto& waiting = group_waiting_[group_of_[i]];
    waiting.push_back(i);
    if (waiting.size() == window_groups_[group_of_[i]].size()) update_in_hook(std::exchange(waiting, {}));
  }
}

std::size_t OptimizerOffloadPipeline::ring_for(std::size_t largest, std::size_t total) const {
  return static_cast<std::size_t>(
      ring_capacity(static_cast<std::int64_t>(largest), static_cast<std::int64_t>(total), ring_bytes_));
}

void OptimizerOffloadPipeline::ensure_window() {
  if (window_.defined()) return;
  std::size_t largest = 0, total = 0;
  for (auto& s : states_) {
    // Without clipping the input embedding's moments get a buffer of their own from
    // the second step on (tail_); the window is sized for the rest, as the planner
    // assumes. In the first step they go through the window or temporaries.
    if (overlap_ && s.p->name == kEmbeddingParam) continue;
    const std::size_t b = moment_bytes(s);
    largest = std::max(largest, b);
    total += b;
  }
  window_ring_ = StagingRing(ring_for(largest, total));
  window_ = torch::empty({static_cast<std::int64_t>(window_ring_.capacity())}, dev_.dtype(torch::kUInt8));
  slot_.assign(states_.size(), std::nullopt);
  ready_.assign(states_.size(), dev::Marker());
  written_.assign(states_.size(), dev::Marker());
  updated_.assign(states_.size(), 0);
}

std::pair<Tensor, Tensor> OptimizerOffloadPipeline::window_views(std::size_t i, std::size_t offset) {
  ParamState& s = states_[i];
  const auto n = s.master.numel();
  Tensor region = ring_view(window_, offset, torch::kFloat32, {s.m2.defined() ? 2 * n : n});
  Tensor m1 = region.narrow(0, 0, n).view(s.master.sizes());
  Tensor m2 = s.m2.defined() ? region.narrow(0, n, n).view(s.master.sizes()) : Tensor();
  return {m1, m2};
}

// Queues the upload of parameter i's moments into the window; false when the
// window is full of moments whose updates are not queued yet.
bool OptimizerOffloadPipeline::fetch(std::size_t i) {
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
void OptimizerOffloadPipeline::fetch_ahead() {
  while (next_fetch_ < order_.size()) {
    const std::size_t i = order_[next_fetch_];
    if (!updated_[i] && !slot_[i] && moment_bytes(states_[i]) > 0 && !fetch(i)) return;
    ++next_fetch_;
  }
}

OptimizerOffloadPipeline::DeviceMoments OptimizerOffloadPipeline::moments_for(std::size_t i) {
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
void OptimizerOffloadPipeline::release_moments(std::size_t i, const DeviceMoments& d) {
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
void OptimizerOffloadPipeline::update_one_streamed(std::size_t i) {
  torch::NoGradGuard ng;
  ParamState& s = states_[i];
  updated_[i] = 1;
  // A frozen parameter's update with a zero gradient and a zero rate leaves it as it is,
  // its moments zero (its moments still stream, so the window's order stays the plan's).
  const double lr = s.p->frozen ? 0.0 : lr_;
  if (moment_bytes(s) == 0) {
    update_on_device(opt_, *s.p, s.master, s.grad, nullptr, nullptr, lr, step_,
                     step_t_.defined() ? &step_t_ : nullptr);
    s.weight.copy_(s.master);
    return;
  }
  const DeviceMoments d = moments_for(i);
  Tensor m1 = d.m1, m2 = d.m2;
  update_on_device(opt_, *s.p, s.master, s.grad, &m1, m2.defined() ? &m2 : nullptr, lr, step_,
                   step_t_.defined() ? &step_t_ : nullptr);
  s.weight.copy_(s.master);
  if (d.from == DeviceMoments::From::tail) {
    tail_write_back_ = true;  // queued by end_step()
    return;
  }
  if (d.from == DeviceMoments::From::window && i < defer_.size() && defer_[i]) {
    deferred_.push_back({{i}, {d}});
    slot_[i].reset();
    return;
  }
  write_back({i}, {d});
  release_moments(i, d);
}

// AdamW over the parameters of one update group (make_window_groups) in
// multi-tensor launches: one norm, one update and one weight copy for the group
// instead of each per parameter, and one write-back marker. The same arithmetic as
// update_one_streamed per parameter (and as NoOffload's update), bit for bit.
void OptimizerOffloadPipeline::update_group_streamed(std::vector<std::size_t> members) {
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
    TORCH_CHECK(!s.p->frozen, "OptimizerOffload: frozen ", s.p->name, " in an update group");
    updated_[i] = 1;
    grads.push_back(s.grad);
    masters.push_back(s.master);
    weights.push_back(s.weight);
    moments.push_back(moments_for(i));
    a.push_back(moments.back().m1);
    b.push_back(moments.back().m2);
  }
  Tensor norms =
      grad_norms_.narrow(0, static_cast<std::int64_t>(members.front()), static_cast<std::int64_t>(n));
  at::stack_out(norms, at::_foreach_norm(grads, 2));
  std::vector<Tensor> steps(n, step_t_);
  at::_fused_adamw_(masters, grads, a, b, {}, steps, lr_, opt_.beta1, opt_.beta2, opt_.weight_decay, opt_.eps,
                    false, false);
  at::_foreach_copy_(weights, masters);
  bool defer = true;
  for (std::size_t k = 0; k < n; ++k)
    defer = defer && members[k] < defer_.size() && defer_[members[k]] &&
            moments[k].from == DeviceMoments::From::window;
  if (defer) {
    for (auto i : members) slot_[i].reset();
    deferred_.push_back({std::move(members), std::move(moments)});
    return;
  }
  write_back(members, moments);
  for (std::size_t k = 0; k < n; ++k) release_moments(members[k], moments[k]);
}

void OptimizerOffloadPipeline::record_grad_norm(std::size_t i) {
  Tensor slot = grad_norms_.select(0, static_cast<std::int64_t>(i));
  at::linalg_vector_norm_out(slot, states_[i].grad, 2);
}

// Queues the copies of the updated moments of `params` (on the device: `moments`,
// in the same order) back to host memory after the compute stream's work so far,
// with one marker for all of them.
void OptimizerOffloadPipeline::write_back(const std::vector<std::size_t>& params,
                                          const std::vector<DeviceMoments>& moments) {
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

// Queues the write-backs update_one_streamed and update_group_streamed held back (defer_),
// and frees their window regions once those have run.
void OptimizerOffloadPipeline::flush_deferred() {
  for (auto& d : std::exchange(deferred_, {})) {
    write_back(d.params, d.moments);
    for (std::size_t k = 0; k < d.params.size(); ++k) release_moments(d.params[k], d.moments[k]);
  }
}

void OptimizerOffloadPipeline::flush_tail_write_back() {
  if (!tail_write_back_) return;
  tail_write_back_ = false;
  auto [m1, m2] = tail_views();
  write_back({*tail_}, {DeviceMoments{m1, m2, DeviceMoments::From::tail}});
}

// The order to fetch in: what the last step's hooks saw, then anything else.
// With `split_tail`, the parameter whose gradient came last (the input embedding)
// leaves the window's order for a buffer of its own (see tail_).
void OptimizerOffloadPipeline::plan_order(bool split_tail) {
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
  // Known order (split_tail): the write-backs of the last parameters in it, up to
  // offload.deferred_share of the window, wait for end_step() (defer_).
  defer_.assign(states_.size(), 0);
  if (split_tail) {
    std::size_t held = 0;
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      const std::size_t b = moment_bytes(states_[*it]);
      if (static_cast<double>(held + b) > deferred_share_ * static_cast<double>(window_ring_.capacity()))
        break;
      held += b;
      defer_[*it] = 1;
    }
  }
  for (auto i : order_) in[i] = 1;
  for (std::size_t i = 0; i < states_.size(); ++i)
    if (!in[i]) order_.push_back(i);
  next_fetch_ = 0;
  seen_.clear();
}

std::pair<Tensor, Tensor> OptimizerOffloadPipeline::tail_views() {
  ParamState& s = states_[*tail_];
  const auto n = s.master.numel();
  Tensor m1 = ring_view(tail_buf_, 0, torch::kFloat32, {n}).view(s.master.sizes());
  Tensor m2 =
      s.m2.defined()
          ? ring_view(tail_buf_, static_cast<std::size_t>(n) * 4, torch::kFloat32, {n}).view(s.master.sizes())
          : Tensor();
  return {m1, m2};
}

// Queues the tail's moments into its buffer on its own stream, once its last
// write-back (which read that buffer) has landed in host memory.
void OptimizerOffloadPipeline::fetch_tail() {
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
void OptimizerOffloadPipeline::update_streamed() {
  ensure_window();
  std::fill(updated_.begin(), updated_.end(), 0);
  plan_order(/*split_tail=*/false);
  fetch_ahead();
  for (std::size_t k = 0; k < order_.size(); ++k) {
    update_one_streamed(order_[k]);
    fetch_ahead();
  }
}

// OptimizerOffload without clipping: the update of a group whose gradients are all
// final, from the hook of its last one (members in the order their hooks ran).
void OptimizerOffloadPipeline::update_in_hook(const std::vector<std::size_t>& members) {
  seen_.insert(seen_.end(), members.begin(), members.end());
  if (members.size() > 1) {
    update_group_streamed(members);
  } else {
    record_grad_norm(members.front());
    update_one_streamed(members.front());
  }
  fetch_ahead();
}

// The update groups (optim/update_groups.hpp): with AdamW a transformer block's parameters,
// up to a quarter of the window's moments per group; with other optimizers every
// parameter alone.
void OptimizerOffloadPipeline::make_window_groups() {
  std::vector<int> block(states_.size(), -1);
  std::vector<std::size_t> bytes(states_.size(), 0);
  for (std::size_t i = 0; i < states_.size(); ++i) {
    // A frozen parameter alone: update_one_streamed gives it a zero rate.
    if (opt_.kind == OptKind::adamw && !states_[i].p->frozen) block[i] = states_[i].p->block;
    bytes[i] = moment_bytes(states_[i]);
  }
  window_groups_ = update_groups(block, bytes, window_ring_.capacity() / 4);
  group_of_.assign(states_.size(), 0);
  for (std::size_t g = 0; g < window_groups_.size(); ++g)
    for (auto i : window_groups_[g]) group_of_[i] = g;
  group_waiting_.assign(window_groups_.size(), {});
}

}  // namespace primecfg::train
