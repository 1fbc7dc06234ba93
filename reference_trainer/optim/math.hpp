// The optimizers' arithmetic, shared by the three offload strategies: the settings in one
// flat struct, the update of one parameter with LibTorch ops (on the GPU, or on the CPU
// for tests), and the same update through the fused CPU kernels (FullOffload).
//
// Internal to primecfg-train (included by the offload pipelines and trainer.cpp).
#pragma once

#include "base/run_error.hpp"
#include "nn/transformer.hpp"
#include "optim/cpu/cpu_optim.hpp"
#include "optim/state.hpp"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>
#include <variant>

namespace primecfg::train {

using torch::Tensor;

// The optimizer settings in one flat struct (from the config's tagged union).
struct OptSettings {
  OptKind kind = OptKind::adamw;
  double lr = 0, weight_decay = 0;
  std::optional<double> max_norm;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double momentum = 0.9;
  bool nesterov = true;

  static OptSettings from(const OptimizerConfig& cfg) {
    OptSettings s;
    s.kind = optimizer_kind(cfg);
    std::visit(
        [&](const auto& o) {
          using O = std::decay_t<decltype(o)>;
          s.lr = o.lr;
          s.weight_decay = o.weight_decay;
          s.max_norm = o.max_norm;
          if constexpr (std::is_same_v<O, AdamWConfig>) {
            s.beta1 = o.betas1;
            s.beta2 = o.betas2;
          } else if constexpr (std::is_same_v<O, SGDConfig>) {
            s.momentum = o.momentum;
            s.nesterov = o.nesterov;
          } else if constexpr (std::is_same_v<O, MuonConfig>) {
            s.momentum = o.mu;
            s.beta1 = o.betas1;
            s.beta2 = o.betas2;
          }
        },
        cfg);
    return s;
  }
  std::string_view name() const {
    constexpr std::string_view names[] = {"adamw", "sign_sgd", "sgd", "muon"};
    return names[static_cast<int>(kind)];
  }
};

inline bool muon_handles(const NamedParam& p) { return muon_matrix(p.tensor.dim() == 2, p.block); }

// Which moment buffers a parameter needs (optim/state.hpp; the planner counts the same).
inline int moment_count(const OptSettings& o, const NamedParam& p) {
  return moment_buffers(o.kind, o.momentum > 0, muon_handles(p));
}

// Quintic Newton-Schulz iteration (coefficients from the Muon reference) that
// maps a matrix to the nearest semi-orthogonal one.
inline Tensor orthogonalize(const Tensor& g) {
  const double a = 3.4445, b = -4.7750, c = 2.0315;
  Tensor x = g.to(g.is_cuda() ? torch::kBFloat16 : torch::kFloat32);
  const bool tall = x.size(0) > x.size(1);
  if (tall) x = x.t();
  x = x / (x.norm() + 1e-7);
  for (int i = 0; i < 5; ++i) {
    Tensor A = torch::matmul(x, x.t());
    Tensor B = b * A + c * torch::matmul(A, A);
    x = a * x + torch::matmul(B, x);
  }
  if (tall) x = x.t();
  return x.to(torch::kFloat32);
}

// One parameter's update with LibTorch ops on whatever device the tensors are on.
// master, grad and moments are FP32 and on the same device.
// `step_t`, when given, holds `step` on the device (one tensor per step instead of a
// fill per parameter; the fused kernel only reads it).
inline void update_on_device(const OptSettings& o, const NamedParam& p, Tensor& master, const Tensor& grad,
                             Tensor* m1, Tensor* m2, double lr, std::int64_t step,
                             const Tensor* step_t_given = nullptr) {
  auto adamw = [&](double b1, double b2) {
    Tensor step_t =
        step_t_given ? *step_t_given : torch::full({}, static_cast<double>(step), master.options());
    at::_fused_adamw_({master}, {grad}, {*m1}, {*m2}, {}, {step_t}, lr, b1, b2, o.weight_decay, o.eps, false,
                      false);
  };
  switch (o.kind) {
    case OptKind::adamw:
      adamw(o.beta1, o.beta2);
      return;
    case OptKind::sign_sgd:
      master.mul_(1.0 - lr * o.weight_decay).add_(grad.sign(), -lr);
      return;
    case OptKind::sgd: {
      Tensor d = grad;
      if (m1) {
        m1->mul_(o.momentum).add_(grad);
        d = o.nesterov ? grad.add(*m1, o.momentum) : *m1;
      }
      master.mul_(1.0 - lr * o.weight_decay).add_(d, -lr);
      return;
    }
    case OptKind::muon: {
      if (!muon_handles(p)) {
        adamw(o.beta1, o.beta2);
        return;
      }
      m1->mul_(o.momentum).add_(grad);
      Tensor u = orthogonalize(grad.add(*m1, o.momentum));
      const double scale = std::sqrt(std::max(1.0, static_cast<double>(master.size(0)) / master.size(1)));
      master.mul_(1.0 - lr * o.weight_decay).add_(u, -lr * scale);
      return;
    }
  }
}

inline cpu::AdamWStep adamw_step(const OptSettings& o, double lr, std::int64_t step) {
  return cpu::AdamWStep{static_cast<float>(lr),
                        static_cast<float>(o.beta1),
                        static_cast<float>(o.beta2),
                        static_cast<float>(o.eps),
                        static_cast<float>(o.weight_decay),
                        step,
                        1.0f};
}

inline cpu::SignSGDStep sign_sgd_step(const OptSettings& o, double lr) {
  return cpu::SignSGDStep{static_cast<float>(lr), static_cast<float>(o.weight_decay), 1.0f};
}

// One contiguous piece of a parameter's update through the fused CPU kernels, on the
// calling thread (callers split larger work over the pool). Pointers are to the
// piece's first element; m1, m2 and out may be null (no moment / no bf16 copy).
inline void update_span_on_cpu(const OptSettings& o, float* master, float* m1, float* m2, const void* grad,
                               bool grad_bf16, std::uint16_t* out, std::int64_t n, double lr,
                               std::int64_t step) {
  const auto* gb = static_cast<const std::uint16_t*>(grad);
  const auto* gf = static_cast<const float*>(grad);
  switch (o.kind) {
    case OptKind::adamw:
      if (grad_bf16)
        cpu::adamw(master, m1, m2, gb, out, n, adamw_step(o, lr, step));
      else
        cpu::adamw(master, m1, m2, gf, out, n, adamw_step(o, lr, step));
      return;
    case OptKind::sign_sgd:
      if (grad_bf16)
        cpu::sign_sgd(master, gb, out, n, sign_sgd_step(o, lr));
      else
        cpu::sign_sgd(master, gf, out, n, sign_sgd_step(o, lr));
      return;
    default:
      throw run_error(fmt::format("optimizer {} cannot run with offload = \"full\"", o.name()));
  }
}

// The same update through the fused CPU kernels (FullOffload), split over the
// pool. The gradient is FP32 (an accumulator) or bf16 (straight from the staging
// ring). Only the element-wise optimizers exist there; the config rules enforce it.
inline void update_on_cpu_kernel(const OptSettings& o, cpu::ThreadPool& pool, Tensor& master,
                                 const Tensor& grad, Tensor* m1, Tensor* m2, std::uint16_t* weight_bf16_out,
                                 double lr, std::int64_t step) {
  const auto n = master.numel();
  TORCH_CHECK(grad.device().is_cpu() && grad.is_contiguous() && grad.numel() == n,
              "CPU optimizer: gradient must be a contiguous host tensor of the parameter's size");
  const bool g16 = grad.scalar_type() == torch::kBFloat16;
  TORCH_CHECK(g16 || grad.scalar_type() == torch::kFloat32, "CPU optimizer: gradient must be bf16 or fp32");
  const auto* gb = g16 ? reinterpret_cast<const std::uint16_t*>(grad.data_ptr()) : nullptr;
  const auto* gf = g16 ? nullptr : grad.data_ptr<float>();
  switch (o.kind) {
    case OptKind::adamw: {
      const cpu::AdamWStep s = adamw_step(o, lr, step);
      float *p = master.data_ptr<float>(), *a = m1->data_ptr<float>(), *b = m2->data_ptr<float>();
      if (g16)
        cpu::parallel_adamw(pool, p, a, b, gb, weight_bf16_out, n, s);
      else
        cpu::parallel_adamw(pool, p, a, b, gf, weight_bf16_out, n, s);
      return;
    }
    case OptKind::sign_sgd: {
      const cpu::SignSGDStep s = sign_sgd_step(o, lr);
      if (g16)
        cpu::parallel_sign_sgd(pool, master.data_ptr<float>(), gb, weight_bf16_out, n, s);
      else
        cpu::parallel_sign_sgd(pool, master.data_ptr<float>(), gf, weight_bf16_out, n, s);
      return;
    }
    default:
      throw run_error(fmt::format("optimizer {} cannot run with offload = \"full\"", o.name()));
  }
}

}  // namespace primecfg::train
