#include "nn/transformer.hpp"

#include "model/architecture.hpp"
#include "nn/fp8.hpp"
#include "nn/kernels/fused_ops.hpp"
#include "nn/loss.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <unordered_map>

namespace primecfg::train {

using torch::Tensor;
namespace F = torch::nn::functional;

// ---------------------------------------------------------------------------
// Construction and weights
// ---------------------------------------------------------------------------

Transformer::Transformer(const ModelArgs& a, torch::Device device, torch::ScalarType dtype,
                         std::uint64_t seed, const ParamBuilt& built)
    : args_(a), device_(device), dtype_(dtype) {
  // Random values are drawn in FP32 from a generator seeded here. On the CPU it is a
  // private generator, so the same seed gives the same model in every dtype. On a
  // GPU they are drawn there from the device's generator (a billion-parameter
  // preset would take minutes on one CPU thread): the same seed gives the same
  // model on that kind of device, not the CPU's.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::optional<at::Generator> dev_gen;
  if (!device_.is_cpu()) {
    dev_gen = at::globalContext().defaultGenerator(device_);
    std::lock_guard<std::mutex> lock(dev_gen->mutex());
    dev_gen->set_current_seed(seed);
  }
  torch::NoGradGuard no_grad;
  // Copied once: a host-to-device copy in every forward pass would make the host wait.
  inv_freq_ = torch::tensor(a.rope_inv_freq(), torch::kFloat64).to(device_, torch::kFloat32);
  for (const auto& shape : a.params()) {
    std::vector<std::int64_t> sizes{shape.rows};
    if (shape.is_matrix()) sizes.push_back(shape.cols);
    Tensor t;
    if (shape.kind == ParamShape::Kind::norm)
      t = torch::ones(sizes);
    else if (shape.kind == ParamShape::Kind::bias)
      t = torch::zeros(sizes);
    else if (dev_gen)
      t = at::normal(0.0, 0.02, sizes, *dev_gen,
                     torch::TensorOptions().device(device_).dtype(torch::kFloat32));
    else
      t = at::normal(0.0, 0.02, sizes, gen);
    params_.push_back({shape.name, t.to(device_, dtype_).requires_grad_(true), shape.block});
    t = Tensor();  // the FP32 draw goes before the next is made
    if (built) built(params_.size() - 1, params_.back());
  }
  blocks_ = make_blocks({});
}

std::vector<std::unique_ptr<Block>> Transformer::make_blocks(const std::set<std::string>& fp8,
                                                             std::vector<std::string>* linears) const {
  // Each block takes handles to its parameters; the ones an architecture lacks stay undefined.
  // (By name through a map: a routed block looks up each of its experts' tensors.)
  std::unordered_map<std::string_view, const Tensor*> by_name;
  for (const auto& p : params_) by_name.emplace(p.name, &p.tensor);
  const ParamLookup find(
      [&](const std::string& name) {
        const auto it = by_name.find(name);
        return it == by_name.end() ? Tensor() : *it->second;
      },
      [&](const std::string& weight) { return fp8.contains(weight); }, linears);
  std::vector<std::unique_ptr<Block>> blocks;
  for (int l = 0; l < args_.layers; ++l) blocks.push_back(make_block(args_, l, find));
  return blocks;
}

std::vector<Transformer::LinearPrecision> Transformer::use_fp8(const std::vector<std::string>& patterns) {
  const Architecture& arch = args_.architecture();
  std::vector<LinearPrecision> out;
  std::set<std::string> fp8;
  auto decide = [&](const std::string& weight, const std::string& module, std::int64_t rows,
                    std::int64_t cols) {
    out.push_back({weight, module, fp8::stays_bf16(module, rows, cols, patterns)});
    return !out.back().bf16_because;
  };
  for (const ParamShape& s : args_.params())
    if (s.block >= 0 && s.is_matrix() && s.expert < 0 &&
        decide(s.name, arch.linear_module(s.name), s.rows, s.cols))
      fp8.insert(s.name);
  // prime-rl's models have an lm_head linear, tied or not.
  const std::string head(args_.tie_embeddings ? kEmbeddingParam : kLmHeadParam);
  if (decide(head, "lm_head", args_.vocab_size, args_.hidden))
    throw std::invalid_argument(
        "lm_head would run in FP8 (no ignore pattern finds it), and primecfg-train's LM head, fused with "
        "the cross-entropy, has no FP8 path; keep a pattern that finds \"lm_head\"");
  std::vector<std::string> linears;
  auto blocks = make_blocks(fp8, &linears);
  for (const LinearPrecision& d : out) {
    if (d.bf16_because || d.weight == head) continue;
    auto it = std::find(linears.begin(), linears.end(), d.weight);
    if (it == linears.end())
      throw std::invalid_argument(fmt::format(
          "{} (prime-rl's {}) would run in FP8, and the {} block does not run it as a linear layer "
          "(nn/linear.hpp): add an ignore pattern that finds it",
          d.weight, d.module, arch.name()));
    const std::string bias =
        d.weight.substr(0, d.weight.size() - std::string_view(".weight").size()) + ".bias";
    if (std::any_of(params_.begin(), params_.end(), [&](const NamedParam& p) { return p.name == bias; }))
      throw std::invalid_argument(
          fmt::format("{} would run in FP8 and has a bias, which prime-rl's FP8 linear does not add: add an "
                      "ignore pattern that finds it",
                      d.module));
  }
  blocks_ = std::move(blocks);
  return out;
}

const Tensor& Transformer::param(std::string_view name) const {
  for (const auto& p : params_)
    if (p.name == name) return p.tensor;
  throw std::out_of_range(fmt::format("no parameter named {}", name));
}

const Tensor& Transformer::lm_head() const {
  return param(args_.tie_embeddings ? kEmbeddingParam : kLmHeadParam);
}

// ---------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------

Tensor Transformer::hidden(const Inputs& in, Recompute recompute, std::int64_t ac_freq,
                           const BlockHooks& hooks, ActivationOffload* offload) {
  auto before = [&](std::int64_t block) {
    for (const BlockHook* h : hooks)
      if (h && h->before) h->before(static_cast<int>(block));
  };
  auto after = [&](std::int64_t block, const Tensor& out) {
    for (const BlockHook* h : hooks)
      if (h && h->after) h->after(static_cast<int>(block), out);
  };
  const auto& a = args_;
  // RoPE tables for the given positions: [B, T, 1, head_dim]. The frequencies come
  // from model/args.cpp (the rope type's formula), rounded to FP32 as transformers
  // keeps them; yarn also scales cos and sin.
  Tensor freqs = in.positions.to(torch::kFloat32).unsqueeze(-1) * inv_freq_;  // [B, T, hd/2]
  Tensor emb = torch::cat({freqs, freqs}, -1).unsqueeze(2);
  const double scaling = a.rope_attention_scaling();
  Tensor cos = emb.cos(), sin = emb.sin();
  if (scaling != 1.0) {
    cos = cos * scaling;
    sin = sin * scaling;
  }
  if (a.moe && moe_stats_.empty()) moe_stats_.resize(static_cast<std::size_t>(a.layers));
  BlockContext ctx{&a,      cos.to(dtype_), sin.to(dtype_),
                   in.mask, &moe_settings_, a.moe ? &moe_stats_ : nullptr};

  TORCH_CHECK(!offload || (recompute == Recompute::blocks && ac_freq == 1),
              "activation offloading needs every block checkpointed (ac_freq 1)");
  before(-1);
  Tensor x = F::embedding(in.input_ids, param(kEmbeddingParam));
  after(-1, x);
  for (int l = 0; l < a.layers; ++l) {
    before(l);
    const Block& b = *blocks_[l];
    const bool applies = torch::GradMode::is_enabled() && l % ac_freq == 0;
    ctx.recompute_routed_experts = applies && recompute == Recompute::routed_experts;
    x = applies && recompute == Recompute::blocks ? checkpointed_block(x, b, ctx, offload, l)
                                                  : b.forward(ctx, x);
    after(l, x);
  }
  before(a.layers);
  // The final norm and the LM head: the loss uses the head after this returns, so
  // `after` for them is the loss's business (LossHooks).
  return fused::rms_norm(x, param(kFinalNormParam), a.rms_eps);
}

Tensor Transformer::loss(const Tensor& hidden, const Tensor& targets, double scale, std::int64_t chunk_tokens,
                         LossHooks hooks, LossChunks chunks) {
  return linear_cross_entropy(hidden.reshape({-1, args_.hidden}), lm_head(), targets.reshape({-1}), scale,
                              chunk_tokens, hooks.on_head_grad, hooks.before_head_rows,
                              chunks == LossChunks::vocabulary);
}

std::vector<std::int64_t> Transformer::generate(std::vector<std::int64_t> ids, std::int64_t max_new,
                                                std::int64_t stop) {
  torch::NoGradGuard no_grad;
  const auto prompt_len = ids.size();
  for (std::int64_t s = 0; s < max_new; ++s) {
    const auto T = static_cast<std::int64_t>(ids.size());
    auto opt = torch::TensorOptions().dtype(torch::kInt64);
    Inputs in{torch::tensor(ids, opt).view({1, T}).to(device_),
              torch::arange(T, opt).view({1, T}).to(device_), std::nullopt};
    Tensor h = hidden(in, Recompute::nothing).select(1, T - 1);
    auto next = torch::matmul(h, lm_head().t()).argmax(-1).item<std::int64_t>();
    if (next == stop) break;
    ids.push_back(next);
  }
  return {ids.begin() + static_cast<std::ptrdiff_t>(prompt_len), ids.end()};
}

std::vector<MoeStats> Transformer::take_moe_stats() {
  std::vector<MoeStats> out(moe_stats_.size());
  out.swap(moe_stats_);
  return out;
}

}  // namespace primecfg::train
