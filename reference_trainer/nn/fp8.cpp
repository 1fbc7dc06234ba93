#include "nn/fp8.hpp"

#include "nn/kernels/fused_ops.hpp"

#include <ATen/BlasBackend.h>
#include <fmt/format.h>

#ifdef PRIMECFG_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <optional>
#include <utility>

#include <stdexcept>

namespace primecfg::train::fp8 {

using torch::Tensor;
using i64 = std::int64_t;

namespace {

i64 groups(i64 n) { return (n + group - 1) / group; }

// x [rows, cols] zero-padded to [rows', cols'], multiples of `row_group` and 128.
Tensor padded(const Tensor& x, i64 row_group) {
  const i64 rows = x.size(0), cols = x.size(1);
  const i64 pr = (rows + row_group - 1) / row_group * row_group, pc = groups(cols) * group;
  if (pr == rows && pc == cols) return x.to(torch::kFloat32);
  Tensor out = torch::zeros({pr, pc}, x.options().dtype(torch::kFloat32));
  out.narrow(0, 0, rows).narrow(1, 0, cols).copy_(x);
  return out;
}

Tensor scale_of(const Tensor& amax, double floor) { return (amax / e4m3_max).clamp_min(floor); }

// A cast works through its tensor in slices of rows of about this many elements, so that its
// FP32 temporaries (the padded copy, |x|, x / scale) stay near 64 MiB each whatever the tensor.
constexpr i64 chunk_elements = i64{1} << 24;

// ATen's cast to e4m3 rounds to nearest even but turns what lies beyond 448 into NaN: the
// clamp is the saturation (x / scale is at most 448 plus a rounding of the division).
Tensor to_e4m3(const Tensor& scaled) { return scaled.clamp(-e4m3_max, e4m3_max).to(at::kFloat8_e4m3fn); }

void check_matrix(const Tensor& t, const char* what) {
  if (t.dim() != 2)
    throw std::invalid_argument(fmt::format("fp8::{}: a matrix, not {} dimensions", what, t.dim()));
}

// One cast of the fused kernel's result (values, scales).
Quantized cast_of(const std::pair<Tensor, Tensor>& c) { return {c.first, c.second}; }

}  // namespace

Quantized quantize_rows(const Tensor& x, double floor) {
  check_matrix(x, "quantize_rows");
  if (auto q = fused::fp8_cast(x, {fused::Fp8Cast::rows}, floor)) return cast_of((*q)[0]);
  const i64 rows = x.size(0), cols = x.size(1), g = groups(cols);
  Quantized q{torch::empty({rows, cols}, x.options().dtype(at::kFloat8_e4m3fn)),
              torch::empty({rows, g}, x.options().dtype(torch::kFloat32))};
  const i64 step = std::max<i64>(1, chunk_elements / std::max<i64>(1, g * group));
  for (i64 r = 0; r < rows; r += step) {
    const i64 n = std::min(step, rows - r);
    const Tensor p = padded(x.narrow(0, r, n), 1).view({n, g, group});
    const Tensor scales = scale_of(p.abs().amax(2), floor);
    q.scales.narrow(0, r, n).copy_(scales);
    q.values.narrow(0, r, n).copy_(to_e4m3(p / scales.unsqueeze(2)).view({n, g * group}).narrow(1, 0, cols));
  }
  return q;
}

Quantized quantize_blocks(const Tensor& w) {
  check_matrix(w, "quantize_blocks");
  if (auto q = fused::fp8_cast(w, {fused::Fp8Cast::blocks}, scale_floor)) return cast_of((*q)[0]);
  const i64 rows = w.size(0), cols = w.size(1), gr = groups(rows), gc = groups(cols);
  Quantized q{torch::empty({rows, cols}, w.options().dtype(at::kFloat8_e4m3fn)),
              torch::empty({gr, gc}, w.options().dtype(torch::kFloat32))};
  const i64 step = std::max<i64>(1, chunk_elements / std::max<i64>(1, group * gc * group));  // block rows
  for (i64 b = 0; b < gr; b += step) {
    const i64 nb = std::min(step, gr - b), r = b * group, n = std::min(nb * group, rows - r);
    const Tensor p = padded(w.narrow(0, r, n), group).view({nb, group, gc, group});
    const Tensor scales = scale_of(p.abs().amax({1, 3}), scale_floor);
    q.scales.narrow(0, b, nb).copy_(scales);
    q.values.narrow(0, r, n).copy_(to_e4m3(p / scales.view({nb, 1, gc, 1}))
                                       .view({nb * group, gc * group})
                                       .narrow(0, 0, n)
                                       .narrow(1, 0, cols));
  }
  return q;
}

Quantized quantize_cols(const Tensor& x, double floor) {
  check_matrix(x, "quantize_cols");
  if (auto q = fused::fp8_cast(x, {fused::Fp8Cast::cols}, floor)) return cast_of((*q)[0]);
  const i64 rows = x.size(0), want = groups(rows) * group;
  const Tensor t = x.t();
  return quantize_rows(want == rows ? t.contiguous() : at::constant_pad_nd(t, {0, want - rows}), floor);
}

std::pair<Quantized, Quantized> quantize_rows_cols(const Tensor& x, double floor) {
  check_matrix(x, "quantize_rows_cols");
  if (auto q = fused::fp8_cast(x, {fused::Fp8Cast::rows, fused::Fp8Cast::cols}, floor))
    return {cast_of((*q)[0]), cast_of((*q)[1])};
  return {quantize_rows(x, floor), quantize_cols(x, floor)};
}

Quantized transposed(const Quantized& q) { return {q.values.t().contiguous(), q.scales.t().contiguous()}; }

Quantized quantize_blocks_transposed(const Tensor& w) {
  check_matrix(w, "quantize_blocks_transposed");
  if (auto q = fused::fp8_cast(w, {fused::Fp8Cast::blocks_transposed}, scale_floor)) return cast_of((*q)[0]);
  return transposed(quantize_blocks(w));
}

Tensor dequantize_rows(const Quantized& q) {
  const i64 cols = q.values.size(1);
  return q.values.to(torch::kFloat32) * q.scales.repeat_interleave(group, 1).narrow(1, 0, cols);
}

Tensor dequantize_blocks(const Quantized& q) {
  const i64 rows = q.values.size(0), cols = q.values.size(1);
  return q.values.to(torch::kFloat32) * q.scales.repeat_interleave(group, 0)
                                            .repeat_interleave(group, 1)
                                            .narrow(0, 0, rows)
                                            .narrow(1, 0, cols);
}

namespace {

bool scaled_mm_here(const Tensor& t) {
#ifdef PRIMECFG_WITH_CUDA
  return t.is_cuda() && at::cuda::getDeviceProperties(t.get_device())->major == 9;
#else
  (void)t;
  return false;
#endif
}

std::atomic<double> grad_ratio{1.0};

// y_i = x W_i^T for weights that read one input (q, k and v; gate and up; or one alone): x
// cast by rows once for every forward product and by columns once for every dW; dX is their
// products' sum, added in the order autograd adds separate linears' (the last first). Saves
// x and the weights as they are (bf16) for the backward.
struct Fp8Linears : torch::autograd::Function<Fp8Linears> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const Tensor& x,
                                                at::TensorList ws) {
    std::vector<Tensor> saved{x};
    saved.insert(saved.end(), ws.begin(), ws.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["dy_floor"] = scale_floor / grad_ratio.load();
    torch::autograd::variable_list ys;
    // No rows (a routed expert without tokens): nothing to multiply, and zero gradients.
    if (x.size(0) == 0) {
      for (const Tensor& w : ws) ys.push_back(x.new_empty({0, w.size(0)}));
      return ys;
    }
    // y in x's dtype: bf16 in training, as prime-rl's; FP32 in the CPU reference model.
    const Quantized qx = quantize_rows(x);
    for (const Tensor& w : ws) ys.push_back(matmul_nt(qx, quantize_blocks(w), true, x.scalar_type()));
    return ys;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor& x = saved[0];
    const auto n = static_cast<std::int64_t>(saved.size()) - 1;
    const double dy_floor = ctx->saved_data["dy_floor"].toDouble();
    torch::autograd::variable_list out(saved.size());
    std::optional<Quantized> x_cols;
    for (std::int64_t i = n - 1; i >= 0; --i) {
      const Tensor& w = saved[i + 1];
      const bool want_dx = ctx->needs_input_grad(0), want_dw = ctx->needs_input_grad(i + 1);
      if (!grads[i].defined() || x.size(0) == 0) {  // an output nothing used, or no rows
        if (want_dw) out[i + 1] = torch::zeros_like(w);
        continue;
      }
      const Tensor dy = grads[i].contiguous();
      std::optional<Quantized> dy_cols;
      if (want_dx) {
        std::optional<Quantized> dy_rows;
        if (want_dw) {
          auto [r, c] = quantize_rows_cols(dy, dy_floor);
          dy_rows = std::move(r), dy_cols = std::move(c);
        } else {
          dy_rows = quantize_rows(dy, dy_floor);
        }
        // W^T's 128 x 128 blocks are W's transposed (the same amax each), cast from W.
        Tensor dx = matmul_nt(*dy_rows, quantize_blocks_transposed(w), true, x.scalar_type());
        out[0] = out[0].defined() ? out[0] + dx : dx;
      }
      if (want_dw) {
        if (!dy_cols) dy_cols = quantize_cols(dy, dy_floor);
        if (!x_cols) x_cols = quantize_cols(x);
        out[i + 1] = matmul_nt(*dy_cols, *x_cols, false, w.scalar_type());
      }
    }
    if (ctx->needs_input_grad(0) && !out[0].defined()) out[0] = torch::zeros_like(x);
    return out;
  }
};

}  // namespace

