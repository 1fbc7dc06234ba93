// FP8 casts (nn/fp8.hpp) on tensors larger than one of their slices of rows: a 1 x 128
// group's scale and values depend on its row alone, a 128 x 128 block's on its 128 rows,
// so any rows of a large tensor's cast must be the cast of those rows by themselves (whose
// bits tests/trainer/fp8_test.py holds to the format's definition).
#include "fp8_models.hpp"
#include "nn/fp8.hpp"
#include "nn/transformer.hpp"

#include <doctest/doctest.h>
#include <torch/torch.h>

namespace {

namespace fp8 = primecfg::train::fp8;
namespace train = primecfg::train;
using torch::Tensor;

bool same_bits(const fp8::Quantized& a, const fp8::Quantized& b) {
  return torch::equal(a.scales, b.scales) &&
         torch::equal(a.values.to(torch::kFloat32), b.values.to(torch::kFloat32));
}

}  // namespace

TEST_CASE("fp8: a large tensor's casts are its rows' and blocks' casts, across the slices they run in") {
  torch::manual_seed(3);
  // 2^24 / 384 rows of three groups make one slice; this is two slices and a part.
  const std::int64_t rows = 2 * (std::int64_t{1} << 24) / 384 + 300, cols = 300;
  const Tensor x = torch::randn({rows, cols}) * torch::rand({rows, 1}) * 10;
  const fp8::Quantized whole = fp8::quantize_rows(x);
  for (std::int64_t r : {std::int64_t{0}, (std::int64_t{1} << 24) / 384 - 2, rows - 5}) {
    CAPTURE(r);
    const fp8::Quantized part = fp8::quantize_rows(x.narrow(0, r, 5));
    CHECK(same_bits({whole.values.narrow(0, r, 5), whole.scales.narrow(0, r, 5)}, part));
  }
  // Weights: 128-row blocks; a slice is 2^24 / (128 x 384) block rows.
  const fp8::Quantized blocks = fp8::quantize_blocks(x);
  const std::int64_t slice_rows = (std::int64_t{1} << 24) / (128 * 384) * 128, last = (rows - 1) / 128 * 128;
  for (std::int64_t r : {std::int64_t{0}, slice_rows - 128, slice_rows, last}) {
    CAPTURE(r);
    const std::int64_t n = std::min<std::int64_t>(256, rows - r);
    const fp8::Quantized part = fp8::quantize_blocks(x.narrow(0, r, n));
    CHECK(
        same_bits({blocks.values.narrow(0, r, n), blocks.scales.narrow(0, r / 128, (n + 127) / 128)}, part));
  }
}

// The backward's casts without a second read of the bf16 weight or a transposed copy of the
// activations: W^T's blocks are W's transposed, and quantize_cols(x) is the cast of x^T
// with its columns (the tokens) zero-padded to a multiple of 128.
TEST_CASE("fp8: the backward's casts of W^T and X^T are the casts of the transposed matrices") {
  torch::manual_seed(5);
  const Tensor w = torch::randn({300, 200}) * torch::rand({300, 1}) * 4;
  CHECK(same_bits(fp8::transposed(fp8::quantize_blocks(w)), fp8::quantize_blocks(w.t().contiguous())));
  const fp8::Quantized cols = fp8::quantize_cols(w);
  REQUIRE(cols.values.sizes() == torch::IntArrayRef{200, 384});
  const Tensor padded = torch::zeros({200, 384});
  padded.narrow(1, 0, 300).copy_(w.t());
  CHECK(same_bits(cols, fp8::quantize_rows(padded)));
}

// prime-rl backpropagates the loss summed over tokens and normalises the gradients after;
// this trainer backpropagates the mean. With the ratio of the two set (a power of two here,
// so that every scaling is exact), the backward casts the groups prime-rl casts: its
// gradients are prime-rl's divided by the ratio, bit for bit. Output gradients of the size
// they have in prime-rl's units (some groups above the floor, some below), in both units.
// The projections of one input (q, k, v) with x cast once: each output and each weight's
// gradient the separate linear's to the bit, the input's gradient their sum (added as
// autograd adds the separate linears': the last first).
TEST_CASE("fp8: linears that read one input give the separate linears' values") {
  torch::manual_seed(5);
  const Tensor x0 = torch::randn({70, 256}) * torch::randn({70, 1}).exp();
  const std::vector<Tensor> w0{torch::randn({256, 256}) * 0.05, torch::randn({128, 256}) * 0.05,
                               torch::randn({384, 256}) * 0.05};
  std::vector<Tensor> dys;
  for (const Tensor& w : w0) dys.push_back(torch::randn({70, w.size(0)}) * 1e-3);

  const Tensor x = x0.clone().requires_grad_();
  std::vector<Tensor> ws;
  for (const Tensor& w : w0) ws.push_back(w.clone().requires_grad_());
  const auto ys = fp8::linears(x, ws);
  torch::autograd::backward(ys, dys);

  Tensor dx_sum;
  for (std::size_t i = w0.size(); i-- > 0;) {
    CAPTURE(i);
    const Tensor xi = x0.clone().requires_grad_(), wi = w0[i].clone().requires_grad_();
    const Tensor y = fp8::linear(xi, wi);
    y.backward(dys[i]);
    CHECK(torch::equal(y, ys[i]));
    CHECK(torch::equal(wi.grad(), ws[i].grad()));
    dx_sum = dx_sum.defined() ? dx_sum + xi.grad() : xi.grad();
  }
  CHECK(torch::equal(dx_sum, x.grad()));
}

