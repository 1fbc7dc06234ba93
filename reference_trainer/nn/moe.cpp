#include "nn/moe.hpp"

#include "base/mapped_copies.hpp"
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

// How the experts run on this call's rows (MoeSettings' grouped and fp8, the weights'
// device): one matmul per expert, the grouped GEMM, or its batched fallback. FP8 runs the
// loop, each expert's projections as FP8 linears (prime-rl's grouped FP8 GEMMs compute the
// same per expert; one grouped kernel is not built here).
enum class Path { loop, grouped, batched };

Path path_of(const MoeWeights& w, i64 first, Kernels k) {
  if (!k.grouped || k.fp8) return Path::loop;
  return grouped_mm_available(expert(w.w1, first)) ? Path::grouped : Path::batched;
}

// Where the slots sorted by expert sit in the buffer the experts run on: each expert's
// contiguous, in expert order, each group padded as its path needs (padding rows zero).
struct Groups {
  i64 rows = 0;           // the buffer's rows: the slots and the padding
  std::vector<i64> ends;  // each group's end (the grouped GEMM's offsets)
  i64 each = 0;           // batched: every group's rows (the largest group's count)
  Tensor row;             // [slots] int64 on the device: sorted slot s -> its buffer row
};

Groups groups_of(Path path, i64 align, const std::vector<i64>& counts, const torch::Device& device) {
  Groups g;
  // grouped: multiples of `align`, at least `align` rows even when empty (as torchtitan's
  // grouped GEMM pads them); batched: every group as large as the largest.
  if (path == Path::batched) g.each = std::max<i64>(1, *std::max_element(counts.begin(), counts.end()));
  std::vector<i64> row;
  for (const i64 n : counts) {
    for (i64 j = 0; j < n; ++j) row.push_back(g.rows + j);
    g.rows += path == Path::loop      ? n
              : path == Path::batched ? g.each
                                      : std::max(align, (n + align - 1) / align * align);
    g.ends.push_back(g.rows);
  }
  g.row = torch::tensor(row, torch::kInt64).to(device);
  return g;
}

// The experts' MLPs on their buffer [g.rows, D] (groups as `g` places them, counts[e]
// rows of expert first + e each): their outputs, row for row.
Tensor run_mlps(const MoeWeights& w, i64 first, Kernels k, Path path, const Tensor& buffer, const Groups& g,
                const std::vector<i64>& counts) {
  if (path == Path::loop) return run_loop(w, first, buffer, counts, k.fp8);
  const auto E = static_cast<i64>(counts.size());
  const Stacks st = stack_experts(w, first, E);
  Tensor out;
  if (path == Path::grouped) {
    const Tensor offs = torch::tensor(g.ends, torch::kInt64).to(buffer.device(), torch::kInt32);
    const Tensor h = at::silu(at::_grouped_mm(buffer, st.w1.transpose(-2, -1), offs)) *
                     at::_grouped_mm(buffer, st.w3.transpose(-2, -1), offs);
    out = at::_grouped_mm(h, st.w2.transpose(-2, -1), offs);
  } else {
    const Tensor b = buffer.view({E, g.each, buffer.size(1)});
    const Tensor h = at::silu(at::bmm(b, st.w1.transpose(1, 2))) * at::bmm(b, st.w3.transpose(1, 2));
    out = at::bmm(h, st.w2.transpose(1, 2)).reshape({E * g.each, -1});
  }
  release_until_backward(st, w, first, out);
  return out;
}

