#include "optim/cpu/cpu_optim.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "optim/cpu/kernels.hpp"

namespace primecfg::train::cpu {
namespace detail {

// The portable path. It is also the reference the vector paths must match bit for bit.
void adamw_scalar(const AdamWArgs& a) {
  for (std::int64_t i = 0; i < a.n; ++i) {
    const float g = a.g16 != nullptr ? bf16_bits_to_float(a.g16[i]) : a.g32[i];
    adamw_element(a.p[i], a.m[i], a.v[i], g, a.c);
    if (a.out != nullptr) a.out[i] = float_to_bf16_bits(a.p[i]);
  }
}

void sign_sgd_scalar(const SignArgs& a) {
  for (std::int64_t i = 0; i < a.n; ++i) {
    const float g = a.g16 != nullptr ? bf16_bits_to_float(a.g16[i]) : a.g32[i];
    a.p[i] = sign_sgd_element(a.p[i], g, a.c);
    if (a.out != nullptr) a.out[i] = float_to_bf16_bits(a.p[i]);
  }
}

namespace {
std::atomic<std::int64_t>& stream_slot() noexcept {
  static std::atomic<std::int64_t> slot{std::int64_t{1} << 15};
  return slot;
}
}  // namespace

std::int64_t stream_min_elements() noexcept { return stream_slot().load(std::memory_order_relaxed); }

namespace {
std::atomic<std::int64_t>& prefetch_slot() noexcept {
  // 1024 elements (4 KiB of an fp32 stream) ahead: on the H200 machine's CPU this took SignSGD
  // from 66-76% to 88-92% of the streaming bandwidth and AdamW from 78% to 84-88%
  // (docs/cpu-optimizer.md); 512 to 2048 were within a few percent of each other.
  static std::atomic<std::int64_t> slot{1024};
  return slot;
}
}  // namespace

std::int64_t prefetch_elements() noexcept { return prefetch_slot().load(std::memory_order_relaxed); }

}  // namespace detail

void set_streaming_store_threshold(std::int64_t elements) noexcept {
  detail::stream_slot().store(elements, std::memory_order_relaxed);
}
std::int64_t streaming_store_threshold() noexcept { return detail::stream_min_elements(); }

void set_prefetch_distance(std::int64_t elements) noexcept {
  detail::prefetch_slot().store(elements > 0 ? elements : 0, std::memory_order_relaxed);
}
std::int64_t prefetch_distance() noexcept { return detail::prefetch_elements(); }

namespace {

using detail::AdamWArgs;
using detail::SignArgs;

bool cpu_has(Isa isa) noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  switch (isa) {
    case Isa::scalar:
      return true;
    case Isa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") &&
             __builtin_cpu_supports("fma");
  }
  return false;
#else
  return isa == Isa::scalar;
#endif
}

Isa detect_best() noexcept {
  if (cpu_has(Isa::avx512)) return Isa::avx512;
  if (cpu_has(Isa::avx2)) return Isa::avx2;
  return Isa::scalar;
}

std::atomic<int>& active_slot() noexcept {
  static std::atomic<int> slot{static_cast<int>(detect_best())};
  return slot;
}

void require(Isa isa) {
  if (!isa_supported(isa)) {
    throw std::invalid_argument(std::string("primecfg cpu optimizer: this CPU cannot run the ") +
                                to_string(isa) + " path");
  }
}

void run_adamw(Isa isa, const AdamWArgs& a) {
  switch (isa) {
    case Isa::avx512:
      detail::adamw_avx512(a);
      return;
    case Isa::avx2:
      detail::adamw_avx2(a);
      return;
    case Isa::scalar:
      detail::adamw_scalar(a);
      return;
  }
}

void run_sign(Isa isa, const SignArgs& a) {
  switch (isa) {
    case Isa::avx512:
      detail::sign_sgd_avx512(a);
      return;
    case Isa::avx2:
      detail::sign_sgd_avx2(a);
      return;
    case Isa::scalar:
      detail::sign_sgd_scalar(a);
      return;
  }
}

detail::AdamWConsts adamw_consts(const AdamWStep& s) {
  const double step = static_cast<double>(s.step < 1 ? 1 : s.step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(s.beta1), step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(s.beta2), step);
  detail::AdamWConsts c{};
  c.scale = s.grad_scale;
  c.decay = static_cast<float>(1.0 - static_cast<double>(s.lr) * static_cast<double>(s.weight_decay));
  c.one_minus_b1 = static_cast<float>(1.0 - static_cast<double>(s.beta1));
  c.b2 = s.beta2;
  c.one_minus_b2 = static_cast<float>(1.0 - static_cast<double>(s.beta2));
  c.neg_step_size = static_cast<float>(-static_cast<double>(s.lr) / bc1);
  c.inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  c.eps = s.eps;
  return c;
}

detail::SignConsts sign_consts(const SignSGDStep& s) {
  detail::SignConsts c{};
  c.scale = s.grad_scale;
  c.decay = static_cast<float>(1.0 - static_cast<double>(s.lr) * static_cast<double>(s.weight_decay));
  c.lr = s.lr;
  return c;
}

}  // namespace

