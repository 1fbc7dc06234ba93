#include "nn/loss.hpp"

#include "nn/kernels/fused_ops.hpp"
#include "nn/loss_chunking.hpp"

#include <algorithm>
#include <atomic>
#include <limits>
#include <stdexcept>
#include <utility>

namespace primecfg::train {

using torch::Tensor;

namespace {

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
    // The rows whose targets count (not -100). The fused kernel gives ignored tokens a
    // zero loss and gradient itself, so there every token goes through it in slices:
    // no list of rows, whose size the host would wait for mid-step (nor could a CUDA
    // graph hold it), and no gathers of the hidden states.
    const bool every_row = !by_vocab && want_grad && fused::cross_entropy_fused(h);
    Tensor rows = every_row ? Tensor() : targets.ne(-100).nonzero().squeeze(1);
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
    const bool every_row = !rows.defined();  // the fused kernel's walk: slices of all tokens
    if (want_grad) {
      grad_h = every_row ? torch::empty_like(h) : torch::zeros_like(h);
      grad_w = torch::zeros(w.sizes(), w.options().dtype(torch::kFloat32));
    }
    const std::int64_t n = every_row ? h.size(0) : rows.size(0);
    for (std::int64_t start = 0; start < n; start += chunk) {
      const std::int64_t len = std::min(chunk, n - start);
      if (every_row) {
        Tensor hc = h.narrow(0, start, len);
        Tensor logits = torch::matmul(hc, w.t());
        Tensor row_loss = fused::cross_entropy_grad_(logits, targets.narrow(0, start, len), scale);
        if (!row_loss.defined())
          throw std::logic_error("LinearCrossEntropy: the fused cross-entropy refused a chunk");
        loss += row_loss.sum();
        Tensor gh = grad_h.narrow(0, start, len);
        at::mm_out(gh, logits, w);
        add_matmul_fp32(grad_w, logits.t(), hc);
        continue;
      }
      Tensor idx = rows.narrow(0, start, len);
      Tensor hc = h.index_select(0, idx);
      Tensor tc = targets.index_select(0, idx).unsqueeze(1);
      // FP32 log-probabilities in one pass over the logits where the backend can
      // read bf16 and write FP32 in the same kernel; then softmax = exp(logp) in
      // place, minus one at the target, scaled and cast back in one pass. (Fewer
      // passes over the largest tensor of the step than logsumexp + exp + casts.)
      Tensor logits = torch::matmul(hc, w.t());
      if (want_grad) {
        // The fused kernel, where it applies: the loss, and the gradient over the logits.
        if (Tensor row_loss = fused::cross_entropy_grad_(logits, tc.squeeze(1), scale); row_loss.defined()) {
          loss += row_loss.sum();
          grad_h.index_copy_(0, idx, torch::matmul(logits, w));
          add_matmul_fp32(grad_w, logits.t(), hc);
          continue;
        }
      }
      Tensor logp = log_softmax_fp32(logits);
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

Tensor linear_cross_entropy(const Tensor& h, const Tensor& w, const Tensor& targets, double scale,
                            std::int64_t chunk, const Transformer::HeadGradHook* on_head_grad,
                            const Transformer::HeadRowsHook* before_rows, bool by_vocabulary) {
  return LinearCrossEntropy::apply(h, w, targets, scale, chunk, on_head_grad, before_rows, by_vocabulary);
}

}  // namespace primecfg::train
