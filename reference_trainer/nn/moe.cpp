#include "nn/moe.hpp"

#include "base/storage_bytes.hpp"
#include "nn/fp8.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>
#include <vector>

#ifdef PRIMECFG_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace primecfg::train {

using torch::Tensor;
using i64 = std::int64_t;

bool grouped_mm_available(const Tensor& weight) {
#ifdef PRIMECFG_WITH_CUDA
  if (!weight.is_cuda() || weight.scalar_type() != torch::kBFloat16) return false;
  return at::cuda::getDeviceProperties(weight.get_device())->major == 9;
#else
  (void)weight;
  return false;
#endif
}

namespace {

bool is_stacked(const std::vector<Tensor>& w) { return w.size() == 1 && w[0].dim() == 3; }
Tensor expert(const std::vector<Tensor>& w, i64 e) {
  return is_stacked(w) ? w[0][e] : w[static_cast<std::size_t>(e)];
}
// Experts [first, first + n) of one projection, stacked.
Tensor stacked(const std::vector<Tensor>& w, i64 first, i64 n) {
  if (is_stacked(w)) return first == 0 && n == w[0].size(0) ? w[0] : w[0].narrow(0, first, n);
  if (first == 0 && n == static_cast<i64>(w.size())) return torch::stack(w);
  return torch::stack(at::TensorList(w).slice(static_cast<std::size_t>(first), static_cast<std::size_t>(n)));
}

// The three projections of experts [first, first + n) stacked for a grouped GEMM, and
// whether that is a copy (the model holds them per expert) or the weights themselves.
struct Stacks {
  Tensor w1, w3, w2;
  bool copied = false;
};
Stacks stack_experts(const MoeWeights& w, i64 first, i64 n) {
  return {stacked(w.w1, first, n), stacked(w.w3, first, n), stacked(w.w2, first, n), !is_stacked(w.w1)};
}

// Autograd keeps the stacked copy for the GEMMs' backward: 3 E I D elements a routed block
// (1.13 GiB in bf16 at Qwen3-30B-A3B), for every block from its forward to its backward.
// Instead the copy's bytes go once the GEMMs are queued, and come back, stacked again from
// the experts' weights, when the gradient of `out` (the GEMMs' result) arrives, just
// before their backward reads them (base/storage_bytes.hpp). The experts' weights are
// those of the forward then: FSDP gathers them again before the block's backward, and no
// mode updates a weight before its block's backward is done.
void release_until_backward(const Stacks& s, const MoeWeights& w, i64 first, const Tensor& out) {
  if (!s.copied || !out.requires_grad()) return;
  // What the hook needs of each copy: its bytes (held by the GEMMs' saved tensors, weakly
  // here, so that they go with the GEMMs' backward), its shape and which weights fill it.
  struct Refill {
    c10::weak_intrusive_ptr<c10::StorageImpl> bytes;
    std::vector<i64> sizes;
    torch::TensorOptions options;
    const std::vector<Tensor>* experts;
  };
  std::vector<Refill> refills;
  for (const auto& [stack, experts] :
       {std::pair{&s.w1, &w.w1}, std::pair{&s.w3, &w.w3}, std::pair{&s.w2, &w.w2}}) {
    refills.push_back(
        {stack->storage().getWeakStorageImpl(), stack->sizes().vec(), stack->options(), experts});
    free_bytes(*stack);
  }
  out.register_hook([refills = std::move(refills), first](const Tensor&) {
    torch::NoGradGuard no_grad;
    for (const Refill& r : refills) {
      c10::intrusive_ptr<c10::StorageImpl> bytes = r.bytes.lock();
      if (!bytes) continue;  // nothing saved it (no weight gradient is asked for)
      Tensor stack = torch::empty({0}, r.options).set_(c10::Storage(bytes), 0, r.sizes);
      alloc_bytes(stack);
      // One kernel for every expert (E copies would be E launches, 384 a block at
      // Qwen3-30B-A3B).
      const auto n = static_cast<std::size_t>(stack.size(0));
      at::stack_out(stack, at::TensorList(*r.experts).slice(static_cast<std::size_t>(first), n));
    }
  });
}

// How the experts' matmuls run (MoeSettings' grouped, align and fp8).
struct Kernels {
  bool grouped = true;
  i64 align = 8;
  bool fp8 = false;
  static Kernels of(const MoeSettings& s) { return {s.grouped, s.align, s.fp8}; }
};

Tensor swiglu_expert(const Tensor& rows, const Tensor& w1, const Tensor& w3, const Tensor& w2, bool fp8) {
  if (fp8) return fp8::linear(at::silu(fp8::linear(rows, w1)) * fp8::linear(rows, w3), w2);
  return at::matmul(at::silu(at::matmul(rows, w1.t())) * at::matmul(rows, w3.t()), w2.t());
}

// One matmul per expert: `counts` rows each of experts first, first + 1, ... An expert
// without tokens runs on no rows, so that its weights get a gradient (zeros) in every
// backward, as the grouped GEMM gives them: a sharded run's gradient bucket is full when
// its block's backward is done, not at the end of the step.
Tensor run_loop(const MoeWeights& w, i64 first, const Tensor& rows, const std::vector<i64>& counts,
                bool fp8) {
  std::vector<Tensor> out;
  i64 start = 0;
  for (std::size_t e = 0; e < counts.size(); ++e) {
    const i64 E = first + static_cast<i64>(e);
    out.push_back(swiglu_expert(rows.narrow(0, start, counts[e]), expert(w.w1, E), expert(w.w3, E),
                                expert(w.w2, E), fp8));
    start += counts[e];
  }
  return out.empty() ? rows.new_zeros({0, expert(w.w2, 0).size(0)}) : at::cat(out);
}

// The rows placed into groups of `group_rows[e]` rows each (padding rows zero), run
// by `experts` on that padded buffer, and read back in the sorted slots' order.
template <class Experts>
Tensor run_padded(const Tensor& rows, const std::vector<i64>& counts, const std::vector<i64>& group_start,
                  i64 padded_rows, Experts&& experts) {
  // Where each sorted slot goes: its expert's group start plus its place in the group.
  std::vector<i64> dest;
  dest.reserve(static_cast<std::size_t>(rows.size(0)));
  for (std::size_t e = 0; e < counts.size(); ++e)
    for (i64 j = 0; j < counts[e]; ++j) dest.push_back(group_start[e] + j);
  const Tensor index = torch::tensor(dest, torch::kInt64).to(rows.device());
  const Tensor padded = rows.new_zeros({padded_rows, rows.size(1)}).index_copy(0, index, rows);
  return experts(padded).index_select(0, index);
}

// The experts' MLPs on rows sorted by expert: counts[e] rows of expert first + e each,
// in that order.
Tensor run_mlps(const MoeWeights& w, i64 first, Kernels k, const Tensor& rows,
                const std::vector<i64>& counts) {
  const auto E = static_cast<i64>(counts.size());
  const i64 align = k.align;
  Tensor out;
  if (!k.grouped || k.fp8) {
    // FP8: each expert's projections as FP8 linears (prime-rl's grouped FP8 GEMMs compute
    // the same per expert; one grouped kernel is not built here).
    out = run_loop(w, first, rows, counts, k.fp8);
  } else if (const Stacks st = stack_experts(w, first, E); grouped_mm_available(st.w1)) {
    // Groups padded to multiples of `align`, at least `align` rows even when empty (as
    // torchtitan's grouped GEMM pads them); offsets are the groups' ends.
    std::vector<i64> start(static_cast<std::size_t>(E)), ends;
    i64 total = 0;
    for (i64 e = 0; e < E; ++e) {
      start[e] = total;
      total += std::max(align, (counts[e] + align - 1) / align * align);
      ends.push_back(total);
    }
    const Tensor offs = torch::tensor(ends, torch::kInt64).to(rows.device(), torch::kInt32);
    out = run_padded(rows, counts, start, total, [&](const Tensor& p) {
      const Tensor h = at::silu(at::_grouped_mm(p, st.w1.transpose(-2, -1), offs)) *
                       at::_grouped_mm(p, st.w3.transpose(-2, -1), offs);
      return at::_grouped_mm(h, st.w2.transpose(-2, -1), offs);
    });
    release_until_backward(st, w, first, out);
  } else {
    // Every group padded to the largest: one batched matmul over the experts.
    const i64 most = std::max<i64>(1, *std::max_element(counts.begin(), counts.end()));
    std::vector<i64> start(static_cast<std::size_t>(E));
    for (i64 e = 0; e < E; ++e) start[e] = e * most;
    out = run_padded(rows, counts, start, E * most, [&](const Tensor& p) {
      const Tensor g = p.view({E, most, p.size(1)});
      const Tensor h = at::silu(at::bmm(g, st.w1.transpose(1, 2))) * at::bmm(g, st.w3.transpose(1, 2));
      return at::bmm(h, st.w2.transpose(1, 2)).reshape({E * most, -1});
    });
    release_until_backward(st, w, first, out);
  }
  return out;
}

// Each slot's expert output `out` [S, D] scaled by its routing weight (`slot_weights`
// [S], FP32) in FP32, rounded to out's dtype and summed into its token (`source` [S]):
// the layer's output [tokens, D], as prime-rl computes it.
Tensor combine(const Tensor& out, const Tensor& slot_weights, const Tensor& source, i64 tokens) {
  // out (bf16) times the FP32 weights computes in FP32 without a converted copy of out.
  const Tensor scaled = at::mul(out, slot_weights.unsqueeze(1)).to(out.scalar_type());
  return torch::zeros({tokens, out.size(1)}, out.options()).index_add_(0, source, scaled);
}

// combine under autograd, keeping `out` as it came and nothing else of its size. Autograd's
// own record of the same ops kept an FP32 copy of `out` (the multiplication's operand, for
// the weights' gradient) and the scaled rows (index_add keeps its source): 6 bytes per
// slot and hidden unit where `out` is 2, 2 GiB more at Qwen3-30B-A3B cut to 4 blocks at
// 8,192 tokens (docs/memory-planner.md). The gradients are the ops' own, in their order.
struct Combine : torch::autograd::Function<Combine> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, Tensor out, Tensor slot_weights, Tensor source,
                        i64 tokens) {
    ctx->save_for_backward({out, slot_weights, source});
    return combine(out, slot_weights, source, tokens);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &out = saved[0], &slot_weights = saved[1], &source = saved[2];
    // Each slot's share of its token's gradient, in FP32 as the scaling ran.
    Tensor g = grad_out[0].index_select(0, source).to(torch::kFloat32);
    const Tensor grad_weights = ctx->needs_input_grad(1) ? at::mul(g, out).sum(1) : Tensor();
    const Tensor grad_rows =
        ctx->needs_input_grad(0) ? g.mul_(slot_weights.unsqueeze(1)).to(out.scalar_type()) : Tensor();
    return {grad_rows, grad_weights, Tensor(), Tensor()};
  }
};