const char* to_string(Isa isa) noexcept {
  switch (isa) {
    case Isa::scalar:
      return "scalar";
    case Isa::avx2:
      return "avx2";
    case Isa::avx512:
      return "avx512";
  }
  return "unknown";
}

bool parse_isa(std::string_view text, Isa& out) noexcept {
  std::string lower;
  for (char ch : text) lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(ch))));
  if (lower == "scalar")
    out = Isa::scalar;
  else if (lower == "avx2")
    out = Isa::avx2;
  else if (lower == "avx512")
    out = Isa::avx512;
  else
    return false;
  return true;
}

bool isa_supported(Isa isa) noexcept {
  static const bool has[3] = {true, cpu_has(Isa::avx2), cpu_has(Isa::avx512)};
  const int i = static_cast<int>(isa);
  return i >= 0 && i < 3 && has[i];
}

Isa best_isa() noexcept {
  static const Isa best = detect_best();
  return best;
}

Isa active_isa() noexcept { return static_cast<Isa>(active_slot().load(std::memory_order_relaxed)); }

bool set_active_isa(Isa isa) noexcept {
  if (!isa_supported(isa)) return false;
  active_slot().store(static_cast<int>(isa), std::memory_order_relaxed);
  return true;
}

void adamw(Isa isa, float* master, float* exp_avg, float* exp_avg_sq, const std::uint16_t* grad_bf16,
           std::uint16_t* weight_bf16_out, std::int64_t n, const AdamWStep& step) {
  require(isa);
  if (n <= 0) return;
  run_adamw(isa, AdamWArgs{master, exp_avg, exp_avg_sq, grad_bf16, nullptr, weight_bf16_out, n,
                           adamw_consts(step)});
}

void adamw(Isa isa, float* master, float* exp_avg, float* exp_avg_sq, const float* grad,
           std::uint16_t* weight_bf16_out, std::int64_t n, const AdamWStep& step) {
  require(isa);
  if (n <= 0) return;
  run_adamw(isa,
            AdamWArgs{master, exp_avg, exp_avg_sq, nullptr, grad, weight_bf16_out, n, adamw_consts(step)});
}

void sign_sgd(Isa isa, float* master, const std::uint16_t* grad_bf16, std::uint16_t* weight_bf16_out,
              std::int64_t n, const SignSGDStep& step) {
  require(isa);
  if (n <= 0) return;
  run_sign(isa, SignArgs{master, grad_bf16, nullptr, weight_bf16_out, n, sign_consts(step)});
}

void sign_sgd(Isa isa, float* master, const float* grad, std::uint16_t* weight_bf16_out, std::int64_t n,
              const SignSGDStep& step) {
  require(isa);
  if (n <= 0) return;
  run_sign(isa, SignArgs{master, nullptr, grad, weight_bf16_out, n, sign_consts(step)});
}

void adamw(float* master, float* exp_avg, float* exp_avg_sq, const std::uint16_t* grad_bf16,
           std::uint16_t* weight_bf16_out, std::int64_t n, const AdamWStep& step) {
  if (n <= 0) return;
  run_adamw(active_isa(), AdamWArgs{master, exp_avg, exp_avg_sq, grad_bf16, nullptr, weight_bf16_out, n,
                                    adamw_consts(step)});
}

void adamw(float* master, float* exp_avg, float* exp_avg_sq, const float* grad,
           std::uint16_t* weight_bf16_out, std::int64_t n, const AdamWStep& step) {
  if (n <= 0) return;
  run_adamw(active_isa(),
            AdamWArgs{master, exp_avg, exp_avg_sq, nullptr, grad, weight_bf16_out, n, adamw_consts(step)});
}

