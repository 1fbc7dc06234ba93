// The fused CUDA kernels (reference_trainer/nn/kernels) against ATen: RMSNorm, SwiGLU
// and QK-norm with RoPE, values and gradients for bf16 inputs, at sizes that take the vector path (rows of a
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
#include "nn/loss.hpp"

#include <doctest/doctest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>
#include <optional>
#include <string>
#include <tuple>

namespace {

using torch::Tensor;
namespace fused = primecfg::train::fused;
using primecfg::train::linear_cross_entropy;

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

// HF's rotate-half, written out here as the oracle: x * cos + cat(-x2, x1) * sin.
Tensor rotate_half_rope(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const std::int64_t half = x.size(-1) / 2;
  return x * cos + torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1) * sin;
}

// Sets norm_rope's switch for a scope and puts back what the process had (on by default).
struct NormRopeSwitch {
  bool before = fused::norm_rope_enabled();
  explicit NormRopeSwitch(bool on) { fused::set_norm_rope_enabled(on); }
  ~NormRopeSwitch() { fused::set_norm_rope_enabled(before); }
};

// x [B, T, heads, dim]; tables as the model builds them (positions, inverse frequencies,
// bf16 cos and sin of [B, T, 1, dim]), each sample at its own offset.
void norm_rope_case(const std::vector<std::int64_t>& sizes, bool with_norm, bool shifted) {
  CAPTURE(with_norm);
  CAPTURE(shifted);
  const std::int64_t B = sizes[0], T = sizes[1], dim = sizes[3];
  CAPTURE(T);
  CAPTURE(dim);
  const double eps = 1e-6;
  const auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  Tensor positions = torch::arange(T, f32).unsqueeze(0) + 1000 * torch::arange(B, f32).unsqueeze(1);
  Tensor inv_freq = 1.0 / torch::pow(1e6, torch::arange(0, dim, 2, f32) / dim);
  Tensor freqs = positions.unsqueeze(-1) * inv_freq;
  Tensor emb = torch::cat({freqs, freqs}, -1).unsqueeze(2);
  Tensor cos = emb.cos().to(torch::kBFloat16), sin = emb.sin().to(torch::kBFloat16);

  Tensor x = (shifted ? misaligned(sizes) : torch::randn(sizes, bf16())).detach().requires_grad_(true);
  Tensor w = with_norm ? (1 + 0.1 * torch::randn({dim}, bf16())).detach().requires_grad_(true) : Tensor();
  Tensor dy = torch::randn(sizes, bf16());
  Tensor y;
  {
    NormRopeSwitch kernel(true);
    y = fused::norm_rope(x, w, cos, sin, eps);
  }
  REQUIRE(y.grad_fn());
  CHECK(y.grad_fn()->name().find("CppNode") != std::string::npos);  // the kernel, not ATen
  // As the block uses it: attention reads a transposed view, so the gradient comes back strided.
  y.transpose(1, 2).backward(dy.transpose(1, 2));

  Tensor x64 = x.detach().to(torch::kFloat64).requires_grad_(true);
  Tensor w64 = with_norm ? w.detach().to(torch::kFloat64).requires_grad_(true) : Tensor();
  Tensor n64 = with_norm ? at::rms_norm(x64, {dim}, w64, eps) : x64;
  Tensor y64 = rotate_half_rope(n64, cos.to(torch::kFloat64), sin.to(torch::kFloat64));
  y64.backward(dy.to(torch::kFloat64));
  check_close("y", y, y64);
  check_close("dx", x.grad(), x64.grad());
  if (with_norm) check_close("dweight", w.grad(), w64.grad());

  // What the model computed before (ATen in bf16), for the record.
  Tensor xa = x.detach().clone().requires_grad_(true);
  Tensor wa = with_norm ? w.detach().clone().requires_grad_(true) : Tensor();
  Tensor ya;
  {
    NormRopeSwitch aten(false);
    ya = fused::norm_rope(xa, wa, cos, sin, eps);
  }
  ya.backward(dy);
  MESSAGE("vs the unfused bf16 path: y " << (ya - y).abs().max().item<float>() << ", dx "
                                         << (xa.grad() - x.grad()).abs().max().item<float>());
}

// The cross-entropy kernel's switch, restored at the end of a test.
struct CrossEntropySwitch {
  bool before = fused::cross_entropy_enabled();
  explicit CrossEntropySwitch(bool on) { fused::set_cross_entropy_enabled(on); }
  ~CrossEntropySwitch() { fused::set_cross_entropy_enabled(before); }
};

