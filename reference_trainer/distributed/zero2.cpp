#include "distributed/zero2.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace primecfg::train {

Zero2::Zero2(ProcessGroup& group, Transformer& model, torch::ScalarType reduce_dtype, double bucket_mib)
    : group_(group), model_(model), reduce_dtype_(reduce_dtype) {
  torch::NoGradGuard ng;
  auto& params = model.params();
  std::int64_t total = 0;
  for (auto& p : params) {
    spans_.push_back(ShardSpan::of(p.tensor.numel(), rank(), world()));
    weight_offset_.push_back(total);
    total += spans_.back().per_rank;
  }
  weight_shards_ = torch::zeros({total}, params.front().tensor.options().requires_grad(false));
  for (std::size_t i = 0; i < params.size(); ++i) {
    const ShardSpan& s = spans_[i];
    if (s.length > 0)
      weight_shard(i)
          .narrow(0, 0, s.length)
          .copy_(params[i].tensor.detach().reshape(-1).narrow(0, s.offset, s.length));
  }
  // Buckets of about bucket_mib of full-size gradients in the reduce dtype, the last
  // parameters first (backward's order).
  const double limit = bucket_mib * 1024 * 1024;
  const double elem = static_cast<double>(c10::elementSize(reduce_dtype));
  bucket_of_.assign(params.size(), 0);
  double bytes = 0;
  for (std::size_t k = params.size(); k-- > 0;) {
    if (buckets_.empty() || bytes >= limit) {
      buckets_.emplace_back();
      bytes = 0;
    }
    buckets_.back().params.push_back(k);
    bucket_of_[k] = buckets_.size() - 1;
    bytes += static_cast<double>(spans_[k].padded(world())) * elem;
  }
  for (auto& b : buckets_) b.missing = b.params.size();
  inputs_.resize(params.size());
}

Tensor Zero2::weight_shard(std::size_t i) const {
  return weight_shards_.narrow(0, weight_offset_[i], spans_[i].per_rank);
}

void Zero2::broadcast_weights() {
  torch::NoGradGuard ng;
  for (auto& p : model_.params()) {
    Tensor t = p.tensor.detach();
    group_.broadcast(t, 0, fmt::format("the broadcast of rank 0's {}", p.name));
  }
}

void Zero2::add_grad(std::size_t i, const Tensor& grad) {
  const ShardSpan& s = spans_[i];
  const std::int64_t padded = s.padded(world());
  Tensor in;
  if (grad.scalar_type() == reduce_dtype_ && padded == s.numel && grad.is_contiguous()) {
    in = grad.view({-1});  // kept alive here until its bucket went out
  } else {
    in = torch::empty({padded}, grad.options().dtype(reduce_dtype_));
    in.narrow(0, 0, s.numel).copy_(grad.reshape({-1}));
    if (padded > s.numel) in.narrow(0, s.numel, padded - s.numel).zero_();
  }
  inputs_[i] = std::move(in);
  --buckets_[bucket_of_[i]].missing;
  launch_ready();
}

void Zero2::launch_ready() {
  while (next_ < buckets_.size() && buckets_[next_].missing == 0) launch(next_++);
}

void Zero2::launch(std::size_t b) {
  Bucket& bucket = buckets_[b];
  std::vector<Tensor> ins, outs;
  for (auto i : bucket.params) {
    ins.push_back(inputs_[i]);
    outs.push_back(torch::empty({spans_[i].per_rank}, inputs_[i].options()));
  }
  auto& params = model_.params();
  group_.reduce_scatter(
      outs, ins,
      fmt::format("the reduce-scatter of gradient bucket {} of {} ({} to {})", b + 1, buckets_.size(),
                  params[bucket.params.front()].name, params[bucket.params.back()].name));
  for (std::size_t k = 0; k < bucket.params.size(); ++k) {
    const std::size_t i = bucket.params[k];
    inputs_[i] = Tensor();
    sink_(i, outs[k]);
  }
}

void Zero2::flush() {
  torch::NoGradGuard ng;
  for (std::size_t b = next_; b < buckets_.size(); ++b) {
    for (auto i : buckets_[b].params)
      if (!inputs_[i].defined())
        inputs_[i] = torch::zeros({spans_[i].padded(world())}, weight_shards_.options().dtype(reduce_dtype_));
    buckets_[b].missing = 0;
  }
  launch_ready();
  next_ = 0;
  for (auto& b : buckets_) b.missing = b.params.size();
}

void Zero2::gather_weights() {
  torch::NoGradGuard ng;
  auto& params = model_.params();
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    std::vector<Tensor> ins, outs;
    std::vector<char> direct;
    for (auto i : buckets_[b].params) {
      const ShardSpan& s = spans_[i];
      Tensor w = params[i].tensor.detach();
      ins.push_back(weight_shard(i));
      const bool d = s.padded(world()) == s.numel && w.is_contiguous();
      direct.push_back(d);
      outs.push_back(d ? w.view({-1}) : torch::empty({s.padded(world())}, weight_shards_.options()));
    }
    group_.all_gather(
        outs, ins, fmt::format("the all-gather of updated weights, bucket {} of {}", b + 1, buckets_.size()));
    for (std::size_t k = 0; k < outs.size(); ++k) {
      if (direct[k]) continue;
      const std::size_t i = buckets_[b].params[k];
      params[i].tensor.detach().view({-1}).copy_(outs[k].narrow(0, 0, spans_[i].numel));
    }
  }
}

double Zero2::sum(double v, std::string_view what) {
  Tensor t = torch::full({1}, v, weight_shards_.options().dtype(torch::kFloat64));
  group_.all_reduce_sum(t, what);
  return t.item<double>();
}

}  // namespace primecfg::train
