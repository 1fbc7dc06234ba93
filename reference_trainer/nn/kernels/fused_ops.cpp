#include "nn/kernels/fused_ops.hpp"

#include <atomic>
#include <optional>

#if PRIMECFG_WITH_CUDA && PRIMECFG_FUSED_KERNELS
#include "model/fp8_layers.hpp"
#include "nn/kernels/cross_entropy.hpp"
#include "nn/kernels/fp8_cast.hpp"
#include "nn/kernels/norm_rope.hpp"
#include "nn/kernels/rms_norm.hpp"
#include "nn/kernels/swiglu.hpp"

// c10's stream header, not ATen/cuda/CUDAContext.h: that one also wants the cuBLAS and
// cuSPARSE headers, which a toolkit without them lacks.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#define PRIMECFG_HAVE_FUSED 1
#else
#define PRIMECFG_HAVE_FUSED 0
#endif

namespace primecfg::train::fused {

using torch::Tensor;

namespace {

std::atomic<bool> on{true};
std::atomic<bool> norm_rope_on{true};
std::atomic<bool> cross_entropy_on{true};
std::atomic<bool> fp8_cast_on{true};

// HF's rotate-half RoPE; cos/sin are [B, T, 1, head_dim].
Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  auto half = x.size(-1) / 2;
  auto x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
  return x * cos + torch::cat({-x2, x1}, -1) * sin;
}

#if PRIMECFG_HAVE_FUSED

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

const kernels::bf16* in(const Tensor& t) { return reinterpret_cast<const kernels::bf16*>(t.data_ptr()); }
kernels::bf16* out(Tensor& t) { return reinterpret_cast<kernels::bf16*>(t.data_ptr()); }

// The current stream of the current device (the guard in each caller made it the tensors').
cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

bool fusable(const Tensor& t) { return t.defined() && t.is_cuda() && t.scalar_type() == torch::kBFloat16; }

// Saves the input, the weight and the per-row rstd, as ATen's RMSNorm does (the output
// is not kept).
struct RmsNorm : torch::autograd::Function<RmsNorm> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x_in, const Tensor& w_in, double eps) {
    c10::cuda::CUDAGuard guard(x_in.device());
    Tensor x = x_in.contiguous(), w = w_in.contiguous();
    const std::int64_t cols = w.numel(), rows = x.numel() / cols;
    Tensor y = torch::empty_like(x);
    Tensor rstd = torch::empty({rows}, x.options().dtype(torch::kFloat32));
    kernels::rms_norm_forward(in(x), in(w), out(y), rstd.data_ptr<float>(), rows, cols,
                              static_cast<float>(eps), stream());
    ctx->save_for_backward({x, w, rstd});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &x = saved[0], &w = saved[1], &rstd = saved[2];
    c10::cuda::CUDAGuard guard(x.device());
    Tensor dy = grads[0].to(x.scalar_type()).contiguous();
    const std::int64_t cols = w.numel(), rows = x.numel() / cols;
    Tensor dx = torch::empty_like(x);
    Tensor dw, workspace;
    if (ctx->needs_input_grad(1)) {
      dw = torch::empty_like(w);
      workspace = torch::empty({kernels::rms_norm_backward_workspace(rows, cols)},
                               x.options().dtype(torch::kFloat32));
    }
    kernels::rms_norm_backward(
        in(dy), in(x), in(w), rstd.data_ptr<float>(), out(dx), dw.defined() ? out(dw) : nullptr,
        workspace.defined() ? workspace.data_ptr<float>() : nullptr, rows, cols, stream());
    return {dx, dw, Tensor()};
  }
};

// Saves gate and up only (ATen's silu-then-multiply also keeps silu(gate)).
struct SwiGlu : torch::autograd::Function<SwiGlu> {
  static Tensor forward(AutogradContext* ctx, const Tensor& gate_in, const Tensor& up_in) {
    c10::cuda::CUDAGuard guard(gate_in.device());
    Tensor gate = gate_in.contiguous(), up = up_in.contiguous();
    Tensor y = torch::empty_like(gate);
    kernels::swiglu_forward(in(gate), in(up), out(y), gate.numel(), stream());
    ctx->save_for_backward({gate, up});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &gate = saved[0], &up = saved[1];
    c10::cuda::CUDAGuard guard(gate.device());
    Tensor d = grads[0].to(gate.scalar_type()).contiguous();
    Tensor dgate = torch::empty_like(gate), dup = torch::empty_like(up);
    kernels::swiglu_backward(in(d), in(gate), in(up), out(dgate), out(dup), gate.numel(), stream());
    return {dgate, dup};
  }
};

