// The routed experts' grouped path on a CUDA device (nn/moe.hpp): at::_grouped_mm on
// bf16 weights where the GPU has it (compute capability 9.x), against the per-expert
// loop on the same bf16 inputs, values and gradients; and expert parallelism's path (the
// rows sent, regrouped, run and sent back) over an exchange of one rank, against the
// same experts without it. Skips without CUDA; says so where the GPU lacks grouped GEMM
// (the batched fallback is then what runs, also checked).
//
// Tolerance: each path rounds its matmul outputs to bf16 (8 significant bits) once per
// GEMM, three in a row, in a different order of summation: against each other an
// element is off by a few bf16 ulps of the largest value it sums, bounded here by
// 2^-6 of the largest reference value.
#include "model/architecture.hpp"
#include "model/config.hpp"
#include "nn/moe.hpp"

#include <doctest/doctest.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#if defined(PRIMECFG_WITH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace {

using primecfg::train::MoeSettings;
using primecfg::train::MoeWeights;
using torch::Tensor;

struct Result {
  Tensor y, dx, drouter, dw1, dw3, dw2;
};

// An expert-parallel group of one rank: what it sends is what it receives.
struct Loopback final : primecfg::train::TokenExchange {
  int ranks() const override { return 1; }
  int index() const override { return 0; }
  void all_to_all(Tensor& out, const Tensor& in, const std::vector<std::int64_t>&,
                  const std::vector<std::int64_t>&) override {
    out.copy_(in);
  }
};

Result run(const MoeWeights& init, const Tensor& x0, const Tensor& dy, bool grouped,
           primecfg::train::TokenExchange* exchange = nullptr) {
  MoeWeights w{init.router.clone().requires_grad_(),
               {init.w1[0].clone().requires_grad_()},
               {init.w3[0].clone().requires_grad_()},
               {init.w2[0].clone().requires_grad_()}};
  Tensor x = x0.clone().requires_grad_();
  MoeSettings s;
  s.top_k = 4;
  s.grouped = grouped;
  s.exchange = exchange;
  Tensor y = primecfg::train::moe_forward(w, s, x);
  (y.to(torch::kFloat32) * dy).sum().backward();
  return {y.detach(), x.grad(), w.router.grad(), w.w1[0].grad(), w.w3[0].grad(), w.w2[0].grad()};
}

void close(const Tensor& got, const Tensor& want, const char* what) {
  const double bound = want.abs().max().item<double>() / 64;
  const double err = (got.to(torch::kFloat64) - want.to(torch::kFloat64)).abs().max().item<double>();
  INFO(what << ": " << err << " against a bound of " << bound);
  CHECK(err <= bound);
}

}  // namespace

TEST_CASE("GPU MoE: the grouped experts (at::_grouped_mm on sm90) match the per-expert loop, bf16") {
  if (!torch::cuda::is_available()) {
    MESSAGE("no CUDA device: grouped-GEMM test skipped");
    return;
  }
  const auto o = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const std::int64_t N = 4096, D = 512, I = 256, E = 32;
  torch::manual_seed(3);
  MoeWeights w{torch::randn({E, D}, o),
               {torch::randn({E, I, D}, o) / 22.6},
               {torch::randn({E, I, D}, o) / 22.6},
               {torch::randn({E, D, I}, o) / 16}};
  if (!primecfg::train::grouped_mm_available(w.w1[0]))
    MESSAGE("this GPU has no grouped GEMM (compute capability 9.x): the batched fallback is compared");
  const Tensor x = torch::randn({N, D}, o), dy = torch::randn({N, D}, o.dtype(torch::kFloat32));
  const Result g = run(w, x, dy, true), l = run(w, x, dy, false);
  close(g.y, l.y, "y");
  close(g.dx, l.dx, "dx");
  close(g.drouter, l.drouter, "drouter");
  close(g.dw1, l.dw1, "dw1");
  close(g.dw3, l.dw3, "dw3");
  close(g.dw2, l.dw2, "dw2");
}

TEST_CASE(
    "GPU MoE: expert parallelism's dispatch and combine over one rank give the experts' own results, bf16") {
  if (!torch::cuda::is_available()) {
    MESSAGE("no CUDA device: expert-parallel path test skipped");
    return;
  }
  const auto o = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const std::int64_t N = 2048, D = 256, I = 128, E = 16;
  torch::manual_seed(5);
  MoeWeights w{torch::randn({E, D}, o),
               {torch::randn({E, I, D}, o) / 16},
               {torch::randn({E, I, D}, o) / 16},
               {torch::randn({E, D, I}, o) / 11.3}};
  const Tensor x = torch::randn({N, D}, o), dy = torch::randn({N, D}, o.dtype(torch::kFloat32));
  Loopback one;
  const Result p = run(w, x, dy, true, &one), g = run(w, x, dy, true);
  // The same GEMMs on the same rows in the same order: equal but for the order of the
  // atomic adds that sum each token's slots.
  close(p.y, g.y, "y");
  close(p.dx, g.dx, "dx");
  close(p.drouter, g.drouter, "drouter");
  close(p.dw1, g.dw1, "dw1");
  close(p.dw3, g.dw3, "dw3");
  close(p.dw2, g.dw2, "dw2");
}