// Each row's loss (FP32, against FP64 on the same bf16 logits) and the gradient written
// over the logits (scale * (softmax - one-hot), against FP64).
void cross_entropy_case(std::int64_t rows, std::int64_t vocab, bool misalign) {
  CAPTURE(rows);
  CAPTURE(vocab);
  CAPTURE(misalign);
  CrossEntropySwitch kernel(true);
  // Logits of a trained head's spread, so that the softmax is far from uniform.
  Tensor x = (misalign ? misaligned({rows, vocab}) : torch::randn({rows, vocab}, bf16())) * 4;
  x = x.contiguous();
  Tensor targets =
      torch::randint(vocab, {rows}, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kInt64));
  const double scale = 1.0 / 3000;
  const Tensor x64 = x.to(torch::kFloat64);
  const Tensor lse = x64.logsumexp(1);
  const Tensor loss_ref = lse - x64.gather(1, targets.unsqueeze(1)).squeeze(1);
  const Tensor grad_ref = (x64 - lse.unsqueeze(1))
                              .exp()
                              .scatter_add(1, targets.unsqueeze(1), -torch::ones({rows, 1}, x64.options())) *
                          scale;
  Tensor g = x.clone();
  const Tensor loss = fused::cross_entropy_grad_(g, targets, scale);
  REQUIRE(loss.defined());
  CHECK(static_cast<bool>(loss.scalar_type() == torch::kFloat32));
  const double loss_err = (loss.to(torch::kFloat64) - loss_ref).abs().max().item<double>();
  MESSAGE("loss: max |err| " << loss_err << " (max loss " << loss_ref.max().item<double>() << ")");
  CHECK(loss_err <= 1e-5 * loss_ref.abs().max().item<double>() + 1e-6);
  check_close("gradient", g, grad_ref);
}

}  // namespace

TEST_CASE("GPU kernels: fused cross-entropy matches ATen (row losses, gradient in place; bf16; odd sizes)") {
  if (!have_kernels()) return;
  torch::manual_seed(6);
  cross_entropy_case(7, 1000, false);      // vector path
  cross_entropy_case(7, 1000, true);       // misaligned: scalar path
  cross_entropy_case(5, 1001, false);      // odd vocabulary: scalar path
  cross_entropy_case(3, 151936, false);    // Qwen3's vocabulary
  cross_entropy_case(300, 128256, false);  // Llama 3's, many rows
  cross_entropy_case(2, 5, false);         // fewer values than threads

  // An ignored token (-100) adds nothing: a zero loss and a zero gradient row, the other
  // rows as without it.
  {
    CrossEntropySwitch kernel(true);
    Tensor x = torch::randn({4, 1000}, bf16()) * 4;
    Tensor t =
        torch::tensor({5, -100, 999, -100}, torch::TensorOptions().dtype(torch::kInt64)).to(torch::kCUDA);
    Tensor g = x.clone();
    const Tensor loss = fused::cross_entropy_grad_(g, t, 0.5);
    REQUIRE(loss.defined());
    CHECK(loss[1].item<float>() == 0.f);
    CHECK(loss[3].item<float>() == 0.f);
    CHECK(g.select(0, 1).abs().max().item<float>() == 0.f);
    CHECK(g.select(0, 3).abs().max().item<float>() == 0.f);
    Tensor kept = x.index_select(0, torch::tensor({0, 2}).to(torch::kCUDA)).clone();
    const Tensor loss_kept =
        fused::cross_entropy_grad_(kept, torch::tensor({5, 999}).to(torch::kCUDA).to(torch::kInt64), 0.5);
    CHECK(torch::equal(loss.index_select(0, torch::tensor({0, 2}).to(torch::kCUDA)), loss_kept));
    CHECK(torch::equal(g.index_select(0, torch::tensor({0, 2}).to(torch::kCUDA)), kept));
  }

  // A target outside the vocabulary is NaN, not a silent zero; the switch off, or
  // FP32 logits, leave ATen's path to the caller.
  CrossEntropySwitch kernel(true);
  Tensor x = torch::randn({2, 64}, bf16());
  Tensor bad = torch::tensor({3, 64}, torch::TensorOptions().dtype(torch::kInt64)).to(torch::kCUDA);
  const Tensor loss = fused::cross_entropy_grad_(x, bad, 1.0).cpu();
  CHECK(std::isfinite(loss[0].item<float>()));
  CHECK(std::isnan(loss[1].item<float>()));
  Tensor x32 = torch::randn({2, 64}, torch::TensorOptions().device(torch::kCUDA));
  CHECK_FALSE(fused::cross_entropy_grad_(x32, bad, 1.0).defined());
  fused::set_cross_entropy_enabled(false);
  CHECK_FALSE(fused::cross_entropy_grad_(x, bad, 1.0).defined());
}

