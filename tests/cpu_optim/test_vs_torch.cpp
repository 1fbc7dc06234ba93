// Kernel tests against LibTorch: AdamW against at::_fused_adamw_ (the kernel behind
// torch.optim.AdamW(fused=True)) at tight tolerance, SignSGD and bf16 casts bit-exact against the
// equivalent torch operations. Built only when torch is found.
//
// c10 defines its own CHECK macro, so this file uses doctest's prefixed macro names only.
#include <torch/torch.h>
#define DOCTEST_CONFIG_NO_SHORT_MACRO_NAMES
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "optim/cpu/cpu_optim.hpp"

namespace cpu = primecfg::train::cpu;

namespace {

std::vector<cpu::Isa> supported_isas() {
  std::vector<cpu::Isa> out;
  for (cpu::Isa isa : {cpu::Isa::scalar, cpu::Isa::avx2, cpu::Isa::avx512}) {
    if (cpu::isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

float* f32(at::Tensor& t) { return t.data_ptr<float>(); }
std::uint16_t* u16(at::Tensor& t) { return reinterpret_cast<std::uint16_t*>(t.data_ptr<at::BFloat16>()); }

// Gradients of mixed magnitude with some zeros, as bf16.
at::Tensor make_grads(std::int64_t n, std::uint64_t seed) {
  at::manual_seed(seed);
  auto g = at::randn({n}) * at::pow(10.0, at::rand({n}) * 8.0 - 6.0);
  g.masked_fill_(at::rand({n}) < 0.05, 0.0);
  return g.to(at::kBFloat16);
}

}  // namespace

DOCTEST_TEST_CASE("AdamW matches at::_fused_adamw_ (bf16 and fp32 gradients, every path)") {
  at::set_num_threads(1);
  for (cpu::Isa isa : supported_isas()) {
    for (std::int64_t n : {1, 15, 17, 1000, 1000003}) {
      for (int bf16_grad = 0; bf16_grad < 2; ++bf16_grad) {
        const std::string isa_name = cpu::to_string(isa);
        DOCTEST_CAPTURE(isa_name);
        DOCTEST_CAPTURE(n);
        DOCTEST_CAPTURE(bf16_grad);
        at::manual_seed(42 + n);
        auto p_t = at::randn({n}) * 0.05;
        auto m_t = at::randn({n}) * 1e-3;
        auto v_t = at::rand({n}) * at::rand({n}) * 1e-6;
        auto p = p_t.clone(), m = m_t.clone(), v = v_t.clone();
        auto out = at::empty({n}, at::kBFloat16);
        double worst_ulps = 0, worst_ratio = 0;
        std::int64_t bad = 0;
        for (std::int64_t step = 1; step <= 3; ++step) {
          const float scale = step == 2 ? 0.25f : 1.0f;
          const float wd = 0.01f, lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
          const std::int64_t step_value = step == 3 ? 500 : step;
          auto g16 = make_grads(n, 1000 + step + n);
          auto g32 = g16.to(at::kFloat);
          // torch: fused AdamW on fp32 grads; torch divides by grad_scale, so pass 1/scale (a power of two).
          auto grad_for_torch = g32.clone();
          std::vector<at::Tensor> params{p_t}, grads{grad_for_torch}, avgs{m_t}, sqs{v_t}, maxs{},
              steps{at::full({}, static_cast<double>(step_value))};
          const auto scale_t = at::full({}, 1.0 / scale);
          const auto m_before = m.clone(), p_before = p.clone();
          at::_fused_adamw_(params, grads, avgs, sqs, maxs, steps, lr, b1, b2, wd, eps, false, false, scale_t,
                            std::nullopt);
          const cpu::AdamWStep s{lr, b1, b2, eps, wd, step_value, scale};
          if (bf16_grad)
            cpu::adamw(isa, f32(p), f32(m), f32(v), u16(g16), u16(out), n, s);
          else
            cpu::adamw(isa, f32(p), f32(m), f32(v), f32(g32), u16(out), n, s);

          // Tolerance per element from the size of the terms (see test_kernels.cpp): a few float
          // roundings of |p|, of the update, and of m when m cancels to almost nothing.
          const auto gd = g32.to(at::kDouble) * scale;
          const auto tol_m = 8e-7 * (m_before.abs().to(at::kDouble) + 0.1 * gd.abs()) + 1e-37;
          const double bc1 = 1.0 - std::pow(double(b1), double(step_value));
          const double bc2 = 1.0 - std::pow(double(b2), double(step_value));
          const auto denom = v_t.to(at::kDouble).sqrt() / std::sqrt(bc2) + eps;
          const auto update = (p_t.to(at::kDouble) - p_before.to(at::kDouble) * (1.0 - lr * wd)).abs();
          const auto tol_p =
              6e-7 * p_before.abs().to(at::kDouble) + 4e-6 * update + lr / bc1 * tol_m / denom + 1e-37;
          const auto tol_v = 8e-7 * (v_t.to(at::kDouble) + 1e-3 * gd * gd) + 1e-40;
          bad += ((p.to(at::kDouble) - p_t.to(at::kDouble)).abs() > tol_p).sum().item<std::int64_t>();
          bad += ((m.to(at::kDouble) - m_t.to(at::kDouble)).abs() > tol_m).sum().item<std::int64_t>();
          bad += ((v.to(at::kDouble) - v_t.to(at::kDouble)).abs() > tol_v).sum().item<std::int64_t>();
          // How much of the tolerance the worst element uses, and the largest difference in units of
          // the last place of the larger of |old weight| and |update| (for the report).
          worst_ratio = std::max(
              worst_ratio, ((p.to(at::kDouble) - p_t.to(at::kDouble)).abs() / tol_p).max().item<double>());
          const auto big = at::maximum(p_before.abs(), update.to(at::kFloat));
          const auto ulp = at::nextafter(big, at::full_like(big, INFINITY)) - big;
          worst_ulps = std::max(worst_ulps, ((p - p_t).abs() / ulp).max().item<double>());
          // The bf16 copy is torch's own cast of our master weights.
          DOCTEST_CHECK(at::equal(out, p.to(at::kBFloat16)));
          // Continue both from the same state so that differences do not accumulate.
          p_t.copy_(p);
          m_t.copy_(m);
          v_t.copy_(v);
        }
        DOCTEST_CHECK(bad == 0);
        DOCTEST_MESSAGE(isa_name << " n=" << n << " bf16_grad=" << bf16_grad << ": worst master difference "
                                 << worst_ulps << " ulp of max(|p|, |update|), " << worst_ratio
                                 << " of the tolerance");
      }
    }
  }
}

DOCTEST_TEST_CASE("SignSGD is bit-exact against the same update in torch ops") {
  at::set_num_threads(1);
  const std::int64_t n = 100003;
  for (cpu::Isa isa : supported_isas()) {
    const std::string isa_name = cpu::to_string(isa);
    DOCTEST_CAPTURE(isa_name);
    at::manual_seed(3);
    auto p = at::randn({n});
    auto g16 = make_grads(n, 4);
    auto p_t = p.clone();
    auto out = at::empty({n}, at::kBFloat16);
    const cpu::SignSGDStep s{1e-3f, 0.1f, 0.5f};
    const float decay = static_cast<float>(1.0 - double(s.lr) * double(s.weight_decay));
    p_t.mul_(static_cast<double>(decay))
        .sub_(at::sign(g16.to(at::kFloat) * s.grad_scale), static_cast<double>(s.lr));
    cpu::sign_sgd(isa, f32(p), u16(g16), u16(out), n, s);
    DOCTEST_CHECK(at::equal(p, p_t));
    DOCTEST_CHECK(at::equal(out, p_t.to(at::kBFloat16)));
  }
}

DOCTEST_TEST_CASE("fp32 -> bf16 conversion matches torch for every kind of value") {
  at::set_num_threads(1);
  const std::int64_t n = 1 << 20;
  auto bits = at::randint(-(1LL << 31), (1LL << 31) - 1, {n}, at::kLong).to(at::kInt);
  auto x = bits.view(at::kFloat);
  const auto finite = at::isfinite(x) | at::isinf(x);
  for (cpu::Isa isa : supported_isas()) {
    const std::string isa_name = cpu::to_string(isa);
    DOCTEST_CAPTURE(isa_name);
    DOCTEST_REQUIRE(cpu::set_active_isa(isa));
    auto ours = at::empty({n}, at::kBFloat16);
    cpu::float_to_bf16(x.data_ptr<float>(), u16(ours), n);
    const auto theirs = x.to(at::kBFloat16);
    // Every non-NaN value is bit-exact; NaN stays NaN.
    DOCTEST_CHECK(at::equal(ours.masked_select(finite), theirs.masked_select(finite)));
    DOCTEST_CHECK(at::isnan(ours.masked_select(~finite)).all().item<bool>());
  }
  cpu::set_active_isa(cpu::best_isa());
}
