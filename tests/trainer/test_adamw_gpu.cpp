// offload = "none"'s update on the fused AdamW kernel (reference_trainer/optim/kernels)
// against ATen's path for the same step (clip_grad_norm, _fused_adamw_, the weight copy)
// and against AdamW in FP64: parameters of odd sizes, misaligned ones (the scalar path),
// one larger than a chunk, with and without clipping, over several steps. Skips where
// there is no CUDA device or the build has no kernels.
//
// Tolerances: the kernel does _fused_adamw_'s FP32 arithmetic in its order, so without
// clipping masters and moments must equal ATen's bit for bit (measured on the H200);
// with clipping the factor comes from a norm summed per chunk instead of per parameter
// (1e-7 apart), 1e-5 of each tensor's largest value, still far below a missing term
// (weight decay, a bias correction: 1e-3 and more). The weights must be the masters
// rounded to bf16, exactly; the norm within 1e-6 of FP64's.
#include "nn/kernels/fused_ops.hpp"
#include "offload/shared/device_update.hpp"

#include <doctest/doctest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>
#include <deque>
#include <string>
#include <vector>

namespace {

using torch::Tensor;
namespace train = primecfg::train;

torch::TensorOptions f32() { return torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32); }

// n values from a buffer of n + offset, starting `offset` elements in (offset 1: a
// pointer 4 bytes past a 16-byte boundary, for the scalar path).
Tensor fresh(std::int64_t n, std::int64_t offset, torch::TensorOptions o, double scale) {
  return (torch::randn({n + offset}, o.dtype(torch::kFloat32)) * scale).to(o.dtype()).narrow(0, offset, n);
}

// The model's parameter a state updates (its tensor is the weights the step writes; the
// update reads its dtype and whether it is frozen). Kept for the process: states point to it.
train::NamedParam* param_of(const Tensor& weight) {
  static std::deque<train::NamedParam> params;
  params.push_back({"p" + std::to_string(params.size()), weight});
  return &params.back();
}

std::vector<train::ParamState> make_states(const std::vector<std::pair<std::int64_t, std::int64_t>>& shapes) {
  std::vector<train::ParamState> states;
  for (auto [n, offset] : shapes) {
    train::ParamState s;
    s.master = fresh(n, offset, f32(), 0.05);
    s.grad = fresh(n, offset, f32(), 1e-3);
    s.m1 = fresh(n, offset, f32(), 1e-4);
    s.m2 = fresh(n, offset, f32(), 1e-6).abs();
    s.weight = fresh(n, offset, f32().dtype(torch::kBFloat16), 1);
    s.p = param_of(s.weight);
    states.push_back(std::move(s));
  }
  return states;
}

std::vector<train::ParamState> clone(const std::vector<train::ParamState>& in) {
  std::vector<train::ParamState> out;
  for (const auto& s : in) {
    train::ParamState c;
    c.master = s.master.clone();
    c.grad = s.grad.clone();
    c.m1 = s.m1.clone();
    c.m2 = s.m2.clone();
    c.weight = s.weight.clone();
    c.p = param_of(c.weight);
    out.push_back(std::move(c));
  }
  return out;
}

double max_rel(const Tensor& got, const Tensor& ref) {
  const Tensor g = got.to(torch::kFloat64), r = ref.to(torch::kFloat64);
  return ((g - r).abs() / r.abs().clamp_min(1e-30)).max().item<double>();
}

// The largest difference relative to the tensor's largest value (a moment near zero
// is not magnified).
double max_diff(const Tensor& got, const Tensor& ref) {
  const Tensor g = got.to(torch::kFloat64), r = ref.to(torch::kFloat64);
  return ((g - r).abs().max() / r.abs().max().clamp_min(1e-30)).item<double>();
}