// The experts' buffer from the rows of `from` [R, D]: buffer row p is from[source[p]],
// zeros where source[p] == R (padding, only where `padded`). Row r of `from` fills
// `fanout` buffer rows, row_of[r fanout + j]; its gradient is theirs summed, by a gather
// and a sum. (index_select's own backward adds the rows into place atomically, a kernel
// five times slower than a gather of the same bytes on the H100.)
struct Dispatch : torch::autograd::Function<Dispatch> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& from, const Tensor& source,
                        const Tensor& row_of, i64 fanout, bool padded) {
    ctx->save_for_backward({row_of});
    ctx->saved_data["fanout"] = fanout;
    return (padded ? at::cat({from, from.new_zeros({1, from.size(1)})}) : from).index_select(0, source);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const i64 fanout = ctx->saved_data["fanout"].toInt();
    Tensor g = grad_out[0].index_select(0, ctx->get_saved_variables()[0]);
    if (fanout > 1) g = g.view({-1, fanout, g.size(1)}).sum(1);
    return {g, Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

// The layer's output [T, D] from the experts' outputs `out` [P, D]: token t's is the sum
// over its K slots j of weights[t, j] (FP32 [T, K]) times out[row_of[t K + j]], products
// and sum in FP32, rounded once to out's dtype. For the backward, each row of `out` has
// a token (`token_of` [P]; any token for a padding row) and its slot's weight
// (`weight_of` [P], FP32, 0 for padding). What it keeps is `out` as it came and those
// indices: autograd's record of the same ops kept an FP32 copy of the rows as well.
struct Combine : torch::autograd::Function<Combine> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& out, const Tensor& weights,
                        const Tensor& row_of, const Tensor& token_of, const Tensor& weight_of) {
    ctx->save_for_backward({out, row_of, token_of, weight_of});
    const Tensor rows = out.index_select(0, row_of).view({weights.size(0), weights.size(1), out.size(1)});
    return at::mul(rows, weights.unsqueeze(2)).sum(1).to(out.scalar_type());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &out = saved[0], &row_of = saved[1], &token_of = saved[2], &weight_of = saved[3];
    const i64 T = grad_out[0].size(0);
    // Each row's share of its token's gradient, in FP32 as the products ran.
    Tensor g = grad_out[0].index_select(0, token_of).to(torch::kFloat32);
    const Tensor grad_weights =
        ctx->needs_input_grad(1) ? at::mul(g, out).sum(1).index_select(0, row_of).view({T, -1}) : Tensor();
    const Tensor grad_out_rows =
        ctx->needs_input_grad(0) ? g.mul_(weight_of.unsqueeze(1)).to(out.scalar_type()) : Tensor();
    return {grad_out_rows, grad_weights, Tensor(), Tensor(), Tensor()};
  }
};

// Where each flat slot (token t's j-th choice, t K + j) went, from `order` (the slots
// sorted by expert: sorted slot s is flat slot order[s]) and each sorted slot's row.
Tensor flat_to_row(const Tensor& order, const Tensor& row) {
  return torch::empty_like(order).index_copy_(0, order, row);
}

// The experts' part of the layer, what selective checkpointing of "routed_experts"
// The slots sorted by expert (`order`, each an index into the [N, K] routing): each one's
// token, and its routing weight (FP32, out of autograd: Combine makes the weights' gradient).
struct SortedSlots {
  Tensor token, weight;
};
SortedSlots sorted_slots(const Tensor& order, const Tensor& weights) {
  return {at::floor_divide(order, weights.size(1)), weights.detach().flatten().index_select(0, order)};
}

