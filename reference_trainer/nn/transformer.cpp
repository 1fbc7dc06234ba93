#include "nn/transformer.hpp"

#include "base/safetensors.hpp"
#include "base/strict_json.hpp"
#include "nn/kernels/fused_ops.hpp"
#include "nn/loss_chunking.hpp"

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

namespace primecfg::train {

using torch::Tensor;
namespace F = torch::nn::functional;

// ---------------------------------------------------------------------------
// Construction and weights
// ---------------------------------------------------------------------------

Transformer::Transformer(const ModelArgs& a, torch::Device device, torch::ScalarType dtype,
                         std::uint64_t seed)
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
  }
  // Handles by name; the ones an architecture lacks stay undefined.
  auto find = [&](const std::string& name) {
    for (const auto& p : params_)
      if (p.name == name) return p.tensor;
    return Tensor();
  };
  blocks_.resize(a.layers);
  for (int l = 0; l < a.layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    auto& b = blocks_[l];
    b.in_norm = find(p + "input_layernorm.weight");
    b.wq = find(p + "self_attn.q_proj.weight");
    b.wk = find(p + "self_attn.k_proj.weight");
    b.wv = find(p + "self_attn.v_proj.weight");
    b.wo = find(p + "self_attn.o_proj.weight");
    b.bq = find(p + "self_attn.q_proj.bias");
    b.bk = find(p + "self_attn.k_proj.bias");
    b.bv = find(p + "self_attn.v_proj.bias");
    b.bo = find(p + "self_attn.o_proj.bias");
    b.q_norm = find(p + "self_attn.q_norm.weight");
    b.k_norm = find(p + "self_attn.k_norm.weight");
    b.post_norm = find(p + "post_attention_layernorm.weight");
    b.w_gate = find(p + "mlp.gate_proj.weight");
    b.w_up = find(p + "mlp.up_proj.weight");
    b.w_down = find(p + "mlp.down_proj.weight");
    b.b_gate = find(p + "mlp.gate_proj.bias");
    b.b_up = find(p + "mlp.up_proj.bias");
    b.b_down = find(p + "mlp.down_proj.bias");
  }
}

const Tensor& Transformer::param(std::string_view name) const {
  for (const auto& p : params_)
    if (p.name == name) return p.tensor;
  throw std::out_of_range(fmt::format("no parameter named {}", name));
}