// Saves what the unfused path keeps, so the planner's figures hold: the tables, and with
// QK-norm the norm's input, weight and per-row rstd (RoPE alone needs no input in its
// backward: it is linear in x).
struct NormRope : torch::autograd::Function<NormRope> {
  // w is optional rather than an undefined Tensor: autograd records every Tensor argument as an
  // input and cannot record an undefined one (Llama has no QK-norm).
  static Tensor forward(AutogradContext* ctx, const Tensor& x_in, const std::optional<Tensor>& w_in,
                        const Tensor& cos_in, const Tensor& sin_in, double eps) {
    c10::cuda::CUDAGuard guard(x_in.device());
    Tensor x = x_in.contiguous(), cos = cos_in.contiguous(), sin = sin_in.contiguous();
    Tensor w = w_in ? w_in->contiguous() : Tensor();
    const std::int64_t tokens = x.size(0) * x.size(1), heads = x.size(2), dim = x.size(3);
    Tensor y = torch::empty_like(x);
    Tensor rstd = w.defined() ? torch::empty({tokens * heads}, x.options().dtype(torch::kFloat32)) : Tensor();
    kernels::norm_rope_forward(in(x), w.defined() ? in(w) : nullptr, in(cos), in(sin), out(y),
                               w.defined() ? rstd.data_ptr<float>() : nullptr, tokens,
                               static_cast<int>(heads), static_cast<int>(dim), static_cast<float>(eps),
                               stream());
    ctx->save_for_backward({w.defined() ? x : Tensor(), w, rstd, cos, sin});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &x = saved[0], &w = saved[1], &rstd = saved[2], &cos = saved[3], &sin = saved[4];
    c10::cuda::CUDAGuard guard(cos.device());
    Tensor dy = grads[0].to(cos.scalar_type()).contiguous();  // y's shape, which is x's
    const std::int64_t tokens = dy.size(0) * dy.size(1), heads = dy.size(2), dim = dy.size(3);
    Tensor dx = torch::empty_like(dy);
    Tensor dw, workspace;
    if (w.defined() && ctx->needs_input_grad(1)) {
      dw = torch::empty_like(w);
      workspace = torch::empty({kernels::norm_rope_backward_workspace(tokens, static_cast<int>(dim))},
                               dy.options().dtype(torch::kFloat32));
    }
    kernels::norm_rope_backward(in(dy), w.defined() ? in(x) : nullptr, w.defined() ? in(w) : nullptr,
                                w.defined() ? rstd.data_ptr<float>() : nullptr, in(cos), in(sin), out(dx),
                                dw.defined() ? out(dw) : nullptr,
                                workspace.defined() ? workspace.data_ptr<float>() : nullptr, tokens,
                                static_cast<int>(heads), static_cast<int>(dim), stream());
    return {dx, dw, Tensor(), Tensor(), Tensor()};
  }
};

// x [B, T, heads, dim] with dim even and within the kernel's registers, cos and sin
// exactly [B, T, 1, dim], w absent or [dim]: all bf16 on x's device.
bool norm_rope_fusable(const Tensor& x, const Tensor& w, const Tensor& cos, const Tensor& sin) {
  if (!fusable(x) || x.dim() != 4 || x.numel() == 0) return false;
  const std::int64_t dim = x.size(3);
  if (dim % 2 != 0 || dim > kernels::kNormRopeMaxDim) return false;
  const std::vector<std::int64_t> table{x.size(0), x.size(1), 1, dim};
  for (const Tensor* t : {&cos, &sin})
    if (!fusable(*t) || t->device() != x.device() || t->sizes() != c10::IntArrayRef(table)) return false;
  return !w.defined() || (fusable(w) && w.device() == x.device() && w.dim() == 1 && w.size(0) == dim);
}

#endif

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps) {
#if PRIMECFG_HAVE_FUSED
  if (on && fusable(x) && fusable(w) && w.dim() == 1 && x.dim() >= 1 && x.size(-1) == w.size(0) &&
      x.device() == w.device() && x.numel() > 0)
    return RmsNorm::apply(x, w, eps);
#endif
  return at::rms_norm(x, {x.size(-1)}, w, eps);
}

Tensor swiglu(const Tensor& gate, const Tensor& up) {
#if PRIMECFG_HAVE_FUSED
  if (on && fusable(gate) && fusable(up) && gate.sizes() == up.sizes() && gate.device() == up.device())
    return SwiGlu::apply(gate, up);
#endif
  return torch::silu(gate) * up;
}