// AdamW in FP64 from the same FP32 inputs: what both paths approximate.
struct Fp64 {
  std::vector<Tensor> p, m, v;
  void step(const std::vector<train::ParamState>& in, const train::OptSettings& o, double lr, int t,
            double clip) {
    for (std::size_t i = 0; i < in.size(); ++i) {
      if (p.size() <= i) {
        p.push_back(in[i].master.to(torch::kFloat64));
        m.push_back(in[i].m1.to(torch::kFloat64));
        v.push_back(in[i].m2.to(torch::kFloat64));
      }
      const Tensor g = in[i].grad.to(torch::kFloat64) * clip;
      p[i] = p[i] * (1 - lr * o.weight_decay);
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
      const double b1 = 1 - std::pow(o.beta1, t), b2 = 1 - std::pow(o.beta2, t);
      p[i] = p[i] - lr / b1 * m[i] / (v[i].sqrt() / std::sqrt(b2) + o.eps);
    }
  }
};

void adamw_case(std::optional<double> max_norm) {
  CAPTURE(max_norm.value_or(0));
  torch::manual_seed(3);
  // Sizes: one value; odd; a multiple of 4 misaligned; just over one chunk (32768);
  // several chunks; a norm weight's 1024.
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {
      {1, 0}, {1001, 0}, {4096, 1}, {32769, 0}, {3 * 32768 + 12, 0}, {1024, 0}, {77, 3}};
  auto fused_states = make_states(shapes);
  auto aten_states = clone(fused_states);
  train::OptSettings o;
  o.lr = 2e-3;
  o.weight_decay = 0.01;
  o.max_norm = max_norm;
  train::ResidentUpdate fused(true), aten(false);
  Fp64 ref;
  for (int t = 1; t <= 4; ++t) {
    CAPTURE(t);
    // A fresh gradient each step, the same for both.
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      fused_states[i].grad.copy_(torch::randn_like(fused_states[i].grad) * 1e-3 * t);
      aten_states[i].grad.copy_(fused_states[i].grad);
    }
    double sq = 0;
    for (auto& s : fused_states) sq += s.grad.to(torch::kFloat64).square().sum().item<double>();
    const double norm64 = std::sqrt(sq);
    const double clip = max_norm ? std::min(1.0, *max_norm / (norm64 + 1e-6)) : 1.0;
    ref.step(fused_states, o, o.lr, t, clip);
    const double nf = fused.step(fused_states, o, o.lr, t, nullptr).item<double>();
    const double na = aten.step(aten_states, o, o.lr, t, nullptr).item<double>();
    REQUIRE(fused.fused());
    REQUIRE_FALSE(aten.fused());
    CHECK(std::fabs(nf - norm64) <= 1e-6 * norm64);
    CHECK(std::fabs(na - norm64) <= 1e-6 * norm64);
    double worst_vs_aten = 0, fused_err = 0, aten_err = 0;
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const auto& f = fused_states[i];
      const auto& a = aten_states[i];
      worst_vs_aten =
          std::max({worst_vs_aten, max_diff(f.master, a.master), max_diff(f.m1, a.m1), max_diff(f.m2, a.m2)});
      fused_err = std::max(fused_err, max_rel(f.master, ref.p[i]));
      aten_err = std::max(aten_err, max_rel(a.master, ref.p[i]));
      CHECK(torch::equal(f.weight, f.master.to(torch::kBFloat16)));
      CHECK(torch::equal(a.weight, a.master.to(torch::kBFloat16)));
    }
    MESSAGE("step " << t << ": fused vs ATen, largest difference " << worst_vs_aten
                    << " of the tensor's largest value; masters vs FP64: fused " << fused_err << ", ATen "
                    << aten_err);
    // Unclipped: the same arithmetic, the same bits. Clipped: the factor comes from
    // norms rounded differently (about 1e-7 apart), which moves every value by about
    // as much.
    if (max_norm)
      CHECK(worst_vs_aten <= 1e-5);
    else
      CHECK(worst_vs_aten == 0);
    CHECK(fused_err <= 2 * aten_err + 1e-6);
  }
}

}  // namespace

