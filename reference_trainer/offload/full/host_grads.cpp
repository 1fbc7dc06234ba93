#include "offload/full/host_grads.hpp"

#include <algorithm>
#include <cstdint>

namespace primecfg::train {

using torch::Tensor;

namespace {

// The host's gradient arithmetic with several micro-batches, a slice at a time through
// a small FP32 buffer: ATen adds bf16 to FP32 element by element with dynamic casts, and
// `square().sum()` writes (and page-faults in) a temporary as large as the gradient, which
// together kept the worker off its update kernel for most of a two-micro-batch step
// (docs/performance.md). (ATen's CPU norm, which needs no buffer, sums in FP32 one term
// after another: 2e-5 off over a million terms.)
constexpr std::int64_t kSlice = std::int64_t{1} << 20;

Tensor& slice_buffer() {
  thread_local Tensor buf;  // the worker's own
  if (!buf.defined()) buf = torch::empty({kSlice}, torch::kFloat32);
  return buf;
}

// `g` in FP32: itself when it is, else the slice converted into the buffer.
Tensor as_fp32(const Tensor& g) {
  if (g.scalar_type() == torch::kFloat32) return g;
  Tensor b = slice_buffer().narrow(0, 0, g.numel());
  b.copy_(g);
  return b;
}

}  // namespace

void accumulate_grad(Tensor& acc, const Tensor& g) {
  Tensor a = acc.view(-1), x = g.reshape(-1);
  for (std::int64_t at = 0, n = a.numel(); at < n; at += kSlice) {
    const std::int64_t len = std::min(kSlice, n - at);
    a.narrow(0, at, len).add_(as_fp32(x.narrow(0, at, len)));
  }
}

double squared_norm(const Tensor& g) {
  Tensor x = g.reshape(-1);
  double sum = 0;
  for (std::int64_t at = 0, n = x.numel(); at < n; at += kSlice) {
    const std::int64_t len = std::min(kSlice, n - at);
    Tensor v = as_fp32(x.narrow(0, at, len)), sq = slice_buffer().narrow(0, 0, len);
    at::mul_out(sq, v, v);
    sum += sq.sum().item<double>();  // ATen's sum is pairwise: FP32 error grows with log(len)
  }
  return sum;
}

}  // namespace primecfg::train