Tensor norm_rope(const Tensor& x, const Tensor& w, const Tensor& cos, const Tensor& sin, double eps) {
#if PRIMECFG_HAVE_FUSED
  if (on && norm_rope_on && norm_rope_fusable(x, w, cos, sin))
    return NormRope::apply(x, w.defined() ? std::optional<Tensor>(w) : std::nullopt, cos, sin, eps);
#endif
  return rope(w.defined() ? rms_norm(x, w, eps) : x, cos, sin);
}

bool cross_entropy_fused(const Tensor& hidden) {
#if PRIMECFG_HAVE_FUSED
  return on && cross_entropy_on && fusable(hidden);
#else
  (void)hidden;
  return false;
#endif
}

Tensor cross_entropy_grad_(Tensor& logits, const Tensor& targets, double scale) {
#if PRIMECFG_HAVE_FUSED
  if (on && cross_entropy_on && fusable(logits) && logits.is_contiguous() && logits.dim() == 2 &&
      logits.size(0) > 0 && logits.size(1) > 0 && targets.dim() == 1 && targets.size(0) == logits.size(0) &&
      targets.scalar_type() == torch::kInt64 && targets.device() == logits.device()) {
    c10::cuda::CUDAGuard guard(logits.device());
    const Tensor t = targets.contiguous();
    Tensor loss = torch::empty({logits.size(0)}, logits.options().dtype(torch::kFloat32));
    kernels::cross_entropy_grad(reinterpret_cast<kernels::bf16*>(logits.data_ptr()),
                                t.data_ptr<std::int64_t>(), loss.data_ptr<float>(), logits.size(0),
                                logits.size(1), static_cast<float>(scale), stream());
    return loss;
  }
#endif
  (void)logits, (void)targets, (void)scale;
  return Tensor();
}

std::optional<std::vector<std::pair<Tensor, Tensor>>> fp8_cast(const Tensor& x,
                                                               std::initializer_list<Fp8Cast> kinds,
                                                               double floor) {
#if PRIMECFG_HAVE_FUSED
  if (on && fp8_cast_on && fusable(x) && x.dim() == 2) {
    c10::cuda::CUDAGuard guard(x.device());
    const Tensor c = x.contiguous();
    const std::int64_t rows = c.size(0), cols = c.size(1), g = fp8::group;
    const std::int64_t row_groups = (rows + g - 1) / g, col_groups = (cols + g - 1) / g;
    const auto bytes = c.options().dtype(at::kFloat8_e4m3fn), floats = c.options().dtype(torch::kFloat32);
    auto u8 = [](Tensor& t) { return reinterpret_cast<std::uint8_t*>(t.data_ptr()); };
    std::vector<std::pair<Tensor, Tensor>> result;
    kernels::Fp8Casts casts;
    for (const Fp8Cast kind : kinds) {
      switch (kind) {
        case Fp8Cast::rows:
          result.emplace_back(torch::empty({rows, cols}, bytes), torch::empty({rows, col_groups}, floats));
          casts.rows_values = u8(result.back().first),
          casts.rows_scales = result.back().second.data_ptr<float>();
          break;
        case Fp8Cast::cols:
          result.emplace_back(torch::empty({cols, row_groups * g}, bytes),
                              torch::empty({cols, row_groups}, floats));
          casts.cols_values = u8(result.back().first),
          casts.cols_scales = result.back().second.data_ptr<float>();
          break;
        case Fp8Cast::blocks:
          result.emplace_back(torch::empty({rows, cols}, bytes),
                              torch::empty({row_groups, col_groups}, floats));
          casts.block_values = u8(result.back().first),
          casts.block_scales = result.back().second.data_ptr<float>();
          break;
        case Fp8Cast::blocks_transposed:
          result.emplace_back(torch::empty({cols, rows}, bytes),
                              torch::empty({col_groups, row_groups}, floats));
          casts.block_t_values = u8(result.back().first);
          casts.block_t_scales = result.back().second.data_ptr<float>();
          break;
      }
    }
    // as ATen's clamp_min converts it on an FP32 tensor
    kernels::fp8_quantize(in(c), rows, cols, static_cast<float>(floor), casts, stream());
    return result;
  }
#endif
  (void)x, (void)kinds, (void)floor;
  return std::nullopt;
}

bool kernels_built() { return PRIMECFG_HAVE_FUSED; }

void set_enabled(bool enable) { on = enable; }
bool enabled() { return on; }
void set_norm_rope_enabled(bool enable) { norm_rope_on = enable; }
bool norm_rope_enabled() { return norm_rope_on; }
void set_cross_entropy_enabled(bool enable) { cross_entropy_on = enable; }
bool cross_entropy_enabled() { return cross_entropy_on; }
void set_fp8_cast_enabled(bool enable) { fp8_cast_on = enable; }
bool fp8_cast_enabled() { return fp8_cast_on; }

}  // namespace primecfg::train::fused