TEST_CASE(
    "GPU kernels: the LM head's loss on the fused kernel walks every token, ignored ones included, as "
    "ATen's") {
  if (!have_kernels()) return;
  torch::manual_seed(7);
  // 37 tokens, a third of them ignored, in chunks of 8 (a short last one); vocabulary 1000.
  const std::int64_t n = 37, d = 64, vocab = 1000;
  const Tensor h0 = torch::randn({n, d}, bf16());
  const Tensor w0 = torch::randn({vocab, d}, bf16()) * 0.2;
  Tensor targets =
      torch::randint(vocab, {n}, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kInt64));
  targets.index_fill_(0, torch::arange(0, n, 3, targets.options()), -100);
  auto run = [&](bool kernel) {
    CrossEntropySwitch on(kernel);
    Tensor h = h0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    Tensor loss = linear_cross_entropy(h, w, targets, 1.0 / 25, 8, nullptr, nullptr, false);
    loss.backward();
    return std::tuple{loss.detach().to(torch::kFloat64), h.grad().to(torch::kFloat64),
                      w.grad().to(torch::kFloat64)};
  };
  const auto [loss_k, gh_k, gw_k] = run(true);
  const auto [loss_a, gh_a, gw_a] = run(false);
  CHECK(std::abs(loss_k.item<double>() - loss_a.item<double>()) <= 1e-3 * std::abs(loss_a.item<double>()));
  // The ignored tokens' rows get exactly nothing; the rest agree to bf16 rounding (the
  // kernel rounds the gradient once, ATen's path casts an FP32 softmax).
  const Tensor ignored = torch::arange(0, n, 3, targets.options());
  CHECK(gh_k.index_select(0, ignored).abs().max().item<double>() == 0.0);
  CHECK((gh_k - gh_a).abs().max().item<double>() <= 2e-2 * gh_a.abs().max().item<double>());
  CHECK((gw_k - gw_a).abs().max().item<double>() <= 2e-2 * gw_a.abs().max().item<double>());
}

TEST_CASE("GPU kernels: fused QK-norm + RoPE matches ATen (values, dx, dweight; bf16; odd sizes)") {
  if (!have_kernels()) return;
  torch::manual_seed(5);
  norm_rope_case({2, 37, 16, 128}, true, false);  // Qwen3's queries: 16 heads of 128
  norm_rope_case({2, 37, 8, 128}, true, false);   // and keys
  norm_rope_case({2, 37, 8, 128}, true, true);    // misaligned data
  norm_rope_case({1, 50, 3, 64}, false, false);   // no QK-norm (Llama), head_dim 64: one pair a lane
  norm_rope_case({3, 5, 2, 80}, true, false);     // head_dim 80: lanes past the pairs idle
  norm_rope_case({1, 9, 2, 256}, true, false);    // four pairs a lane
  norm_rope_case({1, 3, 2, 512}, true, false);    // eight: the widest fused
  norm_rope_case({2, 2500, 1, 64}, true, false);  // more tokens than the backward's blocks hold warps
}

TEST_CASE("GPU kernels: QK-norm + RoPE outside the kernel's shapes take ATen's path") {
  if (!have_kernels()) return;
  std::optional<NormRopeSwitch> kernel(std::in_place, true);
  for (std::int64_t dim : {514, 1024}) {
    CAPTURE(dim);
    Tensor x = torch::randn({1, 4, 2, dim}, bf16()).requires_grad_(true);
    Tensor t = torch::ones({1, 4, 1, dim}, bf16());
    Tensor y = fused::norm_rope(x, Tensor(), t, t, 1e-6);
    CHECK(y.grad_fn()->name().find("CppNode") == std::string::npos);
  }
  // Tables broadcast over the batch are not the kernel's layout either.
  Tensor x = torch::randn({2, 4, 2, 64}, bf16()).requires_grad_(true);
  Tensor t = torch::ones({1, 4, 1, 64}, bf16());
  CHECK(fused::norm_rope(x, Tensor(), t, t, 1e-6).grad_fn()->name().find("CppNode") == std::string::npos);
  kernel.emplace(false);  // switched off, even the kernel's own layout
  Tensor t2 = torch::ones({2, 4, 1, 64}, bf16());
  CHECK(fused::norm_rope(x, Tensor(), t2, t2, 1e-6).grad_fn()->name().find("CppNode") == std::string::npos);
}

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