TEST_CASE(
    "GPU kernels: fused AdamW matches _fused_adamw_ (masters, moments, bf16 weights, norm; odd sizes)") {
  if (!torch::cuda::is_available() || !primecfg::train::fused::kernels_built()) {
    MESSAGE("no CUDA device or no kernels: fused AdamW test skipped");
    return;
  }
  adamw_case(std::nullopt);
  adamw_case(0.01);  // clipped: the norm pass, then the update with the factor
}

TEST_CASE("GPU kernels: fused AdamW on autograd's bf16 gradients equals it on their FP32 copies") {
  if (!torch::cuda::is_available() || !primecfg::train::fused::kernels_built()) return;
  torch::manual_seed(5);
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {
      {1001, 0}, {4096, 1}, {3 * 32768 + 12, 0}};
  auto from_fp32 = make_states(shapes);
  auto from_bf16 = clone(from_fp32);
  train::OptSettings o;
  o.lr = 2e-3;
  o.weight_decay = 0.01;
  train::ResidentUpdate a(true), b(true);
  for (int t = 1; t <= 3; ++t) {
    std::vector<Tensor> grads16;
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      // bf16 gradients, one of them misaligned (a 2-byte offset: the scalar path).
      Tensor g = fresh(shapes[i].first, i == 1 ? 1 : 0, f32().dtype(torch::kBFloat16), 1e-3);
      grads16.push_back(g);
      from_fp32[i].grad.copy_(g);             // exact: every bf16 value is an FP32 value
      from_bf16[i].grad.fill_(std::nan(""));  // must not be read
    }
    const double na = a.step(from_fp32, o, o.lr, t, nullptr).item<double>();
    const double nb = b.step(from_bf16, o, o.lr, t, nullptr, &grads16).item<double>();
    REQUIRE(b.fused());
    CHECK(na == nb);
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      CHECK(torch::equal(from_fp32[i].master, from_bf16[i].master));
      CHECK(torch::equal(from_fp32[i].m1, from_bf16[i].m1));
      CHECK(torch::equal(from_fp32[i].m2, from_bf16[i].m2));
      CHECK(torch::equal(from_fp32[i].weight, from_bf16[i].weight));
    }
  }
}

TEST_CASE("GPU kernels: the fused AdamW leaves FP32 weights and the switch off to ATen") {
  if (!torch::cuda::is_available() || !primecfg::train::fused::kernels_built()) return;
  auto states = make_states({{1000, 0}});
  train::OptSettings o;
  o.lr = 1e-3;
  train::ResidentUpdate off(false);
  off.step(states, o, o.lr, 1, nullptr);
  CHECK_FALSE(off.fused());
  train::ResidentUpdate on(true);
  auto fp32_weights = make_states({{1000, 0}});
  fp32_weights[0].weight = fp32_weights[0].master.clone();
  fp32_weights[0].p->tensor = fp32_weights[0].weight;
  on.step(fp32_weights, o, o.lr, 1, nullptr);
  CHECK_FALSE(on.fused());
  on.step(states, o, o.lr, 2, nullptr);
  CHECK(on.fused());
}

TEST_CASE(
    "GPU kernels: a frozen parameter (freeze_moe_router) sends the update to ATen's path, which keeps its "
    "state") {
  if (!torch::cuda::is_available() || !primecfg::train::fused::kernels_built()) return;
  auto states = make_states({{1000, 0}, {1000, 0}});
  states[0].p->frozen = true;
  const auto before = clone(states);
  train::OptSettings o;
  o.lr = 1e-3;
  train::ResidentUpdate update(true);
  update.step(states, o, o.lr, 1, nullptr);
  CHECK_FALSE(update.fused());  // the kernel updates every parameter it is given
  CHECK(torch::equal(states[0].weight, before[0].weight));
  CHECK(torch::equal(states[0].master, before[0].master));
  CHECK(torch::equal(states[0].m1, before[0].m1));
  CHECK(torch::equal(states[0].m2, before[0].m2));
  CHECK_FALSE(torch::equal(states[1].master, before[1].master));
}