// The experts' part of the layer, what selective checkpointing of "routed_experts"
// recomputes (as prime-rl's MoE._run_routed_experts): each sorted slot's row gathered
// from x (`source` [S], its token), run by its expert (counts[e] slots each, in expert
// order), scaled by its routing weight (`slot_weights` [S], FP32) and summed per token.
Tensor run_experts(const MoeWeights& w, Kernels k, const Tensor& x, const Tensor& source,
                   const std::vector<i64>& counts, const Tensor& slot_weights) {
  return Combine::apply(run_mlps(w, 0, k, x.index_select(0, source), counts), slot_weights, source,
                        x.size(0));
}

void save_kernels(torch::autograd::AutogradContext* ctx, Kernels k) {
  ctx->saved_data["grouped"] = k.grouped;
  ctx->saved_data["align"] = k.align;
  ctx->saved_data["fp8"] = k.fp8;
}
Kernels saved_kernels(torch::autograd::AutogradContext* ctx) {
  return {ctx->saved_data["grouped"].toBool(), ctx->saved_data["align"].toInt(),
          ctx->saved_data["fp8"].toBool()};
}

// run_experts under selective activation checkpointing: the forward keeps x, the
// slots' tokens and weights (and their counts); the backward runs the experts again
// with autograd on, so the experts' weight gradients accumulate into w's tensors there
// (their post-accumulate hooks fire as usual) and x's and the weights' gradients go on.
struct RecomputedExperts : torch::autograd::Function<RecomputedExperts> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, Tensor x, Tensor slot_weights, Tensor source,
                        const MoeWeights* w, Kernels k, std::vector<i64> counts) {
    ctx->save_for_backward({x, slot_weights, source});
    ctx->saved_data["weights"] = reinterpret_cast<i64>(w);
    save_kernels(ctx, k);
    ctx->saved_data["counts"] = counts;
    torch::NoGradGuard no_grad;
    return run_experts(*w, k, x, source, counts, slot_weights);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const auto* w = reinterpret_cast<const MoeWeights*>(ctx->saved_data["weights"].toInt());
    const std::vector<i64> counts = ctx->saved_data["counts"].toIntVector();
    Tensor x = saved[0].detach().requires_grad_(ctx->needs_input_grad(0));
    Tensor slot_weights = saved[1].detach().requires_grad_(ctx->needs_input_grad(1));
    Tensor y;
    {
      torch::AutoGradMode grad_on(true);
      y = run_experts(*w, saved_kernels(ctx), x, saved[2], counts, slot_weights);
    }
    if (y.requires_grad()) torch::autograd::backward({y}, {grad_out[0]});
    return {x.grad(), slot_weights.grad(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

// run_mlps under selective activation checkpointing, with expert parallelism: the
// forward keeps the rows this rank received; the backward runs its experts again.
struct RecomputedMlps : torch::autograd::Function<RecomputedMlps> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, Tensor rows, const MoeWeights* w, i64 first,
                        Kernels k, std::vector<i64> counts) {
    ctx->save_for_backward({rows});
    ctx->saved_data["weights"] = reinterpret_cast<i64>(w);
    ctx->saved_data["first"] = first;
    save_kernels(ctx, k);
    ctx->saved_data["counts"] = counts;
    torch::NoGradGuard no_grad;
    return run_mlps(*w, first, k, rows, counts);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto* w = reinterpret_cast<const MoeWeights*>(ctx->saved_data["weights"].toInt());
    Tensor rows = ctx->get_saved_variables()[0].detach().requires_grad_(ctx->needs_input_grad(0));
    Tensor y;
    {
      torch::AutoGradMode grad_on(true);
      y = run_mlps(*w, ctx->saved_data["first"].toInt(), saved_kernels(ctx), rows,
                   ctx->saved_data["counts"].toIntVector());
    }
    if (y.requires_grad()) torch::autograd::backward({y}, {grad_out[0]});
    return {rows.grad(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

// run_experts with expert parallelism (moe.hpp): the slots' rows to the ranks that run
// their experts and the outputs back, each way one all-to-all.
Tensor run_experts_parallel(const MoeWeights& w, const MoeSettings& s, const Tensor& x, const Tensor& source,
                            const std::vector<i64>& counts, const Tensor& slot_weights) {
  TokenExchange& ex = *s.exchange;
  const i64 P = ex.ranks(), E = static_cast<i64>(counts.size());
  TORCH_CHECK(E % P == 0, "moe_forward: ", E, " experts over ", P, " expert-parallel ranks");
  const i64 local = E / P, first = ex.index() * local;
  // Member j runs experts [j local, (j + 1) local): the sorted slots go to the members in
  // order. First each member learns how many rows of each of its experts come from each.
  const std::vector<i64> ones(static_cast<std::size_t>(P), 1);
  const Tensor send_counts = torch::tensor(counts, torch::kInt64).view({P, local}).to(x.device());
  Tensor recv_counts = torch::empty_like(send_counts);
  ex.all_to_all(recv_counts, send_counts, ones, ones);
  recv_counts = recv_counts.cpu();
  const i64* rc = recv_counts.data_ptr<i64>();  // [P, local]: member j's rows for each expert here
  std::vector<i64> send_rows(static_cast<std::size_t>(P), 0), recv_rows(static_cast<std::size_t>(P), 0),
      here(static_cast<std::size_t>(local), 0);
  for (i64 j = 0; j < P; ++j)
    for (i64 e = 0; e < local; ++e) {
      send_rows[j] += counts[j * local + e];
      recv_rows[j] += rc[j * local + e];
      here[e] += rc[j * local + e];
    }
  // The received rows come member by member, each member's by expert; the experts want
  // them expert by expert: `order` is that regrouping, `back` its inverse.
  std::vector<i64> start(static_cast<std::size_t>(P * local)), order, back;
  for (i64 k = 0, at = 0; k < P * local; ++k) start[k] = std::exchange(at, at + rc[k]);
  for (i64 e = 0; e < local; ++e)
    for (i64 j = 0; j < P; ++j)
      for (i64 r = 0; r < rc[j * local + e]; ++r) order.push_back(start[j * local + e] + r);
  back.resize(order.size());
  for (std::size_t k = 0; k < order.size(); ++k)
    back[static_cast<std::size_t>(order[k])] = static_cast<i64>(k);
  const auto on_device = [&](const std::vector<i64>& v) {
    return torch::tensor(v, torch::kInt64).to(x.device());
  };

  const Tensor received = exchange_rows(ex, x.index_select(0, source), send_rows, recv_rows);
  const Tensor rows = received.index_select(0, on_device(order));
  const Tensor out = s.recompute_experts && torch::GradMode::is_enabled()
                         ? RecomputedMlps::apply(rows, &w, first, Kernels::of(s), here)
                         : run_mlps(w, first, Kernels::of(s), rows, here);
  const Tensor returned = exchange_rows(ex, out.index_select(0, on_device(back)), recv_rows, send_rows);
  return Combine::apply(returned, slot_weights, source, x.size(0));
}

}  // namespace

Tensor moe_forward(const MoeWeights& w, const MoeSettings& s, const Tensor& x, MoeStats* stats) {
  const i64 N = x.size(0), E = w.router.size(0), k = s.top_k;
  TORCH_CHECK(k >= 1 && k <= E, "moe_forward: top_k ", k, " of ", E, " experts");
  TORCH_CHECK(is_stacked(w.w1) || static_cast<i64>(w.w1.size()) == E, "moe_forward: ", w.w1.size(),
              " gate projections for ", E, " experts");
  // The router: the gate GEMM in router_dtype, softmax in FP32.
  const Tensor logits = at::linear(x.to(s.router_dtype), w.router.to(s.router_dtype));
  const Tensor probs = at::softmax(logits.to(torch::kFloat32), -1);
  Tensor weights, ids;
  if (s.force_balanced) {
    // Slot j of token t goes to expert (t k + j) mod E: every expert gets the same load;
    // the weights are still the router's probabilities there.
    ids =
        at::remainder(torch::arange(N * k, torch::TensorOptions().dtype(torch::kInt64).device(x.device())), E)
            .view({N, k});
    weights = probs.gather(1, ids);
  } else {
    std::tie(weights, ids) = at::topk(probs, k, -1);
  }
  if (stats) {
    torch::NoGradGuard no_grad;
    const Tensor counts = at::bincount(ids.flatten(), {}, E).to(torch::kFloat32);
    stats->tokens_per_expert =
        stats->tokens_per_expert.defined() ? stats->tokens_per_expert + counts : counts;
    const Tensor conf = weights.sum();
    stats->confidence_sum = stats->confidence_sum.defined() ? stats->confidence_sum + conf : conf;
    stats->tokens += N;
  }
  if (s.norm_topk_prob) weights = weights / (weights.sum(-1, true) + 1e-20);

  // The slots sorted by expert (stable: a token's slots keep their order within an
  // expert), each slot's token and weight in that order.
  const Tensor flat = ids.flatten();
  const Tensor order = at::argsort(flat, /*stable=*/true);
  const Tensor source = at::floor_divide(order, k);
  const Tensor slot_weights = weights.flatten().index_select(0, order);
  const Tensor count_t = at::bincount(flat, {}, E).cpu();
  const std::vector<i64> counts(count_t.data_ptr<i64>(), count_t.data_ptr<i64>() + E);

  return s.exchange ? run_experts_parallel(w, s, x, source, counts, slot_weights)
         : s.recompute_experts && torch::GradMode::is_enabled()
             ? RecomputedExperts::apply(x, slot_weights, source, &w, Kernels::of(s), counts)
             : run_experts(w, Kernels::of(s), x, source, counts, slot_weights);
}

}  // namespace primecfg::train