TEST_CASE("fp8: the backward casts the output gradient in prime-rl's units (the loss summed over tokens)") {
  torch::manual_seed(11);
  const double ratio = 4096;
  const Tensor x = torch::randn({256, 256}), w = torch::randn({128, 256}) * 0.05;
  const Tensor dy_prime = torch::randn({256, 128}) * (torch::randn({256, 1}) * 2).exp() * 0.01;
  auto grads = [&](const Tensor& dy, double set_ratio) {
    const Tensor xv = x.clone().requires_grad_(), wv = w.clone().requires_grad_();
    fp8::set_output_grad_ratio(set_ratio);
    const Tensor y = fp8::linear(xv, wv);
    fp8::set_output_grad_ratio(1);  // the forward's setting is the one its backward uses
    y.backward(dy);
    return std::pair{xv.grad(), wv.grad()};
  };
  const auto [dx_prime, dw_prime] = grads(dy_prime, 1);
  const auto [dx, dw] = grads(dy_prime / ratio, ratio);
  CHECK(torch::equal(dx * ratio, dx_prime));
  CHECK(torch::equal(dw * ratio, dw_prime));
  // In this trainer's units without the ratio, the floor takes every group and the small
  // values of each are lost: another gradient.
  const auto [dx_floored, dw_floored] = grads(dy_prime / ratio, 1);
  CHECK_FALSE(torch::allclose(dx_floored * ratio, dx_prime, 1e-2, 0));
  CHECK_FALSE(torch::allclose(dw_floored * ratio, dw_prime, 1e-2, 0));
  CHECK_THROWS_AS(fp8::set_output_grad_ratio(0), std::invalid_argument);
}

// The same through whole models, dense and with routed experts in FP8, as the trainer runs
// them: the loss as a mean over 256 tokens with the ratio 256 set gives every parameter
// the gradient of the loss summed (prime-rl's backward) with the ratio 1, divided by 256,
// bit for bit (every scaling is by a power of two). Without the ratio, another gradient.
TEST_CASE(
    "fp8: a model's gradients of the mean loss with the ratio are those of the summed loss over the tokens") {
  const auto [dense, moe] = train::fp8_test_models();
  const std::int64_t tokens = 256;
  torch::manual_seed(13);
  const Tensor ids = torch::randint(0, dense.vocab_size, {1, tokens}, torch::kInt64);
  const Tensor pos = torch::arange(tokens, torch::kInt64).unsqueeze(0);
  for (const train::ModelArgs& a : {dense, moe}) {
    CAPTURE(a.model_type);
    auto grads = [&](double loss_scale, double ratio) {
      train::Transformer model(a, torch::kCPU, torch::kFloat32, 5);
      std::size_t n_fp8 = 0;
      for (const auto& c : model.use_fp8({"lm_head", "router"})) n_fp8 += !c.bf16_because;
      REQUIRE(n_fp8 > 0);
      if (a.moe) {
        train::MoeSettings s;
        s.fp8 = true;
        model.set_moe_settings(s);
      }
      fp8::set_output_grad_ratio(ratio);
      model.loss(model.hidden({ids, pos, std::nullopt}, train::Recompute::nothing), ids, loss_scale, tokens)
          .backward();
      fp8::set_output_grad_ratio(1);
      std::vector<std::pair<std::string, Tensor>> out;
      for (const auto& p : model.params()) out.emplace_back(p.name, p.tensor.grad());
      return out;
    };
    const auto summed = grads(1.0, 1), mean = grads(1.0 / tokens, tokens), floored = grads(1.0 / tokens, 1);
    REQUIRE(summed.size() == mean.size());
    bool any_differs = false;
    for (std::size_t i = 0; i < summed.size(); ++i) {
      CAPTURE(summed[i].first);
      CHECK(torch::equal(mean[i].second * tokens, summed[i].second));
      any_differs = any_differs || !torch::equal(floored[i].second * tokens, summed[i].second);
    }
    CHECK(any_differs);
  }
}