const Tensor& Transformer::lm_head() const {
  return param(args_.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
}

namespace {

torch::ScalarType to_torch(safetensors::dtype d) {
  switch (d) {
    case safetensors::dtype::F64:
      return torch::kFloat64;
    case safetensors::dtype::F32:
      return torch::kFloat32;
    case safetensors::dtype::F16:
      return torch::kFloat16;
    case safetensors::dtype::BF16:
      return torch::kBFloat16;
    case safetensors::dtype::I64:
      return torch::kInt64;
    case safetensors::dtype::I32:
      return torch::kInt32;
    case safetensors::dtype::I16:
      return torch::kInt16;
    case safetensors::dtype::I8:
      return torch::kInt8;
    case safetensors::dtype::U8:
      return torch::kUInt8;
    case safetensors::dtype::BOOL:
      return torch::kBool;
  }
  return torch::kFloat32;
}

}  // namespace

void Transformer::load_hf_weights(const std::filesystem::path& dir) {
  // The weights are what transformers loads: the shards that
  // model.safetensors.index.json names, else model.safetensors. Other safetensors
  // files in the folder (a checkpoint's optimizer state) are not weights.
  std::vector<std::filesystem::path> paths;
  std::map<std::string, std::string, std::less<>> index;  // tensor -> shard, when sharded
  const auto index_path = dir / "model.safetensors.index.json";
  std::error_code ec;
  if (std::filesystem::exists(index_path, ec)) {
    std::ifstream in(index_path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    try {
      const strict_json::value root = strict_json::parse(text.str());
      const strict_json::value* map = strict_json::find(root, "weight_map");
      if (!map || !map->is_object())
        throw std::runtime_error(index_path.string() +
                                 ": \"weight_map\" must be an object of tensor -> file");
      std::set<std::string> shards;
      for (const auto& [tensor, file] : map->items()) {
        if (!file.is_string())
          throw std::runtime_error(fmt::format("{}: weight_map[\"{}\"] = {} is not a file name",
                                               index_path.string(), tensor, strict_json::dump(file)));
        const std::string& f = file.get_ref<const std::string&>();
        if (f.find('/') != std::string::npos || f == ".." || f == ".")
          throw std::runtime_error(fmt::format("{}: weight_map[\"{}\"] = \"{}\" is not a file in this folder",
                                               index_path.string(), tensor, f));
        index.emplace(tensor, f);
        shards.insert(f);
      }
      for (const auto& f : shards) paths.push_back(dir / f);
    } catch (const strict_json::error& e) {
      throw std::runtime_error(index_path.string() + ": " + e.what());
    }
  } else if (std::filesystem::exists(dir / "model.safetensors", ec)) {
    paths.push_back(dir / "model.safetensors");
  } else {
    throw std::runtime_error(dir.string() +
                             ": neither model.safetensors nor model.safetensors.index.json (only safetensors "
                             "weights are read)");
  }
  std::vector<safetensors::file> files;
  for (const auto& p : paths) files.push_back(safetensors::file::open(p));

  // Where each tensor of the files lies; a name twice is an error.
  struct Found {
    const safetensors::file* file;
    const safetensors::tensor_info* info;
  };
  std::map<std::string, Found, std::less<>> tensors;
  for (const auto& f : files)
    for (const auto& t : f.tensors()) {
      const std::string& name = t.name;
      if (!index.empty()) {
        auto listed = index.find(name);
        if (listed == index.end() || f.path().filename() != listed->second)
          throw std::runtime_error(fmt::format("{}: tensor {} is not listed for this file in {}",
                                               f.path().string(), name, index_path.string()));
      }
      auto [it, fresh] = tensors.emplace(name, Found{&f, &t});
      if (!fresh)
        throw std::runtime_error(fmt::format("{}: tensor {} is also in {}; which one to load is ambiguous",
                                             f.path().string(), name, it->second.file->path().string()));
    }
  auto as_tensor = [&](const Found& t) {
    const auto type = t.info->type;
    if (type != safetensors::dtype::F32 && type != safetensors::dtype::BF16 &&
        type != safetensors::dtype::F16 && type != safetensors::dtype::F64)
      throw std::runtime_error(
          fmt::format("{}: tensor {} has dtype {}; weights must be F32, BF16, F16 or F64",
                      t.file->path().string(), t.info->name, safetensors::dtype_name(type)));
    return torch::from_blob(const_cast<std::byte*>(t.info->data), t.info->shape,
                            torch::TensorOptions().dtype(to_torch(type)));
  };
  torch::NoGradGuard no_grad;
  for (auto& p : params_) {
    auto it = tensors.find(p.name);
    if (it == tensors.end())
      throw std::runtime_error(
          fmt::format("{}: tensor {} not found in the *.safetensors files (config.json "
                      "describes a model that has it)",
                      dir.string(), p.name));
    std::vector<std::int64_t> want(p.tensor.sizes().begin(), p.tensor.sizes().end());
    if (it->second.info->shape != want)
      throw std::runtime_error(fmt::format("{}: tensor {} has shape [{}], config.json implies [{}]",
                                           it->second.file->path().string(), p.name,
                                           fmt::join(it->second.info->shape, ", "), fmt::join(want, ", ")));
    p.tensor.detach().copy_(as_tensor(it->second));
    tensors.erase(it);
  }
  // A tied model may still carry lm_head.weight; transformers then uses the
  // embedding, so the copy must be the same numbers or the two would disagree.
  if (auto head = tensors.find("lm_head.weight"); head != tensors.end() && args_.tie_embeddings) {
    Tensor embed = param("model.embed_tokens.weight").detach();
    std::vector<std::int64_t> want(embed.sizes().begin(), embed.sizes().end());
    if (head->second.info->shape != want || !torch::equal(as_tensor(head->second).to(embed.options()), embed))
      throw std::runtime_error(fmt::format(
          "{}: tensor lm_head.weight differs from model.embed_tokens.weight, but config.json ties them "
          "(tie_word_embeddings = true): transformers would ignore it",
          head->second.file->path().string()));
    tensors.erase(head);
  }
  if (!tensors.empty()) {
    std::vector<std::string> names;
    for (const auto& [name, t] : tensors) names.push_back(name);
    const auto& first = tensors.begin()->second;
    throw std::runtime_error(fmt::format(
        "{}: tensor {} is not a parameter of the model that config.json describes, and primecfg-train "
        "does not ignore weights (not used: {})",
        first.file->path().string(), names.front(), fmt::join(names, ", ")));
  }
}

// ---------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------

namespace {

// HF's rotate-half RoPE; cos/sin are [B, T, 1, head_dim].
Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  auto half = x.size(-1) / 2;
  auto x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
  return x * cos + torch::cat({-x2, x1}, -1) * sin;
}

struct BlockContext {
  const ModelArgs* args;
  Tensor cos, sin;
  std::optional<Tensor> mask;
};

// x @ w^T (+ b): a plain matmul where the architecture has no bias, as before biases existed.
Tensor project(const Tensor& x, const Tensor& w, const Tensor& b) {
  return b.defined() ? at::linear(x, w, b) : torch::matmul(x, w.t());
}

Tensor block_forward(const BlockWeights& w, const BlockContext& c, const Tensor& x) {
  const auto& a = *c.args;
  const auto B = x.size(0), T = x.size(1);
  // Attention. The norms and the SwiGLU are fused CUDA kernels on bf16 GPU tensors
  // (kernels/fused_ops.hpp), ATen's operators elsewhere.
  Tensor h = fused::rms_norm(x, w.in_norm, a.rms_eps);
  Tensor q = project(h, w.wq, w.bq).view({B, T, a.heads, a.head_dim});
  Tensor k = project(h, w.wk, w.bk).view({B, T, a.kv_heads, a.head_dim});
  Tensor v = project(h, w.wv, w.bv).view({B, T, a.kv_heads, a.head_dim});
  if (a.qk_norm()) {
    q = fused::rms_norm(q, w.q_norm, a.rms_eps);
    k = fused::rms_norm(k, w.k_norm, a.rms_eps);
  }
  q = rope(q, c.cos, c.sin).transpose(1, 2);  // [B, H, T, hd]
  k = rope(k, c.cos, c.sin).transpose(1, 2);
  v = v.transpose(1, 2);
  Tensor o = c.mask ? at::scaled_dot_product_attention(q, k, v, *c.mask, 0.0, false, std::nullopt, true)
                    : at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, true, std::nullopt, true);
  o = o.transpose(1, 2).reshape({B, T, a.heads * a.head_dim});
  Tensor x1 = x + project(o, w.wo, w.bo);
  // SwiGLU MLP
  Tensor g = fused::rms_norm(x1, w.post_norm, a.rms_eps);
  Tensor m = fused::swiglu(project(g, w.w_gate, w.b_gate), project(g, w.w_up, w.b_up));
  return x1 + project(m, w.w_down, w.b_down);
}

// Activation checkpointing: forward runs the block without recording a graph and
// keeps only its input; backward runs the block again with grad enabled and
// backpropagates through that fresh graph (parameter gradients accumulate there,
// so their post-accumulate hooks fire as usual).
// The block weights and model args outlive the graph (they belong to the model);
// the per-batch RoPE tables and mask travel in the autograd context.
struct CheckpointedBlock : torch::autograd::Function<CheckpointedBlock> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, Tensor x, const BlockWeights* w,
                        const BlockContext* c) {
    ctx->saved_data["w"] = reinterpret_cast<std::int64_t>(w);
    ctx->saved_data["args"] = reinterpret_cast<std::int64_t>(c->args);
    ctx->saved_data["cos"] = c->cos;
    ctx->saved_data["sin"] = c->sin;
    if (c->mask) ctx->saved_data["mask"] = *c->mask;
    ctx->save_for_backward({x});
    torch::NoGradGuard no_grad;
    return block_forward(*w, *c, x);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto* w = reinterpret_cast<const BlockWeights*>(ctx->saved_data["w"].toInt());
    BlockContext c{reinterpret_cast<const ModelArgs*>(ctx->saved_data["args"].toInt()),
                   ctx->saved_data["cos"].toTensor(), ctx->saved_data["sin"].toTensor(), std::nullopt};
    if (ctx->saved_data.count("mask")) c.mask = ctx->saved_data["mask"].toTensor();
    Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    Tensor y;
    {
      torch::AutoGradMode grad_on(true);
      y = block_forward(*w, c, x);
    }
    torch::autograd::backward({y}, {grad_out[0]});
    return {x.grad(), Tensor(), Tensor()};
  }
};

