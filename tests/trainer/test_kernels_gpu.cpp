// The fused CUDA kernels (reference_trainer/nn/kernels) against ATen: RMSNorm and SwiGLU
// values and gradients for bf16 inputs, at sizes that take the vector path (rows of a
// multiple of 8 values) and the scalar one (odd sizes, misaligned data). Skips where
// there is no CUDA device or the build has no kernels (no nvcc).
//
// Tolerance: the kernels compute in FP32 and round each output once to bf16, so against
// an FP64 reference on the same bf16 inputs an element is off by at most half a bf16
// ulp, 2^-8 of its magnitude (bf16 keeps 8 significant bits), plus the FP32 rounding of
// the row and column sums; those sums cancel in dx, so that part is bounded by the
// largest reference value rather than the element's: |got - ref| <= |ref| / 256 +
// 1e-4 * max|ref|. A wrong formula (a missing rstd factor, a row or column summed
// twice or not at all) is off by far more.
#include "nn/kernels/fused_ops.hpp"

#include <doctest/doctest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <string>

namespace {

using torch::Tensor;
namespace fused = primecfg::train::fused;

bool have_kernels() {
  if (!torch::cuda::is_available()) {
    MESSAGE("no CUDA device: fused kernel tests skipped");
    return false;
  }
  if (!fused::kernels_built()) {
    MESSAGE("built without the fused CUDA kernels (no nvcc): their tests skipped");
    return false;
  }
  return true;
}

void check_close(const std::string& what, const Tensor& got, const Tensor& ref) {
  CAPTURE(what);
  REQUIRE(got.defined());
  REQUIRE(static_cast<bool>(got.sizes() == ref.sizes()));
  CHECK(static_cast<bool>(got.scalar_type() == torch::kBFloat16));
  const Tensor g = got.to(torch::kFloat64), r = ref.to(torch::kFloat64);
  const double scale = r.abs().max().item<double>();
  const Tensor err = (g - r).abs();
  const bool ok = (err <= r.abs() / 256 + 1e-4 * scale).all().item<bool>();
  MESSAGE(what << ": max |err| " << err.max().item<double>() << " (max |ref| " << scale << ")");
  CHECK(ok);
}

torch::TensorOptions bf16() { return torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16); }

// A contiguous bf16 tensor whose data starts 2 bytes past a 16-byte boundary.
Tensor misaligned(const std::vector<std::int64_t>& sizes) {
  std::int64_t n = 1;
  for (auto s : sizes) n *= s;
  return torch::randn({n + 1}, bf16()).narrow(0, 1, n).view(sizes);
}

void rms_norm_case(const std::vector<std::int64_t>& sizes, bool shifted) {
  CAPTURE(shifted);
  const std::int64_t cols = sizes.back();
  CAPTURE(cols);
  const double eps = 1e-6;
  Tensor x = (shifted ? misaligned(sizes) : torch::randn(sizes, bf16())).detach().requires_grad_(true);
  Tensor w = (1 + 0.1 * torch::randn({cols}, bf16())).detach().requires_grad_(true);
  Tensor dy = torch::randn(sizes, bf16());
  Tensor y = fused::rms_norm(x, w, eps);
  REQUIRE(y.grad_fn());
  CHECK(y.grad_fn()->name().find("CppNode") != std::string::npos);  // the kernel, not ATen
  y.backward(dy);

  Tensor x64 = x.detach().to(torch::kFloat64).requires_grad_(true);
  Tensor w64 = w.detach().to(torch::kFloat64).requires_grad_(true);
  Tensor y64 = at::rms_norm(x64, {cols}, w64, eps);
  y64.backward(dy.to(torch::kFloat64));
  check_close("y", y, y64);
  check_close("dx", x.grad(), x64.grad());
  check_close("dweight", w.grad(), w64.grad());

  // What the model computed before (ATen in bf16), for the record.
  Tensor xa = x.detach().clone().requires_grad_(true), wa = w.detach().clone().requires_grad_(true);
  Tensor ya = at::rms_norm(xa, {cols}, wa, eps);
  ya.backward(dy);
  MESSAGE("vs ATen bf16: y " << (ya - y).abs().max().item<float>() << ", dx "
                             << (xa.grad() - x.grad()).abs().max().item<float>() << ", dweight "
                             << (wa.grad() - w.grad()).abs().max().item<float>());
}