// The grouped GEMM reads the experts stacked; when the model holds them per expert that
// stack is a copy, which the forward frees once its GEMMs are queued and the backward
// stacks again (nn/moe.cpp). So a forward on per-expert weights keeps no more than one on
// weights already stacked (which autograd keeps by reference), where the copy alone is
// 3 E I D elements.
TEST_CASE("GPU MoE: the experts' stacked copy is not kept from the forward to the backward") {
#if defined(PRIMECFG_WITH_CUDA)
  if (!torch::cuda::is_available()) {
    MESSAGE("no CUDA device: stacked-copy test skipped");
    return;
  }
  const auto o = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const std::int64_t N = 1024, D = 512, I = 256, E = 64;
  torch::manual_seed(7);
  const Tensor router = torch::randn({E, D}, o), w1 = torch::randn({E, I, D}, o) / 22.6,
               w3 = torch::randn({E, I, D}, o) / 22.6, w2 = torch::randn({E, D, I}, o) / 16;
  const Tensor x = torch::randn({N, D}, o);
  auto allocated = [] {
    torch::cuda::synchronize();
    return c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].current;
  };
  auto kept = [&](bool per_expert) {
    MoeWeights w{router.clone().requires_grad_(), {}, {}, {}};
    for (const auto& [from, to] : {std::pair{&w1, &w.w1}, std::pair{&w3, &w.w3}, std::pair{&w2, &w.w2}}) {
      if (per_expert)
        for (std::int64_t e = 0; e < E; ++e) to->push_back((*from)[e].clone().requires_grad_());
      else
        to->push_back(from->clone().requires_grad_());
    }
    MoeSettings s;
    s.top_k = 4;
    const std::int64_t before = allocated();
    Tensor y = primecfg::train::moe_forward(w, s, x.clone().requires_grad_());
    const std::int64_t held = allocated() - before;
    y.to(torch::kFloat32).sum().backward();  // and the backward finds the copy again
    CHECK(w.w1.back().grad().defined());
    return held;
  };
  const std::int64_t stacked = kept(false), per_expert = kept(true), copy = 3 * E * I * D * 2;
  INFO("held after the forward: " << per_expert << " B per expert, " << stacked << " B stacked; the copy is "
                                  << copy << " B");
  CHECK(per_expert < stacked + copy / 4);
#else
  MESSAGE("built without CUDA: stacked-copy test skipped");
#endif
}

// What a routed layer keeps from its forward to its backward is what the planner counts
// for it (models/qwen3_moe/spec.cpp, block_memory's router and experts terms), per
// token: the router's FP32 input and probabilities and the top-k weights and ids, and per
// slot the gathered row, the four I-wide products of the experts' MLP and the expert's
// output. Beside those, what the planner leaves out as small: the groups' padding (up to
// `align` rows an expert: an empty group gets that many), the router's FP32 copy, and the
// slots' bookkeeping past the ids and weights counted (the sort order, each slot's token
// and place in its group, int64; each slot's weight, FP32: 28 bytes a slot). Autograd's own
// record of the weighted sum kept an FP32 copy of the outputs and the scaled rows besides,
// 4 D more bytes per slot than counted, far outside that.
TEST_CASE("GPU MoE: a routed layer keeps what the planner counts for it") {
#if defined(PRIMECFG_WITH_CUDA)
  if (!torch::cuda::is_available()) {
    MESSAGE("no CUDA device: kept-memory test skipped");
    return;
  }
  const auto o = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const std::int64_t N = 4096, D = 512, I = 128, E = 32, K = 4, dt = 2;
  torch::manual_seed(9);
  MoeWeights w{torch::randn({E, D}, o).requires_grad_(),
               {(torch::randn({E, I, D}, o) / 22.6).requires_grad_()},
               {(torch::randn({E, I, D}, o) / 22.6).requires_grad_()},
               {(torch::randn({E, D, I}, o) / 11.3).requires_grad_()}};
  if (!primecfg::train::grouped_mm_available(w.w1[0])) {
    MESSAGE("no grouped GEMM on this GPU: kept-memory test skipped (the batched fallback pads more)");
    return;
  }
  const Tensor x = torch::randn({N, D}, o).requires_grad_();
  MoeSettings s;
  s.top_k = K;
  auto allocated = [] {
    torch::cuda::synchronize();
    return c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].current;
  };
  // Once before measuring: the first GEMMs allocate cuBLAS's workspace (32 MiB on sm90)
  // from the same allocator, which stays.
  primecfg::train::moe_forward(w, s, x).to(torch::kFloat32).sum().backward();
  const std::int64_t before = allocated();
  Tensor y = primecfg::train::moe_forward(w, s, x);
  const std::int64_t kept = allocated() - before - y.numel() * dt;
  // models/qwen3_moe/spec.cpp's routed terms (router, slots); what it leaves out: the
  // groups' padding (under align rows per expert, each row as a slot's), the router's
  // FP32 copy and the allocator's 512-byte rounding of the small tensors.
  const std::int64_t counted =
      N * (D * 4 + E * 4 + K * (4 + 8) + K * (D * dt + 4 * I * dt + D * dt + 8 + 8 + 4));
  const std::int64_t small = E * s.align * ((2 * D + 4 * I) * dt + 20) + E * D * 4 + 16 * 512;
  INFO("kept " << kept << " B; the planner counts " << counted << " B, and up to " << small
               << " B of what it leaves out");
  CHECK(kept <= counted + small);
  CHECK(kept >= counted * 9 / 10);
  y.to(torch::kFloat32).sum().backward();
  CHECK(w.router.grad().defined());