// Fused LM head + cross-entropy. Forward walks the logits in chunks (of tokens or of
// vocabulary rows: Transformer::LossChunks) and computes the loss and, right away, the
// gradients with respect to the hidden states and the head weight; backward only
// scales them. Peak memory is one chunk of logits instead of all of them.

// Whether this LibTorch has the mixed-dtype GEMM (bf16 in, FP32 out); cleared at the first refusal.
std::atomic<bool> fp32_out_gemm{true};

// Whether log_softmax takes bf16/half input with FP32 output in one kernel here.
std::atomic<bool> fused_log_softmax{true};

Tensor log_softmax_fp32(const Tensor& logits) {
  if (logits.scalar_type() == torch::kFloat32) return at::_log_softmax(logits, 1, false);
  if (fused_log_softmax && logits.is_cuda()) {
    try {
      return at::_log_softmax(logits, 1, /*half_to_float=*/true);
    } catch (const c10::Error&) {
      fused_log_softmax = false;
    }
  }
  return at::_log_softmax(logits.to(torch::kFloat32), 1, false);
}

// out += a @ b in FP32, for bf16 a and b: one GEMM accumulating straight into the FP32
// sum where the backend has it (no bf16 product in memory), else a bf16 GEMM (FP32
// accumulation inside) added in FP32.
void add_matmul_fp32(Tensor& out, const Tensor& a, const Tensor& b) {
  if (a.scalar_type() == torch::kFloat32) {
    out.addmm_(a, b);
    return;
  }
  if (fp32_out_gemm && a.is_cuda()) {
    try {
      at::addmm_out(out, out, a, b, torch::kFloat32);
      return;
    } catch (const c10::Error&) {
      fp32_out_gemm = false;
    }
  }
  out.add_(torch::matmul(a, b));
}

