// FP8 with blockwise scales on a CUDA device of compute capability 9.0 (nn/fp8.hpp): the
// casts (the fused kernels where built) give the CPU's bits (amax, an IEEE division and a
// rounding, the same on both), and
// the FP8 linear's output and both gradients, on cuBLASLt's blockwise-scaled GEMM, equal
// the CPU's dequantise-and-multiply path within what another order of the FP32 sums and
// one bf16 rounding allow (the CPU path itself is held to the Python reference built from
// the format's definition, tests/trainer/fp8_test.py). Skips elsewhere.
#include "fp8_models.hpp"
#include "nn/fp8.hpp"
#include "nn/kernels/fused_ops.hpp"
#include "nn/transformer.hpp"

#include <doctest/doctest.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <cmath>

#if defined(PRIMECFG_WITH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#endif

namespace {

namespace fp8 = primecfg::train::fp8;
namespace train = primecfg::train;
using torch::Tensor;

bool sm90() {
#if defined(PRIMECFG_WITH_CUDA)
  return torch::cuda::is_available() && at::cuda::getCurrentDeviceProperties()->major == 9;
#else
  return false;
#endif
}

// Equal scales and values, NaN where the other has NaN.
bool same_bits(const fp8::Quantized& a, const fp8::Quantized& b) {
  auto same = [](const Tensor& p, const Tensor& q) {
    return p.sizes() == q.sizes() && torch::allclose(p.cpu().to(torch::kFloat32), q.cpu().to(torch::kFloat32),
                                                     0, 0, /*equal_nan=*/true);
  };
  return same(a.scales, b.scales) && same(a.values, b.values);
}

struct Grads {
  Tensor y, dx, dw;
};

Grads run(const Tensor& x0, const Tensor& w0, const Tensor& dy, torch::Device device) {
  // Copies, so that neither run marks the caller's tensors as requiring gradients (on the CPU,
  // to() would return them).
  const Tensor x = x0.to(device, false, true).requires_grad_(),
               w = w0.to(device, false, true).requires_grad_();
  const Tensor y = fp8::linear(x, w);
  y.backward(dy.to(device));
  return {y.detach().cpu().to(torch::kFloat32), x.grad().cpu().to(torch::kFloat32),
          w.grad().cpu().to(torch::kFloat32)};
}

// |a - b| within one bf16 rounding of b, k terms' FP32 reordering of the operands' sizes,
// and what Hopper's FP8 tensor cores lose: their accumulator keeps about 14 significant
// bits (DeepSeek-V3's report, section 3.3.2), each of the four 32-deep MMA steps of a
// 128-deep block may lose 2^-13 of the block's partial sum, and cuBLASLt adds each block's
// partial, scaled, to an FP32 sum: at most 4 x 2^-13 = 2^-11 of the operands' sizes.
double worst(const Tensor& a, const Tensor& b, const Tensor& magnitude, std::int64_t k) {
  const Tensor bound =
      b.abs() * std::pow(2.0, -7) + magnitude * (std::pow(2.0, -11) + k * std::pow(2.0, -23));
  return ((a - b).abs() / bound.clamp_min(1e-30)).max().item<double>();
}

}  // namespace