// recomputes (as prime-rl's MoE._run_routed_experts): the K slots of each token of x
// (routing `weights` [N, K], FP32), sorted by expert (`order`, counts[e] slots of
// expert e), run by their experts and summed into their tokens.
Tensor run_experts(const MoeWeights& w, Kernels k, const Tensor& x, const Tensor& weights,
                   const Tensor& order, const std::vector<i64>& counts) {
  const i64 N = x.size(0), K = weights.size(1);
  const Path path = path_of(w, 0, k);
  const Groups g = groups_of(path, k.align, counts, x.device());
  const bool padded = g.rows > order.size(0);
  const Tensor row_of = flat_to_row(order, g.row);
  const SortedSlots slot = sorted_slots(order, weights);
  Tensor token_of = torch::full({g.rows}, N, order.options()).index_copy_(0, g.row, slot.token);
  const Tensor buffer = Dispatch::apply(x, token_of, row_of, K, padded);
  const Tensor weight_of = torch::zeros({g.rows}, weights.options()).index_copy_(0, g.row, slot.weight);
  if (padded && N > 0) token_of.clamp_max_(N - 1);  // a padding row's gradient is 0 times a token's
  return Combine::apply(run_mlps(w, 0, k, path, buffer, g, counts), weights, row_of, token_of, weight_of);
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
// routing weights and the slots' order (and their counts); the backward runs the experts
// again with autograd on, so the experts' weight gradients accumulate into w's tensors
// there (their post-accumulate hooks fire as usual) and x's and the weights' gradients
// go on.
struct RecomputedExperts : torch::autograd::Function<RecomputedExperts> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& x, const Tensor& weights,
                        const Tensor& order, const MoeWeights* w, Kernels k, std::vector<i64> counts) {
    ctx->save_for_backward({x, weights, order});
    ctx->saved_data["weights"] = reinterpret_cast<i64>(w);
    save_kernels(ctx, k);
    ctx->saved_data["counts"] = counts;
    torch::NoGradGuard no_grad;
    return run_experts(*w, k, x, weights, order, counts);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const auto* w = reinterpret_cast<const MoeWeights*>(ctx->saved_data["weights"].toInt());
    const std::vector<i64> counts = ctx->saved_data["counts"].toIntVector();
    Tensor x = saved[0].detach().requires_grad_(ctx->needs_input_grad(0));
    Tensor weights = saved[1].detach().requires_grad_(ctx->needs_input_grad(1));
    Tensor y;
    {
      torch::AutoGradMode grad_on(true);
      y = run_experts(*w, saved_kernels(ctx), x, weights, saved[2], counts);
    }
    if (y.requires_grad()) torch::autograd::backward({y}, {grad_out[0]});
    return {x.grad(), weights.grad(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

// The experts of this rank on the rows it received (expert parallelism), returned in
// the order they came: `regroup` [R] lists them expert by expert (received row
// regroup[s] is the s-th of its experts' sorted rows), counts[e] rows of expert
// first + e.
Tensor run_received(const MoeWeights& w, i64 first, Kernels k, const Tensor& received, const Tensor& regroup,
                    const std::vector<i64>& counts) {
  const Path path = path_of(w, first, k);
  const Groups g = groups_of(path, k.align, counts, received.device());
  const Tensor row_of = flat_to_row(regroup, g.row);  // received row -> buffer row
  const Tensor source =
      torch::full({g.rows}, received.size(0), regroup.options()).index_copy_(0, g.row, regroup);
  const Tensor buffer = Dispatch::apply(received, source, row_of, 1, g.rows > regroup.size(0));
  return run_mlps(w, first, k, path, buffer, g, counts).index_select(0, row_of);
}

// run_received under selective activation checkpointing, with expert parallelism: the
// forward keeps the rows this rank received; the backward runs its experts again.
struct RecomputedReceived : torch::autograd::Function<RecomputedReceived> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& received, const Tensor& regroup,
                        const MoeWeights* w, i64 first, Kernels k, std::vector<i64> counts) {
    ctx->save_for_backward({received, regroup});
    ctx->saved_data["weights"] = reinterpret_cast<i64>(w);
    ctx->saved_data["first"] = first;
    save_kernels(ctx, k);
    ctx->saved_data["counts"] = counts;
    torch::NoGradGuard no_grad;
    return run_received(*w, first, k, received, regroup, counts);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto* w = reinterpret_cast<const MoeWeights*>(ctx->saved_data["weights"].toInt());
    const auto saved = ctx->get_saved_variables();
    Tensor received = saved[0].detach().requires_grad_(ctx->needs_input_grad(0));
    Tensor y;
    {
      torch::AutoGradMode grad_on(true);
      y = run_received(*w, ctx->saved_data["first"].toInt(), saved_kernels(ctx), received, saved[1],
                       ctx->saved_data["counts"].toIntVector());
    }
    if (y.requires_grad()) torch::autograd::backward({y}, {grad_out[0]});
    return {received.grad(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

// run_experts with expert parallelism (moe.hpp): the slots' rows to the ranks that run
// their experts and the outputs back, each way one all-to-all.
Tensor run_experts_parallel(const MoeWeights& w, const MoeSettings& s, const Tensor& x, const Tensor& weights,
                            const Tensor& order, const std::vector<i64>& counts) {
  TokenExchange& ex = *s.exchange;
  const i64 P = ex.ranks(), E = static_cast<i64>(counts.size()), K = weights.size(1);
  TORCH_CHECK(E % P == 0, "moe_forward: ", E, " experts over ", P, " expert-parallel ranks");
  const i64 local = E / P, first = ex.index() * local;
  // Member j runs experts [j local, (j + 1) local): the sorted slots go to the members in
  // order. First each member learns how many rows of each of its experts come from each.
  const std::vector<i64> ones(static_cast<std::size_t>(P), 1);
  const Tensor send_counts = dev::upload_ints(counts, {P, local}, x.device());
  Tensor recv_counts = torch::empty_like(send_counts);
  ex.all_to_all(recv_counts, send_counts, ones, ones);
  const std::vector<i64> recv = dev::read_back_ints(recv_counts);
  const i64* rc = recv.data();  // [P, local]: member j's rows for each expert here
  std::vector<i64> send_rows(static_cast<std::size_t>(P), 0), recv_rows(static_cast<std::size_t>(P), 0),
      here(static_cast<std::size_t>(local), 0);
  for (i64 j = 0; j < P; ++j)
    for (i64 e = 0; e < local; ++e) {
      send_rows[j] += counts[j * local + e];
      recv_rows[j] += rc[j * local + e];
      here[e] += rc[j * local + e];
    }
  // The received rows come member by member, each member's by expert; the experts want
  // them expert by expert: `regroup` lists them so.
  std::vector<i64> start(static_cast<std::size_t>(P * local)), regroup;
  for (i64 q = 0, at = 0; q < P * local; ++q) start[q] = std::exchange(at, at + rc[q]);
  for (i64 e = 0; e < local; ++e)
    for (i64 j = 0; j < P; ++j)
      for (i64 r = 0; r < rc[j * local + e]; ++r) regroup.push_back(start[j * local + e] + r);
  const Tensor regroup_t = torch::tensor(regroup, torch::kInt64).to(x.device());

  // The sorted slots' rows, as sent (each token's K rows: gathered back by Dispatch).
  const Tensor slots = torch::arange(order.size(0), order.options());
  const SortedSlots slot = sorted_slots(order, weights);
  const Tensor sorted_slot = flat_to_row(order, slots);
  const Tensor sent = Dispatch::apply(x, slot.token, sorted_slot, K, false);
  const Tensor received = exchange_rows(ex, sent, send_rows, recv_rows);
  const Tensor out = s.recompute_experts && torch::GradMode::is_enabled()
                         ? RecomputedReceived::apply(received, regroup_t, &w, first, Kernels::of(s), here)
                         : run_received(w, first, Kernels::of(s), received, regroup_t, here);
  const Tensor returned = exchange_rows(ex, out, recv_rows, send_rows);
  return Combine::apply(returned, weights, sorted_slot, slot.token, slot.weight);
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
  // expert), counts[e] of expert e.
  const Tensor flat = ids.flatten();
  const Tensor order = at::argsort(flat, /*stable=*/true);
  const std::vector<i64> counts = dev::read_back_ints(at::bincount(flat, {}, E));

  return s.exchange ? run_experts_parallel(w, s, x, weights, order, counts)
         : s.recompute_experts && torch::GradMode::is_enabled()
             ? RecomputedExperts::apply(x, weights, order, &w, Kernels::of(s), counts)
             : run_experts(w, Kernels::of(s), x, weights, order, counts);
}

}  // namespace primecfg::train