// g * scale in h's dtype (g is FP32).
Tensor scaled_as(Tensor& g, double scale, torch::ScalarType dtype) {
  if (dtype == torch::kFloat32) return g.mul_(scale);
  Tensor out = torch::empty(g.sizes(), g.options().dtype(dtype));
  at::mul_out(out, g, torch::scalar_tensor(scale, torch::kFloat64));  // a CPU scalar: no device copy
  return out;
}

struct LinearCrossEntropy : torch::autograd::Function<LinearCrossEntropy> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, Tensor h, Tensor w, Tensor targets,
                        double scale, std::int64_t chunk, const Transformer::HeadGradHook* on_head_grad,
                        const Transformer::HeadRowsHook* before_rows, bool by_vocab) {
    const bool want_grad = h.requires_grad() || w.requires_grad();
    torch::NoGradGuard no_grad;
    Tensor rows = targets.ne(-100).nonzero().squeeze(1);
    Tensor loss, grad_h, grad_w;
    if (by_vocab) {
      loss = by_vocabulary(h, w, targets, rows, scale, chunk, want_grad, on_head_grad, before_rows, grad_h,
                           grad_w);
    } else {
      if (before_rows) (*before_rows)(0, w.size(0));
      loss = by_tokens(h, w, targets, rows, scale, chunk, want_grad, grad_h, grad_w);
    }
    // The vocabulary walk has handed the head gradient over already.
    ctx->saved_data["on_head_grad"] = reinterpret_cast<std::int64_t>(by_vocab ? nullptr : on_head_grad);
    if (want_grad) ctx->save_for_backward({grad_h, grad_w});
    return loss * scale;
  }

  // Token chunks: for each, the logits, the loss and right away the gradients with
  // respect to its hidden states and (summed over chunks in FP32) the head weight.
  static Tensor by_tokens(const Tensor& h, const Tensor& w, const Tensor& targets, const Tensor& rows,
                          double scale, std::int64_t chunk, bool want_grad, Tensor& grad_h, Tensor& grad_w) {
    Tensor loss = torch::zeros({}, h.options().dtype(torch::kFloat32));
    if (want_grad) {
      grad_h = torch::zeros_like(h);
      grad_w = torch::zeros(w.sizes(), w.options().dtype(torch::kFloat32));
    }
    const std::int64_t n = rows.size(0);
    for (std::int64_t start = 0; start < n; start += chunk) {
      Tensor idx = rows.narrow(0, start, std::min(chunk, n - start));
      Tensor hc = h.index_select(0, idx);
      Tensor tc = targets.index_select(0, idx).unsqueeze(1);
      // FP32 log-probabilities in one pass over the logits where the backend can
      // read bf16 and write FP32 in the same kernel; then softmax = exp(logp) in
      // place, minus one at the target, scaled and cast back in one pass. (Fewer
      // passes over the largest tensor of the step than logsumexp + exp + casts.)
      Tensor logp = log_softmax_fp32(torch::matmul(hc, w.t()));
      loss -= logp.gather(1, tc).sum();
      if (!want_grad) continue;
      Tensor g = logp.exp_();
      g.scatter_add_(1, tc, torch::full_like(tc, -1.0, g.options()));
      Tensor gc = scaled_as(g, scale, h.scalar_type());
      grad_h.index_copy_(0, idx, torch::matmul(gc, w));
      add_matmul_fp32(grad_w, gc.t(), hc);
    }
    if (want_grad) grad_w = grad_w.to(w.scalar_type());
    return loss;
  }

  // Vocabulary chunks, in two passes over them: first each token's log-sum-exp and
  // its target's logit, then per chunk the softmax gradient, the hidden states'
  // gradient (summed over chunks in FP32) and the chunk's rows of the head gradient,
  // final at once (one GEMM over all tokens) and handed to the hook. The logits are
  // computed twice: one GEMM more than by_tokens, for a head gradient that starts
  // arriving early in the loss instead of after it.
  static Tensor by_vocabulary(const Tensor& h, const Tensor& w, const Tensor& targets, const Tensor& rows,
                              double scale, std::int64_t chunk_tokens, bool want_grad,
                              const Transformer::HeadGradHook* hook,
                              const Transformer::HeadRowsHook* before_rows, Tensor& grad_h, Tensor& grad_w) {
    const std::int64_t n = rows.size(0), vocab = w.size(0);
    Tensor hs = h.index_select(0, rows);
    Tensor ts = targets.index_select(0, rows);
    const std::int64_t per_chunk = vocab_chunk_rows(chunk_tokens, vocab, n);
    auto logits_of = [&](std::int64_t v0, std::int64_t k) {  // FP32 [n, k]
      return torch::matmul(hs, w.narrow(0, v0, k).t()).to(torch::kFloat32);
    };
    // The target's column within the chunk, and whether it lies there.
    auto target_in = [&](std::int64_t v0, std::int64_t k) {
      return std::pair{(ts - v0).clamp(0, k - 1).unsqueeze(1), ts.ge(v0).logical_and(ts.lt(v0 + k))};
    };
    auto fopt = h.options().dtype(torch::kFloat32);
    Tensor lse = torch::full({n}, -std::numeric_limits<float>::infinity(), fopt);
    Tensor target_logit = torch::zeros({n}, fopt);
    for (std::int64_t v0 = 0; v0 < vocab; v0 += per_chunk) {
      const std::int64_t k = std::min(per_chunk, vocab - v0);
      if (before_rows) (*before_rows)(v0, v0 + k);  // the second pass reads them again: all are ready then
      Tensor logits = logits_of(v0, k);
      auto [col, in] = target_in(v0, k);
      lse = torch::logaddexp(lse, torch::logsumexp(logits, 1));
      target_logit += logits.gather(1, col).squeeze(1) * in;
    }
    Tensor loss = (lse - target_logit).sum();
    if (!want_grad) return loss;
    Tensor grad_hs = torch::zeros({n, h.size(1)}, fopt);
    grad_w = torch::empty_like(w);
    for (std::int64_t v0 = 0; v0 < vocab; v0 += per_chunk) {
      const std::int64_t k = std::min(per_chunk, vocab - v0);
      Tensor g = logits_of(v0, k).sub_(lse.unsqueeze(1)).exp_();  // softmax
      auto [col, in] = target_in(v0, k);
      g.scatter_add_(1, col, in.to(torch::kFloat32).neg().unsqueeze(1));  // minus one at the target
      Tensor gc = scaled_as(g, scale, h.scalar_type());
      Tensor wc = w.narrow(0, v0, k);
      add_matmul_fp32(grad_hs, gc, wc);
      Tensor rows_grad = grad_w.narrow(0, v0, k);
      at::mm_out(rows_grad, gc.t(), hs);
      if (hook) (*hook)(v0, rows_grad);
    }
    grad_h = torch::zeros_like(h);
    grad_h.index_copy_(0, rows, grad_hs.to(h.scalar_type()));
    return loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto saved = ctx->get_saved_variables();
    Tensor go = grad_out[0];
    Tensor grad_w = saved[1] * go.to(saved[1].scalar_type());
    if (const auto* hook =
            reinterpret_cast<const Transformer::HeadGradHook*>(ctx->saved_data["on_head_grad"].toInt()))
      (*hook)(0, grad_w);
    return {saved[0] * go.to(saved[0].scalar_type()),
            grad_w,
            Tensor(),
            Tensor(),
            Tensor(),
            Tensor(),
            Tensor(),
            Tensor()};
  }
};

}  // namespace