void sign_sgd(float* master, const std::uint16_t* grad_bf16, std::uint16_t* weight_bf16_out, std::int64_t n,
              const SignSGDStep& step) {
  if (n <= 0) return;
  run_sign(active_isa(), SignArgs{master, grad_bf16, nullptr, weight_bf16_out, n, sign_consts(step)});
}

void sign_sgd(float* master, const float* grad, std::uint16_t* weight_bf16_out, std::int64_t n,
              const SignSGDStep& step) {
  if (n <= 0) return;
  run_sign(active_isa(), SignArgs{master, nullptr, grad, weight_bf16_out, n, sign_consts(step)});
}

// The constants are computed once per call here, not once per piece.
void parallel_adamw(ThreadPool& pool, float* master, float* exp_avg, float* exp_avg_sq,
                    const std::uint16_t* grad_bf16, std::uint16_t* weight_bf16_out, std::int64_t n,
                    const AdamWStep& step, std::int64_t grain) {
  if (n <= 0) return;
  const Isa isa = active_isa();
  const detail::AdamWConsts c = adamw_consts(step);
  pool.parallel_for(n, grain, [&](std::int64_t b, std::int64_t e) {
    run_adamw(isa, AdamWArgs{master + b, exp_avg + b, exp_avg_sq + b, grad_bf16 + b, nullptr,
                             weight_bf16_out != nullptr ? weight_bf16_out + b : nullptr, e - b, c});
  });
}

void parallel_adamw(ThreadPool& pool, float* master, float* exp_avg, float* exp_avg_sq, const float* grad,
                    std::uint16_t* weight_bf16_out, std::int64_t n, const AdamWStep& step,
                    std::int64_t grain) {
  if (n <= 0) return;
  const Isa isa = active_isa();
  const detail::AdamWConsts c = adamw_consts(step);
  pool.parallel_for(n, grain, [&](std::int64_t b, std::int64_t e) {
    run_adamw(isa, AdamWArgs{master + b, exp_avg + b, exp_avg_sq + b, nullptr, grad + b,
                             weight_bf16_out != nullptr ? weight_bf16_out + b : nullptr, e - b, c});
  });
}

void parallel_sign_sgd(ThreadPool& pool, float* master, const std::uint16_t* grad_bf16,
                       std::uint16_t* weight_bf16_out, std::int64_t n, const SignSGDStep& step,
                       std::int64_t grain) {
  if (n <= 0) return;
  const Isa isa = active_isa();
  const detail::SignConsts c = sign_consts(step);
  pool.parallel_for(n, grain, [&](std::int64_t b, std::int64_t e) {
    run_sign(isa, SignArgs{master + b, grad_bf16 + b, nullptr,
                           weight_bf16_out != nullptr ? weight_bf16_out + b : nullptr, e - b, c});
  });
}

void parallel_sign_sgd(ThreadPool& pool, float* master, const float* grad, std::uint16_t* weight_bf16_out,
                       std::int64_t n, const SignSGDStep& step, std::int64_t grain) {
  if (n <= 0) return;
  const Isa isa = active_isa();
  const detail::SignConsts c = sign_consts(step);
  pool.parallel_for(n, grain, [&](std::int64_t b, std::int64_t e) {
    run_sign(isa, SignArgs{master + b, nullptr, grad + b,
                           weight_bf16_out != nullptr ? weight_bf16_out + b : nullptr, e - b, c});
  });
}

std::uint16_t float_to_bf16(float value) noexcept { return detail::float_to_bf16_bits(value); }
float bf16_to_float(std::uint16_t bits) noexcept { return detail::bf16_bits_to_float(bits); }

void float_to_bf16(const float* in, std::uint16_t* out, std::int64_t n) noexcept {
  if (n <= 0) return;
  switch (active_isa()) {
    case Isa::avx512:
      detail::to_bf16_avx512(in, out, n);
      return;
    case Isa::avx2:
      detail::to_bf16_avx2(in, out, n);
      return;
    case Isa::scalar:
      for (std::int64_t i = 0; i < n; ++i) out[i] = detail::float_to_bf16_bits(in[i]);
      return;
  }
}

void bf16_to_float(const std::uint16_t* in, float* out, std::int64_t n) noexcept {
  for (std::int64_t i = 0; i < n; ++i) out[i] = detail::bf16_bits_to_float(in[i]);
}

}  // namespace primecfg::train::cpu
