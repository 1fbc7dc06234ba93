#include "distributed/fsdp.hpp"

#include "base/storage_bytes.hpp"
#include "distributed/piece_layout.hpp"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>

namespace primecfg::train {

namespace {

// The order in which backward makes the parameters' gradients: the last parameters
// first (the per-expert loop's experts too: the last expert's first), except a routed
// block's stacked experts. Those come from the stacked GEMMs' backward one projection at
// a time, the last projection first (down, then up, then gate), each for every expert.
std::vector<std::size_t> backward_order(const std::vector<ParamShape>& shapes, bool stacked_experts) {
  std::vector<std::size_t> order;
  order.reserve(shapes.size());
  for (std::size_t k = shapes.size(); k-- > 0;) {
    if (shapes[k].expert < 0 || !stacked_experts) {
      order.push_back(k);
      continue;
    }
    // The block's run of experts [first, k]: each parameter's place within its expert.
    std::size_t first = k;
    while (first > 0 && shapes[first - 1].expert >= 0 && shapes[first - 1].block == shapes[k].block) --first;
    std::vector<std::pair<std::int64_t, std::size_t>> place;  // (place in its expert, index)
    std::int64_t n = 0;
    for (std::size_t j = first; j <= k; ++j) {
      n = j > first && shapes[j].expert == shapes[j - 1].expert ? n + 1 : 0;
      place.emplace_back(n, j);
    }
    // The last projection first; within one, the experts in order (the stacked tensor's
    // backward hands its slices to their parameters first to last).
    std::sort(place.begin(), place.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    for (const auto& [n_in_expert, j] : place) order.push_back(j);
    k = first;
    if (k == 0) break;
  }
  return order;
}

}  // namespace

Fsdp::Fsdp(ProcessGroup& group, const ModelArgs& args, const ShardingOptions& o)
    : group_(group),
      tied_(args.tie_embeddings),
      reduce_dtype_(o.reduce_dtype),
      reshard_after_forward_(o.reshard_after_forward) {
  const torch::TensorOptions weights = o.weights;
  const double bucket_mib = o.bucket_mib;
  const std::vector<ParamShape> shapes = args.params();  // the model's params(), in order
  const MeshDims& mesh = group.mesh();
  const std::int64_t experts = args.moe ? args.moe->experts : 0;
  if (mesh.ep > 1 && (experts == 0 || experts % mesh.ep != 0))
    throw std::logic_error(fmt::format("Fsdp: ep = {} for a model of {} routed experts", mesh.ep, experts));
  std::int64_t total = 0;
  for (const auto& p : shapes) {
    const bool split = mesh.ep > 1 && p.expert >= 0;
    among_.push_back(split ? MeshDim::expert_fsdp : MeshDim::fsdp);
    held_.push_back(holds_expert(mesh, rank(), p.expert, experts));
    spans_.push_back(piece_of(mesh, rank(), p.numel(), p.expert, experts));
    weight_offset_.push_back(total);
    total += spans_.back().per_rank;
  }
  weight_shards_ = torch::zeros({total}, weights.requires_grad(false));
  adopted_.assign(shapes.size(), false);
  checksums_ = torch::zeros({static_cast<std::int64_t>(shapes.size())},
                            weights.dtype(torch::kFloat64).requires_grad(false));

  // The units the forward gathers: the embedding, each block, the final norm and head.
  const auto layers = static_cast<std::size_t>(args.layers);
  units_.resize(layers + 2);
  units_.front().root = units_.back().root = true;
  unit_of_.assign(shapes.size(), 0);
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const ParamShape& p = shapes[i];
    unit_of_[i] = p.name == kEmbeddingParam ? 0
                  : p.block >= 0            ? 1 + static_cast<std::size_t>(p.block)
                                            : layers + 1;
    Unit& unit = units_[unit_of_[i]];
    unit.params.push_back(i);
    if (!held_[i]) continue;
    ++unit.held;
    unit.bytes += p.numel() * static_cast<std::int64_t>(weight_shards_.element_size());
  }
  for (auto& u : units_) {
    u.missing = u.held;
    u.state = Unit::released;
  }
  hook_.before = [this](int block) {
    const std::size_t u = unit_of_block(block);
    if (u == 0 && !lookup_rows_.empty() && units_[0].state == Unit::released)
      gather_lookup_rows();
    else
      gather(u);
    if (u == 0) {
      if (units_[0].state == Unit::whole) lookup_rows_gathered_ = 0;
      lookup_rows_.clear();
      lookup_rows_dev_ = Tensor();
    }
    if (u + 1 < units_.size()) prefetch(u + 1);
  };
  hook_.after = [this](int block, const Tensor& out) {
    const std::size_t u = unit_of_block(block);
    if (units_[u].root || !reshard_after_forward_) return;
    release(u);
    // Gathered again when its output's gradient arrives, just before its backward (or,
    // under activation checkpointing, its recompute) needs the weights; the block
    // below is prefetched then.
    if (out.requires_grad())
      out.register_hook([this, u](const Tensor&) {
        gather(u);
        if (u > 1) prefetch(u - 1);
      });
  };

