// The fused LM head + cross-entropy walked two ways: in token chunks, and in
// vocabulary chunks (FullOffload with tied embeddings, which hands the head gradient
// over chunk by chunk during the loss). Both are checked against torch's own
// cross_entropy and autograd in FP64, within what FP32 summation allows (the two
// walks sum in different orders, and MKL's threads may too from one call to the
// next), and the rows handed over must be the final head gradient, in order,
// covering the vocabulary once.
#include "nn/transformer.hpp"

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

using namespace primecfg::train;
using torch::Tensor;

namespace {

struct LossRun {
  double loss = 0;
  Tensor grad_hidden, grad_head;
};

LossRun run_loss(Transformer& model, const Tensor& hidden, const Tensor& targets, std::int64_t chunk_tokens,
                 Transformer::LossChunks chunks, Transformer::LossHooks hooks) {
  Tensor h = hidden.detach().clone().requires_grad_(true);
  auto& head = const_cast<Tensor&>(model.lm_head());
  if (head.grad().defined()) head.mutable_grad().reset();
  Tensor loss = model.loss(h, targets, 0.25, chunk_tokens, hooks, chunks);
  loss.backward();
  return {loss.item<double>(), h.grad().clone(), head.grad().clone()};
}

// torch's cross_entropy in FP64 with autograd: the oracle both walks are held to.
LossRun reference_loss(Transformer& model, const Tensor& hidden, const Tensor& targets, double scale) {
  Tensor h = hidden.detach().to(torch::kFloat64).requires_grad_(true);
  Tensor w = model.lm_head().detach().to(torch::kFloat64).requires_grad_(true);
  namespace F = torch::nn::functional;
  Tensor loss = F::cross_entropy(torch::matmul(h, w.t()), targets,
                                 F::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(-100)) *
                scale;
  loss.backward();
  return {loss.item<double>(), h.grad(), w.grad()};
}

// Entry-wise agreement with the FP64 reference: FP32 rounding of sums of a few dozen
// terms of magnitude up to max|ref|, so an absolute bound scaled by that magnitude.
bool near_reference(const Tensor& got, const Tensor& ref) {
  const double scale = ref.abs().max().item<double>();
  return (got.to(torch::kFloat64) - ref).abs().max().item<double>() <= 1e-5 * scale;
}

}  // namespace

TEST_CASE(
    "fused loss: vocabulary chunks give the loss and gradients of token chunks, and hand over every row "
    "once") {
  auto args = preset("primecfg/tiny");
  REQUIRE(args);
  Transformer model(*args, torch::kCPU, torch::kFloat32, 7);
  const std::int64_t vocab = args->vocab_size, tokens = 37;
  torch::manual_seed(3);
  Tensor hidden = torch::randn({tokens, args->hidden});
  Tensor targets = torch::randint(vocab, {tokens}, torch::TensorOptions().dtype(torch::kInt64));
  targets.index_put_({torch::arange(0, tokens, 5)}, -100);  // ignored positions

  const LossRun by_tokens = run_loss(model, hidden, targets, 8, Transformer::LossChunks::tokens, {});
  std::vector<std::pair<std::int64_t, Tensor>> handed;
  const Transformer::HeadGradHook hook = [&](std::int64_t first, const Tensor& rows) {
    handed.emplace_back(first, rows.clone());
  };
  std::vector<std::pair<std::int64_t, std::int64_t>> awaited;  // rows the loss said it was about to read
  const Transformer::HeadRowsHook before_rows = [&](std::int64_t first, std::int64_t end) {
    CHECK(handed.empty());  // the first pass reads every row before any gradient row exists
    awaited.emplace_back(first, end);
  };
  const LossRun by_vocab =
      run_loss(model, hidden, targets, 8, Transformer::LossChunks::vocabulary, {&hook, &before_rows});

  const LossRun oracle = reference_loss(model, hidden, targets, 0.25);
  for (const LossRun* run : {&by_tokens, &by_vocab}) {
    CHECK(run->loss == doctest::Approx(oracle.loss).epsilon(1e-6));
    CHECK(near_reference(run->grad_hidden, oracle.grad_hidden));
    CHECK(near_reference(run->grad_head, oracle.grad_head));
  }
  // Ignored targets give no gradient to their hidden states.
  CHECK(by_vocab.grad_hidden.select(0, 5).abs().max().item<float>() == 0.0f);

  // Several chunks, in row order, covering [0, vocab) exactly, each the final rows.
  REQUIRE(handed.size() >= 8);
  std::int64_t next = 0;
  for (const auto& [first, rows] : handed) {
    CHECK(first == next);
    CHECK(torch::equal(rows, by_vocab.grad_head.narrow(0, first, rows.size(0))));
    next = first + rows.size(0);
  }
  CHECK(next == vocab);
  // The same chunks were announced before they were read.
  REQUIRE(awaited.size() == handed.size());
  for (std::size_t i = 0; i < awaited.size(); ++i) {
    CHECK(awaited[i].first == handed[i].first);
    CHECK(awaited[i].second == handed[i].first + handed[i].second.size(0));
  }

  // Token chunks hand the head gradient over once, whole, when backward starts.
  handed.clear();
  awaited.clear();
  const LossRun hooked =
      run_loss(model, hidden, targets, 8, Transformer::LossChunks::tokens, {&hook, &before_rows});
  REQUIRE(awaited.size() == 1);
  CHECK(awaited[0] == std::pair<std::int64_t, std::int64_t>{0, vocab});
  REQUIRE(handed.size() == 1);
  CHECK(handed[0].first == 0);
  CHECK(torch::equal(handed[0].second, hooked.grad_head));

  // Without gradients (evaluation) the vocabulary walk gives the same loss.
  torch::NoGradGuard ng;
  Tensor eval = model.loss(hidden, targets, 0.25, 8, {}, Transformer::LossChunks::vocabulary);
  CHECK(eval.item<double>() == doctest::Approx(oracle.loss).epsilon(1e-6));
}
