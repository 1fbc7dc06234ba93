// The fused CPU optimizer kernels that FullOffload calls.
//
// When reference_trainer/cpu_optim/ (the AVX-512/AVX2 library with its thread
// pool) is built, these names come from there; otherwise a scalar fallback with the
// same signatures (cpu_kernels_fallback.cpp) stands in, so the trainer and its
// tests never depend on which one is present.
#pragma once

#if defined(PRIMECFG_HAVE_CPU_OPTIM)
#include "cpu_optim/cpu_optim.hpp"
#else

#include <cstdint>

namespace primecfg::train::cpu {

struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay;
  std::int64_t step;  // 1-based step for bias correction
  float grad_scale;
};

// master, moments FP32; grad bf16 (bit pattern) or FP32; weight_bf16_out may be null.
void adamw(float* master, float* exp_avg, float* exp_avg_sq, const std::uint16_t* grad_bf16,
           std::uint16_t* weight_bf16_out, std::int64_t n, const AdamWStep& s);
void adamw(float* master, float* exp_avg, float* exp_avg_sq, const float* grad,
           std::uint16_t* weight_bf16_out, std::int64_t n, const AdamWStep& s);

struct SignSGDStep {
  float lr, weight_decay;
  float grad_scale;
};

void sign_sgd(float* master, const std::uint16_t* grad_bf16, std::uint16_t* weight_bf16_out, std::int64_t n,
              const SignSGDStep& s);
void sign_sgd(float* master, const float* grad, std::uint16_t* weight_bf16_out, std::int64_t n,
              const SignSGDStep& s);

}  // namespace primecfg::train::cpu

#endif