  // Buckets of about bucket_mib of full-size gradients in the reduce dtype, in the order
  // backward makes them (backward_order). Buckets go out in their order only, the same on
  // every rank, so a gradient that comes before the ones ahead of it in its bucket's
  // order waits. A routed block's experts are buckets of their own, closed where they
  // end: a bucket that spanned them and the router would hold every expert's gradient
  // until the attention's backward. The experts this rank does not hold are in none.
  const double limit = bucket_mib * 1024 * 1024;
  const double elem = static_cast<double>(c10::elementSize(reduce_dtype_));
  bucket_of_.assign(shapes.size(), 0);
  double open_bytes = 0;
  bool open_experts = false;
  for (const std::size_t k : backward_order(shapes, o.stacked_experts)) {
    if (!held_[k]) continue;
    const bool experts = shapes[k].expert >= 0;
    if (buckets_.empty() || open_bytes >= limit || buckets_.back().among != among_[k] ||
        open_experts != experts) {
      buckets_.emplace_back();
      buckets_.back().among = among_[k];
      open_bytes = 0;
      open_experts = experts;
    }
    buckets_.back().params.push_back(k);
    bucket_of_[k] = buckets_.size() - 1;
    open_bytes += static_cast<double>(spans_[k].padded(members(k))) * elem;
  }
  for (auto& b : buckets_) b.missing = b.params.size();
  inputs_.resize(shapes.size());
  handed_.assign(shapes.size(), false);
}

void Fsdp::adopt(std::size_t i, NamedParam& p) {
  if (i >= spans_.size() || p.tensor.numel() != spans_[i].numel)
    throw std::logic_error(
        fmt::format("Fsdp::adopt: {} is not parameter {} of the model it was made for", p.name, i));
  torch::NoGradGuard ng;
  const ShardSpan& s = spans_[i];
  if (s.length > 0)
    weight_shard(i).narrow(0, 0, s.length).copy_(p.tensor.detach().reshape(-1).narrow(0, s.offset, s.length));
  checksums_.narrow(0, static_cast<std::int64_t>(i), 1)
      .copy_(p.tensor.detach().sum(torch::kFloat64).reshape({1}));
  free_bytes(p.tensor);
  adopted_[i] = true;
}

void Fsdp::attach(Transformer& model) {
  if (model.params().size() != spans_.size() ||
      std::find(adopted_.begin(), adopted_.end(), false) != adopted_.end())
    throw std::logic_error("Fsdp::attach: a parameter of the model was not adopted");
  model_ = &model;
  // The ranks built their weights apart: the same, or the pieces would not fit
  // together. Each whole parameter's sum, compared across the ranks.
  const Tensor sums = checksums_.cpu();
  const std::uint64_t h = XXH64(sums.data_ptr(), sums.nbytes(), 0);
  group_.check_same(
      "the sum of the weights each rank built (drawn from the data seed, or read from model.name)", h);
}

std::size_t Fsdp::unit_of_block(int block) const {
  if (block < 0) return 0;
  return std::min(static_cast<std::size_t>(block) + 1, units_.size() - 1);
}

Tensor Fsdp::weight_shard(std::size_t i) const {
  return weight_shards_.narrow(0, weight_offset_[i], spans_[i].per_rank);
}

void Fsdp::start(std::size_t u) {
  // A tied embedding that the lookup read by rows is gathered whole with the LM head.
  if (u + 1 == units_.size() && tied_ && units_.front().state == Unit::rows) start(0);
  Unit& unit = units_[u];
  if (unit.state != Unit::released && unit.state != Unit::rows) return;
  const bool allocated = unit.state == Unit::rows;
  torch::NoGradGuard ng;
  auto& params = model_->params();
  unit.outs.clear();
  unit.moving.clear();
  unit.pending.clear();
  // One all-gather of the dense weights over the shard group, one of this rank's
  // experts over the ranks that split them.
  for (const MeshDim among : {MeshDim::fsdp, MeshDim::expert_fsdp}) {
    std::vector<Tensor> ins, outs;
    std::vector<std::size_t> moving;
    for (auto i : unit.params) {
      if (!held_[i] || among_[i] != among) continue;
      const ShardSpan& s = spans_[i];
      if (!allocated) alloc_bytes(params[i].tensor);
      // The same bytes without autograd's version counter: refilling a weight that a
      // saved graph holds is not an in-place change of what it computed with. A padded
      // parameter is gathered apart and copied in when it has arrived.
      Tensor data = params[i].tensor.variable_data();
      const std::int64_t padded = s.padded(members(i));
      const bool direct = padded == s.numel && data.is_contiguous();
      ins.push_back(weight_shard(i));
      outs.push_back(direct ? data.view({-1}) : torch::empty({padded}, weight_shards_.options()));
      moving.push_back(i);
    }
    if (moving.empty()) continue;
    unit.pending.push_back(
        group_.all_gather_start(outs, ins,
                                fmt::format("the all-gather of {}'s {} ({} to {})",
                                            u == 0                   ? std::string("the embedding")
                                            : u + 1 == units_.size() ? std::string("the LM head")
                                                                     : fmt::format("block {}", u - 1),
                                            among == MeshDim::fsdp ? "weights" : "experts",
                                            params[moving.front()].name, params[moving.back()].name),
                                among));
    unit.outs.insert(unit.outs.end(), outs.begin(), outs.end());
    unit.moving.insert(unit.moving.end(), moving.begin(), moving.end());
  }
  unit.state = Unit::in_flight;
  if (allocated) return;
  whole_now_ += unit.bytes;
  whole_peak_ = std::max(whole_peak_, whole_now_);
}

void Fsdp::lookup_rows(std::vector<std::int64_t> rows, Tensor rows_on_device) {
  lookup_rows_ = std::move(rows);
  lookup_rows_dev_ = std::move(rows_on_device);
}

// Each rank writes the elements of the rows that its piece holds into a table of the
// rows (zeros elsewhere); summed over the shard group, the table holds the rows whole
// (x + 0 is exact in any dtype) and goes into their place in the embedding. Its other
// rows are garbage until the gather with the LM head: the lookup does not read them,
// and its backward reads no weights.
void Fsdp::gather_lookup_rows() {
  Unit& unit = units_[0];
  const std::size_t i = unit.params.front();
  torch::NoGradGuard ng;
  const Tensor& param = model_->params()[i].tensor;
  alloc_bytes(param);
  whole_now_ += unit.bytes;
  whole_peak_ = std::max(whole_peak_, whole_now_);
  unit.state = Unit::rows;
  const Tensor data = param.variable_data();
  const std::int64_t dim = data.size(1), k = static_cast<std::int64_t>(lookup_rows_.size());
  lookup_rows_gathered_ = k;
  const ShardSpan& s = spans_[i];
  const Tensor piece = weight_shard(i).narrow(0, 0, s.length);
  const PieceRows pr{dim, s.offset, s.offset + s.length};
  const std::int64_t row0 = pr.first_whole(), row_end = pr.end_whole();
  const Tensor& rows = lookup_rows_dev_;
  Tensor table;
  if (row_end > row0) {
    // The piece's whole rows, read clamped and kept where the row is the piece's.
    const Tensor whole =
        piece.narrow(0, row0 * dim - pr.begin, (row_end - row0) * dim).view({row_end - row0, dim});
    const Tensor mine = rows.ge(row0).logical_and(rows.lt(row_end)).unsqueeze(1);
    table =
        whole.index_select(0, (rows - row0).clamp(0, row_end - row0 - 1)).masked_fill_(mine.logical_not(), 0);
  } else {
    table = torch::zeros({k, dim}, data.options());
  }
  pr.for_each_cut_row([&](std::int64_t r) {
    const auto at = std::lower_bound(lookup_rows_.begin(), lookup_rows_.end(), r);
    if (at == lookup_rows_.end() || *at != r) return;
    table[at - lookup_rows_.begin()]
        .narrow(0, pr.from(r) - r * dim, pr.held(r))
        .copy_(piece.narrow(0, pr.from(r) - pr.begin, pr.held(r)));
  });
  group_.all_reduce_sum(table, "the embedding rows of the lookup (tied, gathered by rows)", MeshDim::fsdp);
  data.index_copy_(0, rows, table);
}

void Fsdp::gather(std::size_t u) {
  // With the LM head, a tied embedding that the lookup read by rows (start()).
  if (u + 1 == units_.size() && tied_ &&
      (units_.front().state == Unit::rows || units_.front().state == Unit::in_flight))
    gather(0);
  Unit& unit = units_[u];
  ahead_ += unit.state == Unit::in_flight;  // started before it was needed
  start(u);
  if (unit.state != Unit::in_flight) return;
  for (auto& p : unit.pending) p.wait();
  unit.pending.clear();
  torch::NoGradGuard ng;
  auto& params = model_->params();
  for (std::size_t k = 0; k < unit.outs.size(); ++k) {
    const std::size_t i = unit.moving[k];
    Tensor data = params[i].tensor.variable_data().view({-1});
    if (unit.outs[k].data_ptr() != data.data_ptr()) data.copy_(unit.outs[k].narrow(0, 0, spans_[i].numel));
  }
  unit.outs.clear();
  unit.moving.clear();
  unit.state = Unit::whole;
}

void Fsdp::release(std::size_t u) {
  Unit& unit = units_[u];
  if (unit.state == Unit::released) return;
  if (unit.state == Unit::in_flight) gather(u);  // never free bytes a collective still writes
  for (auto i : unit.params) free_bytes(model_->params()[i].tensor);
  unit.state = Unit::released;
  whole_now_ -= unit.bytes;
  prefetch_if_room();
}

void Fsdp::prefetch(std::size_t u) {
  if (!prefetches()) return;
  want_ = u;
  prefetch_if_room();
}

void Fsdp::prefetch_if_room() {
  if (want_ == 0) return;
  if (reshard_after_forward_) {
    int blocks = 0;
    for (const Unit& unit : units_) blocks += !unit.root && unit.state != Unit::released;
    if (blocks >= 2) return;
  }
  const std::size_t u = want_;
  want_ = 0;
  start(u);
}

std::vector<std::pair<std::string, double>> Fsdp::take_metrics() {
  constexpr double GiB = 1 << 30;
  std::vector<std::pair<std::string, double>> m{
      {"fsdp_whole_after_forward_gib", static_cast<double>(whole_after_forward_) / GiB},
      {"fsdp_whole_at_rest_gib", static_cast<double>(gathered_bytes()) / GiB},
      {"fsdp_whole_peak_gib", static_cast<double>(whole_peak_) / GiB},
      {"fsdp_gathers_ahead", static_cast<double>(ahead_)},
      {"fsdp_reduce_scatters", static_cast<double>(reduces_)},
      {"fsdp_reduces_overlapped", static_cast<double>(overlapped_)},
      {"fsdp_lookup_rows", static_cast<double>(lookup_rows_gathered_)},
      {"fsdp_grads_waiting_peak_gib", static_cast<double>(waiting_peak_) / GiB},
  };
  waiting_peak_ = waiting_;
  whole_peak_ = whole_now_;
  ahead_ = 0;
  overlapped_ = 0;
  reduces_ = 0;
  return m;
}

void Fsdp::add_grad(std::size_t i, const Tensor& grad) {
  if (!held_[i])
    throw std::logic_error(
        fmt::format("Fsdp::add_grad: a gradient of {}, which another expert-parallel rank "
                    "runs (its forward must hand the tokens there)",
                    model_->params()[i].name));
  if (world() == 1) {
    // One rank in all: its piece is the whole gradient, and the reduce-scatter (and the
    // all-reduce across replicas) would sum one term, which in model.reduce_dtype holds
    // the same values. So the gradient goes to the sink as it is, now, with no bucket
    // and no copy (their launches were most of a one-rank backward's extra host time).
    handed_[i] = true;
    Tensor piece = grad.reshape({-1});
    sink_(i, piece);
    Unit& unit = units_[unit_of_[i]];
    if (--unit.missing == 0 && !unit.root) release(unit_of_[i]);
    return;
  }
  // Kept as autograd made it until its bucket goes out (launch): a routed block's experts'
  // gradients are views of one stacked gradient, which a copy in the reduce dtype now
  // would double while they wait for the buckets before theirs.
  waiting_ += static_cast<std::int64_t>(grad.nbytes());
  waiting_peak_ = std::max(waiting_peak_, waiting_);
  inputs_[i] = grad;
  --buckets_[bucket_of_[i]].missing;
  launch_ready();
  // The unit's backward is done once its last gradient is in: its weights go.
  Unit& unit = units_[unit_of_[i]];
  if (--unit.missing == 0) {
    hand_empty(unit_of_[i]);
    if (!unit.root) release(unit_of_[i]);
  }
}

void Fsdp::hand_empty(std::size_t u) {
  for (auto i : units_[u].params) {
    if (held_[i] || handed_[i]) continue;
    handed_[i] = true;
    Tensor none = torch::empty({0}, weight_shards_.options().dtype(reduce_dtype_));
    sink_(i, none);
  }
}

void Fsdp::launch_ready() {
  while (next_ < buckets_.size() && buckets_[next_].missing == 0) launch(next_++);
}

Tensor Fsdp::reduce_input(std::size_t i, Tensor grad) const {
  const ShardSpan& s = spans_[i];
  const std::int64_t padded = s.padded(members(i));
  if (grad.scalar_type() == reduce_dtype_ && padded == s.numel && grad.is_contiguous())
    return grad.view({-1});
  Tensor in = torch::empty({padded}, grad.options().dtype(reduce_dtype_));
  in.narrow(0, 0, s.numel).copy_(grad.reshape({-1}));
  if (padded > s.numel) in.narrow(0, s.numel, padded - s.numel).zero_();
  return in;
}

void Fsdp::launch(std::size_t b) {
  Bucket& bucket = buckets_[b];
  Reduce r;
  r.bucket = b;
  std::int64_t total = 0;
  for (auto i : bucket.params) total += spans_[i].per_rank;
  // One buffer for the bucket's pieces, so that HSDP sums them over the replicas in one go.
  r.flat = torch::empty({total}, inputs_[bucket.params.front()].options().dtype(reduce_dtype_));
  std::int64_t at = 0;
  for (auto i : bucket.params) {
    waiting_ -= static_cast<std::int64_t>(inputs_[i].nbytes());
    r.ins.push_back(reduce_input(i, std::move(inputs_[i])));
    r.outs.push_back(r.flat.narrow(0, at, spans_[i].per_rank));
    at += spans_[i].per_rank;
  }
  r.pending =
      group_.reduce_scatter_start(r.outs, r.ins, "the reduce-scatter of " + bucket_name(b), bucket.among);
  ++reduces_;
  // The bucket before has been summing while backward went on; its pieces are needed
  // now, so that no more than two buckets (inputs and outputs) are alive at once.
  if (reducing_) {
    finish_reduce();
    ++overlapped_;
  }
  reducing_ = std::move(r);
}

void Fsdp::finish_reduce() {
  if (!reducing_) return;
  Reduce r = std::move(*reducing_);
  reducing_.reset();
  r.pending.wait();
  const Bucket& bucket = buckets_[r.bucket];
  group_.all_reduce_sum(r.flat, "the all-reduce across replicas of " + bucket_name(r.bucket),
                        MeshDim::replicate);
  for (std::size_t k = 0; k < bucket.params.size(); ++k) sink_(bucket.params[k], r.outs[k]);
}

std::string Fsdp::bucket_name(std::size_t b) const {
  const Bucket& bucket = buckets_[b];
  auto& params = model_->params();
  return fmt::format("gradient bucket {} of {} ({} to {})", b + 1, buckets_.size(),
                     params[bucket.params.front()].name, params[bucket.params.back()].name);
}

void Fsdp::flush() {
  torch::NoGradGuard ng;
  if (world() == 1) {
    for (std::size_t i = 0; i < handed_.size(); ++i) {
      if (!handed_[i]) {
        Tensor zeros = torch::zeros({spans_[i].numel}, weight_shards_.options().dtype(reduce_dtype_));
        sink_(i, zeros);
      }
      handed_[i] = false;
    }
    for (auto& u : units_) u.missing = u.params.size();
    return;
  }
  for (std::size_t b = next_; b < buckets_.size(); ++b) {
    for (auto i : buckets_[b].params)
      if (!inputs_[i].defined()) {
        inputs_[i] =
            torch::zeros({spans_[i].padded(members(i))}, weight_shards_.options().dtype(reduce_dtype_));
        waiting_ += static_cast<std::int64_t>(inputs_[i].nbytes());
      }
    buckets_[b].missing = 0;
  }
  launch_ready();
  finish_reduce();
  for (std::size_t u = 0; u < units_.size(); ++u) hand_empty(u);
  next_ = 0;
  for (auto& b : buckets_) b.missing = b.params.size();
  for (auto& u : units_) u.missing = u.held;
  std::fill(handed_.begin(), handed_.end(), false);
}

void Fsdp::gather_weights() {
  want_ = 0;
  for (std::size_t u = 0; u < units_.size(); ++u) release(u);
}

void Fsdp::gather_all() {
  for (std::size_t u = 0; u < units_.size(); ++u) gather(u);
  // The experts other expert-parallel ranks hold, whole here too (until the next release).
  torch::NoGradGuard ng;
  for (std::size_t i = 0; i < held_.size(); ++i) {
    if (held_[i]) continue;
    const Tensor& t = model_->params()[i].tensor;
    alloc_bytes(t);
    t.variable_data().copy_(whole_expert(i));
  }
}

Tensor Fsdp::whole_expert(std::size_t i) {
  // Each piece of it is on one rank of the shard group (its expert-parallel place, its
  // place along dp_shard_mod_ep): each rank puts its piece where it goes, zeros elsewhere,
  // and the sum over the shard group is the whole (x + 0 is exact in any dtype).
  torch::NoGradGuard ng;
  const NamedParam& p = model_->params()[i];
  const ShardSpan& s = spans_[i];
  Tensor whole = torch::zeros({s.numel}, weight_shards_.options());
  if (s.length > 0) whole.narrow(0, s.offset, s.length).copy_(weight_shard(i).narrow(0, 0, s.length));
  whole_peak_ = std::max(whole_peak_, whole_now_ + static_cast<std::int64_t>(whole.nbytes()));
  group_.all_reduce_sum(
      whole, fmt::format("the gather of {} from the expert-parallel rank holding it", p.name), MeshDim::fsdp);
  return whole.view(p.tensor.sizes());
}

Tensor Fsdp::whole_weight(std::size_t i) {
  // An expert that expert parallelism splits: by every rank alike, whether it is whole
  // on this one or not (a collective's callers must agree).
  if (among_[i] == MeshDim::expert_fsdp) return whole_expert(i);
  const std::size_t u = unit_of_[i];
  if (units_[u].state == Unit::in_flight) gather(u);
  const NamedParam& p = model_->params()[i];
  if (units_[u].state == Unit::whole) return p.tensor.detach();
  torch::NoGradGuard ng;
  const ShardSpan& s = spans_[i];
  std::vector<Tensor> outs{torch::empty({s.padded(members(i))}, weight_shards_.options())},
      ins{weight_shard(i)};
  whole_peak_ = std::max(whole_peak_, whole_now_ + static_cast<std::int64_t>(outs[0].nbytes()));
  group_.all_gather_start(outs, ins, fmt::format("the all-gather of {} for a checkpoint", p.name)).wait();
  return outs[0].narrow(0, 0, s.numel).view(p.tensor.sizes());
}

std::int64_t Fsdp::gathered_bytes() const {
  std::int64_t n = 0;
  for (const auto& p : model_->params()) n += static_cast<std::int64_t>(p.tensor.storage().nbytes());
  return n;
}

double Fsdp::sum(double v, std::string_view what) {
  Tensor t = torch::full({1}, v, weight_shards_.options().dtype(torch::kFloat64));
  group_.all_reduce_sum(t, what);
  return t.item<double>();
}

double Fsdp::sum_pieces(double v, std::string_view what) {
  Tensor t = torch::full({1}, v, weight_shards_.options().dtype(torch::kFloat64));
  sum_pieces(t, what);
  return t.item<double>();
}

}  // namespace primecfg::train