void swiglu_case(const std::vector<std::int64_t>& sizes, bool shifted) {
  CAPTURE(shifted);
  CAPTURE(sizes.back());
  // A wide range of gates: silu's tails (sigmoid near 0 and 1) as well as its middle.
  // In place: a product would be a fresh (aligned) tensor.
  Tensor g =
      (shifted ? misaligned(sizes) : torch::randn(sizes, bf16())).mul_(4).detach().requires_grad_(true);
  Tensor u = torch::randn(sizes, bf16()).requires_grad_(true);
  Tensor d = torch::randn(sizes, bf16());
  Tensor m = fused::swiglu(g, u);
  REQUIRE(m.grad_fn());
  CHECK(m.grad_fn()->name().find("CppNode") != std::string::npos);
  m.backward(d);

  Tensor g64 = g.detach().to(torch::kFloat64).requires_grad_(true);
  Tensor u64 = u.detach().to(torch::kFloat64).requires_grad_(true);
  Tensor m64 = torch::silu(g64) * u64;
  m64.backward(d.to(torch::kFloat64));
  check_close("out", m, m64);
  check_close("dgate", g.grad(), g64.grad());
  check_close("dup", u.grad(), u64.grad());
}

}  // namespace

TEST_CASE("GPU kernels: fused RMSNorm matches ATen (values, dx, dweight; bf16; odd sizes)") {
  if (!have_kernels()) return;
  torch::manual_seed(3);
  rms_norm_case({7, 1000}, false);       // hidden 1000, 7 rows: rows held in registers
  rms_norm_case({7, 1000}, true);        // misaligned: scalar path
  rms_norm_case({7, 1001}, false);       // odd width: scalar path
  rms_norm_case({2, 5, 3, 128}, false);  // QK-norm: head_dim 128 over [B, T, heads]
  rms_norm_case({3, 7, 2, 64}, false);   // head_dim 64
  rms_norm_case({2000, 128}, false);     // many rows: the weight gradient's partial sums over many blocks
  rms_norm_case({333, 3072}, false);     // wide rows: two passes over each, dweight on its own
  rms_norm_case({5, 2048}, false);       // forward in registers, backward in two passes
}

TEST_CASE("GPU kernels: fused SwiGLU matches ATen (values, dgate, dup; bf16; odd sizes)") {
  if (!have_kernels()) return;
  torch::manual_seed(4);
  swiglu_case({7, 1000}, false);
  swiglu_case({7, 1000}, true);
  swiglu_case({7, 1001}, false);
  swiglu_case({2, 9, 3072}, false);
}

TEST_CASE("GPU kernels: the switch and other dtypes take ATen's path") {
  if (!have_kernels()) return;
  Tensor x = torch::randn({4, 64}, torch::TensorOptions().device(torch::kCUDA)).requires_grad_(true);
  Tensor w = torch::ones({64}, x.options()).requires_grad_(true);
  // FP32 stays on ATen: the FP32 GPU tests' numbers are ATen's.
  CHECK(fused::rms_norm(x, w, 1e-6).grad_fn()->name().find("CppNode") == std::string::npos);
  Tensor xb = x.detach().to(torch::kBFloat16).requires_grad_(true);
  Tensor wb = w.detach().to(torch::kBFloat16).requires_grad_(true);
  fused::set_enabled(false);
  CHECK(fused::rms_norm(xb, wb, 1e-6).grad_fn()->name().find("CppNode") == std::string::npos);
  CHECK(fused::swiglu(xb, xb).grad_fn()->name().find("CppNode") == std::string::npos);
  fused::set_enabled(true);
  CHECK(fused::rms_norm(xb, wb, 1e-6).grad_fn()->name().find("CppNode") != std::string::npos);
}