Tensor matmul_nt(const Quantized& a, const Quantized& b, bool b_blocks, torch::ScalarType out) {
  if (scaled_mm_here(a.values)) {
    using at::blas::ScalingType;
    using at::blas::SwizzleType;
    // The layouts ATen's blockwise recipes check (ScaledBlas.cpp): B is a column-major
    // [k, n]; 1 x 128 scales [rows, k / 128] with strides (1, rows); B's 128 x 128 scales
    // [k / 128 rounded up to 4, n / 128] with strides (1, that), the padding unread.
    auto outer_major = [](const Tensor& s) { return s.t().contiguous().t(); };
    auto block_major = [](const Tensor& s) {  // s: [n / 128, k / 128], as quantize_blocks gives them
      const i64 k_blocks = s.size(1), padded = (k_blocks + 3) / 4 * 4;
      Tensor p = torch::zeros({s.size(0), padded}, s.options());
      p.narrow(1, 0, k_blocks).copy_(s);
      return p.t();
    };
    const auto recipe = [](ScalingType t) { return static_cast<i64>(t); };
    const std::array<i64, 1> ra{recipe(ScalingType::BlockWise1x128)},
        rb{recipe(b_blocks ? ScalingType::BlockWise128x128 : ScalingType::BlockWise1x128)},
        none{static_cast<i64>(SwizzleType::NO_SWIZZLE)};
    const std::array<Tensor, 1> sb{b_blocks ? block_major(b.scales) : outer_major(b.scales)};
    // cuBLASLt finds no blockwise algorithm for an M that is no multiple of 16 (a routed
    // expert's rows): A gets zero rows (scale 1) up to one, and D loses them again.
    const i64 m = a.values.size(0), pad = (m + 15) / 16 * 16 - m;
    const Tensor values =
        pad == 0 ? a.values
                 : at::constant_pad_nd(a.values.view(at::kByte), {0, 0, 0, pad}).view(a.values.scalar_type());
    const std::array<Tensor, 1> sa{
        outer_major(pad == 0 ? a.scales : at::constant_pad_nd(a.scales, {0, 0, 0, pad}, 1.0))};
    return at::_scaled_mm_v2(values, b.values.t(), sa, ra, none, sb, rb, none, std::nullopt, out)
        .narrow(0, 0, m);
  }
  const Tensor da = dequantize_rows(a), db = b_blocks ? dequantize_blocks(b) : dequantize_rows(b);
  return at::matmul(da, db.t()).to(out);
}