#else
  MESSAGE("built without CUDA: kept-memory test skipped");
#endif
}

// The planner's stages of a routed block's backward (models/qwen3_moe/spec.cpp) against
// the allocator's peak while the layer's backward runs, the gradients not handed over
// (every expert's made whole, as in `optimizer` and `full`). Two shapes, so that each of
// the two kinds of stage is the fullest once: the weighted sum's FP32 temporaries (many
// slots, few experts' weights) and the down projection's GEMM backward with the experts
// stacked again (few slots).
TEST_CASE("GPU MoE: a routed layer's backward holds what the planner's stages say at their fullest") {
#if defined(PRIMECFG_WITH_CUDA)
  if (!torch::cuda::is_available()) {
    MESSAGE("no CUDA device: backward-memory test skipped");
    return;
  }
  const auto o = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const std::int64_t D = 512, I = 128, E = 32, dt = 2;
  if (!primecfg::train::grouped_mm_available(torch::zeros({E, I, D}, o))) {
    MESSAGE("no grouped GEMM on this GPU: backward-memory test skipped");
    return;
  }
  struct Shape {
    std::int64_t N, K;
    const char* fullest;
  };
  for (const Shape shape : {Shape{4096, 4, "the weighted sum's"}, Shape{256, 2, "the down projection's"}}) {
    const std::int64_t N = shape.N, K = shape.K;
    CAPTURE(N);
    torch::manual_seed(9);
    // Per-expert weights, as the trainer holds them: the grouped GEMM reads a stacked copy.
    auto experts = [&](std::int64_t rows, std::int64_t cols, double scale) {
      std::vector<Tensor> w;
      for (std::int64_t e = 0; e < E; ++e)
        w.push_back((torch::randn({rows, cols}, o) / scale).requires_grad_());
      return w;
    };
    MoeWeights w{torch::randn({E, D}, o).requires_grad_(), experts(I, D, 22.6), experts(I, D, 22.6),
                 experts(D, I, 11.3)};
    const Tensor x = torch::randn({N, D}, o).requires_grad_();
    MoeSettings s;
    s.top_k = K;
    auto clear_grads = [&] {
      for (auto* ws : {&w.w1, &w.w3, &w.w2})
        for (auto& t : *ws) t.mutable_grad().reset();
      w.router.mutable_grad().reset();
      x.mutable_grad().reset();
    };
    primecfg::train::moe_forward(w, s, x).to(torch::kFloat32).sum().backward();  // cuBLAS's workspace
    clear_grads();
    Tensor y = primecfg::train::moe_forward(w, s, x);
    const Tensor seed = torch::randn_like(y);  // the gradient coming in
    torch::cuda::synchronize();
    c10::cuda::CUDACachingAllocator::resetPeakStats(0);
    const auto stats = [] { return c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0]; };
    const std::int64_t before = stats().current;
    y.backward(seed);
    torch::cuda::synchronize();
    const std::int64_t above = stats().peak - before;
    // The planner's: the fullest stage (the gradient coming in is `seed`, already counted).
    primecfg::train::ModelArgs a;
    a.model_type = "qwen3_moe";
    a.hidden = D, a.layers = 1, a.heads = 1, a.kv_heads = 1, a.head_dim = 8;
    primecfg::train::MoeArgs m;
    m.experts = E, m.top_k = K, m.intermediate = I;
    a.moe = m;
    const auto bm = a.architecture().block_memory(a, {.dtype_bytes = dt, .fused_norm = true});
    std::int64_t planned = 0;
    for (const auto& st : bm.backward)
      if (!st.recomputed)
        planned = std::max(planned, N * (st.per_token - D * dt) + st.in_use + st.in_use_grad);
    // What the stages leave out: the groups' padding (under align rows an expert, each
    // row as wide as a slot's gradients), the router's and the indices' gradients and the
    // allocator's rounding of small tensors.
    const std::int64_t small = E * s.align * (8 * D + (D + 4 * I) * dt) + N * (E * 8 + K * 8) + 32 * 512;
    INFO(shape.fullest << " stage: the backward rose " << above << " B above the forward's kept bytes; the "
                       << "planner says " << planned << " B, and up to " << small
                       << " B of what it leaves out");
    CHECK(above <= planned + small);
    CHECK(above >= planned * 9 / 10);
    CHECK(w.w2[0].grad().defined());
  }
#else
  MESSAGE("built without CUDA: backward-memory test skipped");
#endif
}