TEST_CASE("GPU kernels: FP8 blockwise casts give the CPU's bits, the FP8 linear the CPU path's values") {
  if (!sm90()) {
    MESSAGE("no CUDA device of compute capability 9.0: FP8 test skipped");
    return;
  }
  torch::manual_seed(7);
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16);
  const std::int64_t tokens = 320, in = 512, out = 384;
  // Magnitudes that differ by row and by column, so that every group and block has a scale
  // of its own: a scale applied to the wrong group moves a value by far more than the bound.
  const auto spread = [&](std::int64_t r, std::int64_t c, double size) {
    return (torch::randn({r, c}) * torch::randn({r, 1}).exp() * torch::randn({1, c}).exp() * size)
        .to(torch::kBFloat16);
  };
  const Tensor x = spread(tokens, in, 1), w = spread(out, in, 0.05), dy = spread(tokens, out, 0.01);

  // The casts, on the fused kernels (nn/kernels/fp8_cast.hpp) where the build has them: the
  // shapes above, and one whose groups and blocks are partial, with a NaN in one group.
  Tensor odd = torch::randn({200, 300}, bf16) * torch::rand({200, 1}, bf16) * 3;
  odd.index_put_({7, 250}, std::nan(""));
  for (const Tensor& m : {x, w, dy, odd}) {
    CAPTURE(m.sizes());
    CHECK(same_bits(fp8::quantize_rows(m), fp8::quantize_rows(m.cuda())));
    CHECK(same_bits(fp8::quantize_cols(m), fp8::quantize_cols(m.cuda())));
    CHECK(same_bits(fp8::quantize_blocks(m), fp8::quantize_blocks(m.cuda())));
    // Several casts from one read: the same bits as each alone.
    const auto [rows_gpu, cols_gpu] = fp8::quantize_rows_cols(m.cuda());
    CHECK(same_bits(fp8::quantize_rows(m), rows_gpu));
    CHECK(same_bits(fp8::quantize_cols(m), cols_gpu));
    CHECK(same_bits(fp8::quantize_blocks(m.t().contiguous()), fp8::quantize_blocks_transposed(m.cuda())));
    // An output gradient's casts in this trainer's units (the floor over 8,192 tokens).
    const double floor = fp8::scale_floor / 8192;
    const Tensor small = m * 1e-4;
    CHECK(same_bits(fp8::quantize_rows(small, floor), fp8::quantize_rows(small.cuda(), floor)));
    CHECK(same_bits(fp8::quantize_cols(small, floor), fp8::quantize_cols(small.cuda(), floor)));
    const auto [small_rows, small_cols] = fp8::quantize_rows_cols(small.cuda(), floor);
    CHECK(same_bits(fp8::quantize_rows(small, floor), small_rows));
    CHECK(same_bits(fp8::quantize_cols(small, floor), small_cols));
  }
  // ATen's composition on the GPU, for the record: its division by the scalar 448 is a
  // multiplication by the reciprocal, so some scales may differ from the CPU's in the last bit.
  train::fused::set_fp8_cast_enabled(false);
  const fp8::Quantized aten = fp8::quantize_rows(x.cuda()), cpu_rows = fp8::quantize_rows(x);
  train::fused::set_fp8_cast_enabled(true);
  MESSAGE("fused FP8 casts in this build: "
          << train::fused::kernels_built() << "; ATen's GPU casts differ from the CPU's in "
          << aten.scales.cpu().ne(cpu_rows.scales).sum().item<std::int64_t>() << " of "
          << cpu_rows.scales.numel() << " row scales");

  // The linear, on as many tokens as above and on a number that is no multiple of 16 (a
  // routed expert's rows: cuBLASLt's blockwise GEMM refuses such an M, so matmul_nt pads it).
  for (const std::int64_t n : {tokens, std::int64_t{37}}) {
    CAPTURE(n);
    const Tensor xn = n == tokens ? x : spread(n, in, 1), dyn = n == tokens ? dy : spread(n, out, 0.01);
    const Grads cpu = run(xn, w, dyn, torch::kCPU), gpu = run(xn, w, dyn, torch::kCUDA);
    const Tensor xa = xn.to(torch::kFloat32).abs(), wa = w.to(torch::kFloat32).abs(),
                 dya = dyn.to(torch::kFloat32).abs();
    const double wy = worst(gpu.y, cpu.y, at::matmul(xa, wa.t()), in);
    const double wdx = worst(gpu.dx, cpu.dx, at::matmul(dya, wa), out);
    const double wdw = worst(gpu.dw, cpu.dw, at::matmul(dya.t(), xa), n);
    MESSAGE("FP8 linear on " << n << " tokens, GPU against the CPU path, in units of the bound: y " << wy
                             << ", dX " << wdx << ", dW " << wdw);
    CHECK(wy <= 1);
    CHECK(wdx <= 1);
    CHECK(wdw <= 1);
  }
}

// The blocks' linears in FP8 (Transformer::use_fp8, as model.quantization runs them), and
// a Qwen3-MoE's routed experts too (MoeSettings::fp8): on models in bf16, the loss stays
// within FP8's noise of bf16's (one e4m3 rounding is 2^-4 of a value at worst; over a random
// model's loss of about ln(vocab) the two agree to a few per cent) and every gradient is
// finite.
TEST_CASE("GPU kernels: models with FP8 linears and FP8 experts train beside bf16's") {
  if (!sm90()) {
    MESSAGE("no CUDA device of compute capability 9.0: FP8 model test skipped");
    return;
  }
  CHECK(!fp8::unavailable_on(torch::Device(torch::kCUDA, 0)));
  const auto [dense, moe] = train::fp8_test_models();
  for (const train::ModelArgs& a : {dense, moe}) {
    CAPTURE(a.model_type);
    train::Transformer bf16(a, torch::kCUDA, torch::kBFloat16, 5), f8(a, torch::kCUDA, torch::kBFloat16, 5);
    std::size_t n_fp8 = 0;
    for (const auto& c : f8.use_fp8({"lm_head", "router"})) n_fp8 += !c.bf16_because;
    CHECK(n_fp8 == (a.moe ? 4 : 7) * static_cast<std::size_t>(a.layers));  // q, k, v, o (gate, up, down)
    if (a.moe) {
      train::MoeSettings s;
      s.fp8 = true;
      f8.set_moe_settings(s);
    }
    const Tensor ids =
        torch::randint(0, a.vocab_size, {1, 512}, torch::TensorOptions().dtype(torch::kInt64)).cuda();
    const Tensor pos = torch::arange(512, torch::TensorOptions().dtype(torch::kInt64)).unsqueeze(0).cuda();
    auto loss_of = [&](train::Transformer& model) {
      Tensor l =
          model.loss(model.hidden({ids, pos, std::nullopt}, train::Recompute::nothing), ids, 1.0 / 512, 512);
      l.backward();
      return l.item<double>();
    };
    const double lb = loss_of(bf16), l8 = loss_of(f8);
    MESSAGE(a.model_type << " loss: bf16 " << lb << ", FP8 " << l8);
    CHECK(std::abs(l8 - lb) <= 0.02 * lb);
    for (const auto& p : f8.params())
      CHECK_MESSAGE(torch::isfinite(p.tensor.grad()).all().item<bool>(), p.name);
  }
}