Tensor linear(const Tensor& x, const Tensor& weight) { return linears(x, {weight})[0]; }

std::vector<Tensor> linears(const Tensor& x, const std::vector<Tensor>& weights) {
  return Fp8Linears::apply(x, at::TensorList(weights));
}

void set_output_grad_ratio(double ratio) {
  if (!(ratio > 0) || !std::isfinite(ratio))
    throw std::invalid_argument(fmt::format("fp8::set_output_grad_ratio: {} is no positive ratio", ratio));
  grad_ratio = ratio;
}
double output_grad_ratio() { return grad_ratio; }

std::optional<std::string> unavailable_on(torch::Device device) {
  if (!device.is_cuda())
    return fmt::format(
        "the device is {}: FP8 training needs an NVIDIA Hopper GPU (compute capability 9.x: "
        "H100, H200), where cuBLASLt has the blockwise-scaled FP8 GEMM",
        device.str());
#ifdef PRIMECFG_WITH_CUDA
  const auto* props = at::cuda::getDeviceProperties(device.index() < 0 ? 0 : device.index());
  if (props->major != 9)
    return fmt::format(
        "{} has compute capability {}.{}: FP8 training as prime-rl's needs 9.x (H100, H200), "
        "where cuBLASLt has the blockwise-scaled FP8 GEMM",
        props->name, props->major, props->minor);
  return std::nullopt;
#else
  return "this build of primecfg-train has no CUDA";
#endif
}

}  // namespace primecfg::train::fp8
