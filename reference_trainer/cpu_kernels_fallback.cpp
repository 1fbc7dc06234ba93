// Scalar stand-ins for the fused CPU kernels (see cpu_kernels.hpp). The arithmetic
// follows torch.optim.AdamW's single-tensor path step by step, so the equivalence
// test compares like with like.
#include "cpu_kernels.hpp"

#include <cmath>
#include <cstring>

namespace primecfg::train::cpu {

namespace {

float bf16_to_float(std::uint16_t b) {
  std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::uint16_t float_to_bf16(float f) {  // round to nearest even, NaN stays NaN
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

float load(const float* g, std::int64_t i) { return g[i]; }
float load(const std::uint16_t* g, std::int64_t i) { return bf16_to_float(g[i]); }

template <class G>
void adamw_impl(float* p, float* m, float* v, const G* g, std::uint16_t* out, std::int64_t n,
                const AdamWStep& s) {
  const double t = static_cast<double>(s.step);
  const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(s.beta1), t));
  const float bc2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(s.beta2), t));
  const float step_size = s.lr / bc1;
  const float bc2_sqrt = std::sqrt(bc2);
  const float decay = 1.0f - s.lr * s.weight_decay;
  for (std::int64_t i = 0; i < n; ++i) {
    const float grad = load(g, i) * s.grad_scale;
    p[i] *= decay;
    m[i] = m[i] * s.beta1 + grad * (1.0f - s.beta1);
    v[i] = v[i] * s.beta2 + grad * grad * (1.0f - s.beta2);
    const float denom = std::sqrt(v[i]) / bc2_sqrt + s.eps;
    p[i] -= step_size * (m[i] / denom);
    if (out) out[i] = float_to_bf16(p[i]);
  }
}

template <class G>
void sign_impl(float* p, const G* g, std::uint16_t* out, std::int64_t n, const SignSGDStep& s) {
  const float decay = 1.0f - s.lr * s.weight_decay;
  for (std::int64_t i = 0; i < n; ++i) {
    const float grad = load(g, i) * s.grad_scale;
    const float sign = grad > 0.0f ? 1.0f : (grad < 0.0f ? -1.0f : 0.0f);
    p[i] = p[i] * decay - s.lr * sign;
    if (out) out[i] = float_to_bf16(p[i]);
  }
}

}  // namespace

void adamw(float* master, float* exp_avg, float* exp_avg_sq, const std::uint16_t* grad_bf16,
           std::uint16_t* weight_bf16_out, std::int64_t n, const AdamWStep& s) {
  adamw_impl(master, exp_avg, exp_avg_sq, grad_bf16, weight_bf16_out, n, s);
}
void adamw(float* master, float* exp_avg, float* exp_avg_sq, const float* grad,
           std::uint16_t* weight_bf16_out, std::int64_t n, const AdamWStep& s) {
  adamw_impl(master, exp_avg, exp_avg_sq, grad, weight_bf16_out, n, s);
}
void sign_sgd(float* master, const std::uint16_t* grad_bf16, std::uint16_t* weight_bf16_out, std::int64_t n,
              const SignSGDStep& s) {
  sign_impl(master, grad_bf16, weight_bf16_out, n, s);
}
void sign_sgd(float* master, const float* grad, std::uint16_t* weight_bf16_out, std::int64_t n,
              const SignSGDStep& s) {
  sign_impl(master, grad, weight_bf16_out, n, s);
}

}  // namespace primecfg::train::cpu