Tensor Transformer::hidden(const Inputs& in, bool checkpoint_blocks, std::int64_t ac_freq,
                           const BlockHook* before_block) {
  auto before = [&](std::int64_t block) {
    if (before_block) (*before_block)(static_cast<int>(block));
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
  BlockContext ctx{&a, cos.to(dtype_), sin.to(dtype_), in.mask};

  before(-1);
  Tensor x = F::embedding(in.input_ids, param("model.embed_tokens.weight"));
  for (int l = 0; l < a.layers; ++l) {
    before(l);
    const BlockWeights& b = blocks_[l];
    const bool recompute = checkpoint_blocks && torch::GradMode::is_enabled() && l % ac_freq == 0;
    x = recompute ? CheckpointedBlock::apply(x, &b, &ctx) : block_forward(b, ctx, x);
  }
  before(a.layers);
  return fused::rms_norm(x, param("model.norm.weight"), a.rms_eps);
}

Tensor Transformer::loss(const Tensor& hidden, const Tensor& targets, double scale, std::int64_t chunk_tokens,
                         LossHooks hooks, LossChunks chunks) {
  return LinearCrossEntropy::apply(hidden.reshape({-1, args_.hidden}), lm_head(), targets.reshape({-1}),
                                   scale, chunk_tokens, hooks.on_head_grad, hooks.before_head_rows,
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
    Tensor h = hidden(in, false).select(1, T - 1);
    auto next = torch::matmul(h, lm_head().t()).argmax(-1).item<std::int64_t>();
    if (next == stop) break;
    ids.push_back(next);
  }
  return {ids.begin() + static_cast<std::ptrdiff_t>(prompt_len), ids.end()};
}

}  // namespace primecfg::train
