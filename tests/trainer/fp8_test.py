"""FP8 with blockwise scales (reference_trainer/nn/fp8.hpp) against a reference written
from the rules, not from the code under test (docs/design/fp8.md):

- e4m3 is built here from its definition (1 sign, 4 exponent bits with bias 7, 3 mantissa
  bits, subnormals, no infinity, S.1111.111 the only NaN: largest finite 448), and a value
  is rounded to the nearest of those numbers, ties to the even mantissa, beyond 448 to 448;
- a scale is max(amax / 448, 1e-4) in FP32 over 1 x 128 groups of an activation's row or
  128 x 128 blocks of a weight, a partial group or block scaling what it holds.

fp8_probe quantises the same matrices (odd sizes, a group below the scale floor, a zero
group, values at the rounding ties); every e4m3 value and every scale must be the
reference's to the bit, the weights' transposed copy the forward blocks transposed, and
the dequantised matrices values x scales. The reference with a group of 64 or a floor of
1e-12 must disagree on the same inputs (so this comparison can fail). Then which layers are
FP8: std::regex_search in the probe against Python's re.search (prime-rl's matcher), with
prime-rl's default ignore_patterns, on names that the escaped `mlp\\.gate\\.` must tell apart.

usage: fp8_test.py FP8_PROBE
"""

import os
import re
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

PROBE = sys.argv[1]
MAX, FLOOR, GROUP = 448.0, 1e-4, 128
failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def e4m3_values():
    """Every finite non-negative e4m3 number, ascending, with whether its mantissa is even."""
    out = []
    for e in range(16):
        for m in range(8):
            if e == 15 and m == 7:
                continue  # NaN
            v = (m / 8) * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
            out.append((v, m % 2 == 0))
    return out


TABLE = e4m3_values()
assert TABLE[-1][0] == MAX and TABLE[1][0] == 2.0**-9
VALUES = torch.tensor([v for v, _ in TABLE], dtype=torch.float64)
EVEN = torch.tensor([even for _, even in TABLE])


def round_e4m3(x):
    """x (FP32) to the nearest e4m3 number, ties to the even mantissa, saturating at 448."""
    a = x.double().abs().clamp(max=MAX).flatten()
    hi = torch.searchsorted(VALUES, a).clamp(max=len(TABLE) - 1)
    lo = (hi - 1).clamp(min=0)
    dlo, dhi = a - VALUES[lo], VALUES[hi] - a
    pick_hi = (dhi < dlo) | ((dhi == dlo) & EVEN[hi])
    r = torch.where(pick_hi, VALUES[hi], VALUES[lo])
    return (torch.sign(x.double().flatten()) * r).view(x.shape).float()


def padded(x, row_group, col_group):
    r, c = x.shape
    pr, pc = -(-r // row_group) * row_group, -(-c // col_group) * col_group
    out = torch.zeros(pr, pc, dtype=torch.float32)
    out[:r, :c] = x
    return out


def quantize(x, row_group, col_group, floor=FLOOR):
    """(e4m3 values as FP32, FP32 scales) of x in row_group x col_group blocks."""
    r, c = x.shape
    p = padded(x, row_group, col_group)
    gr, gc = p.shape[0] // row_group, p.shape[1] // col_group
    blocks = p.view(gr, row_group, gc, col_group)
    scales = (blocks.abs().amax(dim=(1, 3)) / torch.tensor(MAX, dtype=torch.float32)).clamp(min=floor)
    values = round_e4m3(blocks / scales.view(gr, 1, gc, 1)).view(p.shape)[:r, :c]
    return values, scales


def inputs():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(70, 300, generator=g) * 3  # 300 columns: two whole groups and a partial one
    x[5, :128] *= 1e-3  # amax below 448 x 1e-4: the scale floor
    x[6, 128:256] = 0  # a zero group
    x[7, :128] = torch.linspace(-1, 1, 128)
    x[7, 0] = -MAX  # scale 1: the row's other values land on e4m3's rounding ties
    x[7, 1:9] = torch.tensor([9.0, 11.0, 13.0, 15.0, 17.0, 19.0, 0.0048828125 * 3, 304.0])
    w = torch.randn(200, 260, generator=g) * 0.02  # partial blocks in both dimensions
    w[:128, :128] *= 1e-3
    return x, w


def run_probe(x, w, work):
    src, dst = os.path.join(work, "in.safetensors"), os.path.join(work, "out.safetensors")
    save_file({"x": x.contiguous(), "w": w.contiguous()}, src)
    p = subprocess.run([PROBE, "cast", src, dst], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"fp8_probe failed:\n{p.stderr}")
    return load_file(dst)


def same(a, b):
    return a.shape == b.shape and torch.equal(a, b)


def dequantized(x, row_group, col_group):
    v, s = quantize(x, row_group, col_group)
    r, c = x.shape
    return v * s.repeat_interleave(row_group, 0).repeat_interleave(col_group, 1)[:r, :c]


def pad_tokens(t):
    return padded(t, 1, GROUP)


def linear_reference(x, w, dy, w_rows=False, dw_channels=False):
    """prime-rl's three FP8 matmuls on bf16 x, w, dy: (y, dx, dw) and the bound of each,
    the products in FP32. w_rows / dw_channels: the wrong groupings, for the mutation check."""
    xb, wb, dyb = (t.bfloat16().float() for t in (x, w, dy))
    wq = dequantized(wb, 1, GROUP) if w_rows else dequantized(wb, GROUP, GROUP)
    wtq = dequantized(wb.t().contiguous(), GROUP, GROUP)
    if dw_channels:  # groups along the channels instead of the tokens
        a, b = dequantized(dyb, 1, GROUP).t(), dequantized(xb, 1, GROUP).t()
    else:
        a, b = dequantized(pad_tokens(dyb.t()), 1, GROUP), dequantized(pad_tokens(xb.t()), 1, GROUP)
    out = []
    for lhs, rhs in ((dequantized(xb, 1, GROUP), wq), (dequantized(dyb, 1, GROUP), wtq), (a, b)):
        exact = lhs.double() @ rhs.double().t()
        got = (lhs @ rhs.t()).bfloat16().float()
        # Another order of the FP32 sum (k terms) and one bf16 rounding either side.
        k = lhs.shape[1]
        bound = 2**-7 * exact.abs() + k * 2**-23 * (lhs.abs().double() @ rhs.abs().double().t())
        out.append((got, bound.float()))
    return out


def linear_matches_reference():
    g = torch.Generator().manual_seed(5)
    tokens, n_in, n_out = 200, 256, 384  # 200 tokens: dW's token groups end in a partial one
    x = torch.randn(tokens, n_in, generator=g)
    w = torch.randn(n_out, n_in, generator=g) * 0.05
    dy = torch.randn(tokens, n_out, generator=g) * 1e-2
    with tempfile.TemporaryDirectory() as work:
        src, dst = os.path.join(work, "in.safetensors"), os.path.join(work, "out.safetensors")
        save_file({"x": x, "w": w, "dy": dy}, src)
        p = subprocess.run([PROBE, "linear", src, dst], capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"fp8_probe linear failed:\n{p.stderr}")
        got = load_file(dst)
    ref = linear_reference(x, w, dy)
    for name, (want, bound) in zip(("y = x W^T", "dX = dY W", "dW = dY^T X"), ref):
        have = got[name.split()[0].lower()]
        worst = ((have - want).abs() / bound.clamp(min=1e-30)).max().item()
        check(have.shape == want.shape and worst <= 1, f"FP8 linear {name}: within the FP32 sum's and bf16's rounding of the reference ({worst:.3f} of it)")
    for label, wrong in (("W quantised by rows", linear_reference(x, w, dy, w_rows=True)[0]),
                         ("dW grouped along the channels", linear_reference(x, w, dy, dw_channels=True)[2])):
        which = got["y"] if label.startswith("W") else got["dw"]
        worst = ((which - wrong[0]).abs() / wrong[1].clamp(min=1e-30)).max().item()
        check(worst > 1, f"the reference with {label} is outside that bound ({worst:.1f} of it): the check can fail")



DEFAULT_IGNORE = [r"lm_head", r"router", r"mlp\.gate\.", r"shared_expert_gate", r"eh_proj", r"weights_proj",
                  r"in_proj_a", r"in_proj_b"]


class ReferenceFp8Linear(torch.autograd.Function):
    """prime-rl's three FP8 matmuls (docs/design/fp8.md): the operands quantised from their
    FP32 values, the products in the model's dtype (FP32, or FP64 to see what FP32's
    rounding alone moves)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        d, x2 = x.dtype, x.reshape(-1, x.shape[-1]).float()
        y = dequantized(x2, 1, GROUP).to(d) @ dequantized(w.float(), GROUP, GROUP).to(d).t()
        return y.view(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        d = x.dtype
        x2, dy2 = x.reshape(-1, x.shape[-1]).float(), dy.reshape(-1, dy.shape[-1]).float()
        dx = dequantized(dy2, 1, GROUP).to(d) @ dequantized(w.float().t().contiguous(), GROUP, GROUP).to(d).t()
        dw = dequantized(pad_tokens(dy2.t()), 1, GROUP).to(d) @ dequantized(pad_tokens(x2.t()), 1, GROUP).to(d).t()
        return dx.view_as(x), dw.to(w.dtype)


def prime_rl_linears(model, moe):
    """The nn.Linear modules prime-rl's own class of this model has, by qualified name, with
    (out, in) and the transformers module that computes the same product (None where
    transformers' is not an nn.Linear). prime-rl's Qwen3 and Llama name their linears as
    transformers does; its Qwen3-MoE holds each routed block's router as
    mlp.router.gate (models/layers/moe.py, TokenChoiceTopKRouter), where transformers 5 has
    mlp.gate, a module of its own."""
    out = {name: (m.out_features, m.in_features, m) for name, m in model.named_modules()
           if isinstance(m, torch.nn.Linear)}
    if moe:
        for i, layer in enumerate(model.model.layers):
            if hasattr(layer.mlp, "experts"):
                w = layer.mlp.gate.weight
                out[f"model.layers.{i}.mlp.router.gate"] = (w.shape[0], w.shape[1], None)
    return out


def fp8_modules(linears, patterns):
    """prime-rl's rule: no pattern found by re.search, both dimensions multiples of 128."""
    return {n for n, (o, i, _) in linears.items()
            if not any(re.search(p, n) for p in patterns) and o % 128 == 0 and i % 128 == 0}


def fp8_experts_forward(experts):
    """transformers 5's Qwen3MoeExperts.forward with each expert's three projections as
    ReferenceFp8Linear, on its rows in prime-rl's order (the slots sorted by expert, stably:
    TokenReorderer), which sets the 1 x 128 token groups of the weight gradients."""

    def forward(hidden_states, top_k_index, top_k_weights):
        k, I = top_k_index.shape[1], experts.intermediate_dim
        flat = top_k_index.reshape(-1)
        order = torch.argsort(flat, stable=True)
        out = torch.zeros_like(hidden_states)
        for e in range(experts.num_experts):
            slots = order[flat[order] == e]
            if len(slots) == 0:
                continue
            tokens = slots // k
            rows = hidden_states[tokens]
            gate_up = experts.gate_up_proj[e]
            h = experts.act_fn(ReferenceFp8Linear.apply(rows, gate_up[:I])) * ReferenceFp8Linear.apply(rows, gate_up[I:])
            y = ReferenceFp8Linear.apply(h, experts.down_proj[e])
            out.index_add_(0, tokens, y * top_k_weights.reshape(-1)[slots, None])
        return out

    return forward


def reference_grads(model, fp8, ids, targets, scale, fp8_experts=False):
    """Loss (the tokens' cross-entropies summed, x scale) and gradients of `model` with the
    linears named in fp8 as ReferenceFp8Linear (and the routed experts' projections too with
    fp8_experts), in FP32 by name."""
    saved = {}
    for name, m in model.named_modules():
        if name in fp8:
            saved[name] = m.forward
            m.forward = (lambda mod: lambda x: ReferenceFp8Linear.apply(x, mod.weight))(m)
        if fp8_experts and name.endswith("mlp.experts"):
            saved[name] = m.forward
            m.forward = fp8_experts_forward(m)
    model.zero_grad()
    logits = model(ids).logits
    loss = torch.nn.functional.cross_entropy(logits[0], targets[0], reduction="sum") * scale
    loss.backward()
    for name, m in model.named_modules():
        if name in saved:
            m.forward = saved[name]
    return loss.item(), {n: p.grad.float().clone() for n, p in model.named_parameters()}


def per_expert(grads, moe):
    """transformers 5's fused experts (gate_up_proj [E, 2I, D], down_proj [E, D, I]) as the
    per-expert tensors the trainer names."""
    if not moe:
        return grads
    out = {}
    for n, g in grads.items():
        if n.endswith("mlp.experts.gate_up_proj"):
            I = g.shape[1] // 2
            for e in range(g.shape[0]):
                out[n.replace("gate_up_proj", f"{e}.gate_proj.weight")] = g[e, :I]
                out[n.replace("gate_up_proj", f"{e}.up_proj.weight")] = g[e, I:]
        elif n.endswith("mlp.experts.down_proj"):
            for e in range(g.shape[0]):
                out[n.replace("down_proj", f"{e}.down_proj.weight")] = g[e]
        else:
            out[n] = g
    return out


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()


def model_matches_reference():
    """A small Qwen3 and a small Qwen3-MoE (dimensions multiples of 128, so that every linear
    can be FP8), each loaded by fp8_probe with its linears chosen by Transformer::use_fp8:
    the layers must be those prime-rl's rule picks among prime-rl's module names, and each
    FP8 linear must compute what transformers' model computes with that linear replaced by
    the reference FP8 linear above (FP32, CPU).

    One linear at a time (an ignore pattern that finds every other one: `^(?!name$)`): a
    value a hair from an e4m3 rounding midpoint rounds either way, so two correct FP32
    implementations that sum in other orders disagree by an e4m3 step here and there. How far
    that moves a result is measured, not assumed: the same reference in FP64 (each operand
    quantised from its FP64 value rounded to FP32) differs from the FP32 one by some noise;
    over the linears its largest is the noise, and each linear's weight gradient and the
    loss must be nearer to it than the bound, while the same model without FP8 must be farther,
    so that the comparison can fail for every layer. With every linear in FP8 at once, each flip
    perturbs every FP8 layer after it, which flips more: on these random models that chaos
    moves the loss as much as FP8 itself does (measured: 0.5 in 1202, FP64 against FP32), so
    the whole model is only held to finite values."""
    torch.set_num_threads(1)  # one order of each sum, run after run (the probe runs one thread too)
    import copy

    import transformers

    g = torch.Generator().manual_seed(11)
    # 320 tokens: dW's token groups end in a partial one, and each of the 4 experts gets
    # about 160 of the 640 slots, more than one group of 128.
    T, V = 320, 256
    # The summed loss (scale 1), so that the gradients' 1 x 128 groups scale above the
    # 1e-4 floor, where e4m3 is fine-grained, rather than into its subnormals.
    SCALE = 1.0
    # The bound lies between the two things it tells apart: the noise (one other order of
    # the sums, FP64 against FP32) and the distance of the model without FP8. Their geometric
    # mean leaves the same factor either way, whichever CPU runs it: a fixed multiple of the
    # noise (2.5, chosen on a Xeon, where the trainer stayed within 0.9 of it) let an AMD
    # EPYC's other order of the sums (5.5 times the noise, with Qwen3's layer-0 gate_proj)
    # fail, where the model without FP8 was 10 times farther still.
    def between(noise, without):
        return (noise * without) ** 0.5
    ids = torch.randint(0, V, (1, T), generator=g)
    targets = torch.randint(0, V, (1, T), generator=g)
    shape = dict(vocab_size=V, hidden_size=256, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                 head_dim=128, max_position_embeddings=512, tie_word_embeddings=False, rms_norm_eps=1e-6)
    cases = [("Qwen3", transformers.Qwen3Config(intermediate_size=384, **shape), False),
             ("Qwen3-MoE", transformers.Qwen3MoeConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128,
                                                       intermediate_size=384, mlp_only_layers=[1], norm_topk_prob=True,
                                                       **shape), True)]
    for label, config, moe in cases:
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config).float()
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0, 0.05) if p.dim() == 2 else p.uniform_(0.8, 1.2)
        model64 = copy.deepcopy(model).double()
        model64.config._experts_implementation = "eager"  # torch's grouped_mm has no FP64

        def reference(fp8, experts=False):
            """(loss, gradients) in FP32, and the same in FP64."""
            l32, g32 = reference_grads(model, fp8, ids, targets, SCALE, experts)
            l64, g64 = reference_grads(model64, fp8, ids, targets, SCALE, experts)
            return (l32, per_expert(g32, moe)), (l64, per_expert(g64, moe))

        linears = prime_rl_linears(model, moe)
        want_fp8 = fp8_modules(linears, DEFAULT_IGNORE)
        hf_fp8 = {n for n in want_fp8 if linears[n][2] is not None}
        with tempfile.TemporaryDirectory() as work:
            model.save_pretrained(work)
            pf, inp, outp = (os.path.join(work, n) for n in ("patterns", "in.safetensors", "out.safetensors"))

            def probe(patterns, experts=moe):
                """(decisions by prime-rl module name, loss and gradients) or the failed process;
                experts: the routed experts in FP8 too (prime-rl's default enable_grouped_gemm)."""
                with open(pf, "w") as f:
                    f.write("".join(p + "\n" for p in patterns))
                save_file({"ids": ids.float(), "targets": targets.float(), "scale": torch.tensor([SCALE]),
                           "fp8_experts": torch.tensor([float(experts)])}, inp)
                p = subprocess.run([PROBE, "model", work, pf, inp, outp], capture_output=True, text=True)
                if p.returncode != 0:
                    return p, None
                return {line.split(" ")[1]: line.split(" ", 2)[2] for line in p.stdout.splitlines()}, load_file(outp)

            decided, got = probe(DEFAULT_IGNORE)
            check(got is not None, f"{label}: fp8_probe trains with prime-rl's default ignore_patterns")
            if got is None:
                print(decided.stderr)
                continue
            check(set(decided) == set(linears), f"{label}: a decision for each of prime-rl's {len(linears)} linears, by its name there")
            check({n for n, d in decided.items() if d == "fp8"} == want_fp8,
                  f"{label}: FP8 where prime-rl's rule puts it ({len(want_fp8)} linears: {sorted(want_fp8)[:3]}...)")
            refused, _ = probe([])
            check(refused.returncode == 2 and "lm_head" in refused.stderr,
                  f"{label}: no pattern for lm_head is refused by name ({refused.stderr.strip()[:90]})")

            (_, grads), _ = reference(hf_fp8, moe)
            check(set(got) - {"loss"} == set(grads), f"{label}: a gradient for each of transformers' parameters")
            check(all(torch.isfinite(t).all() for t in got.values()), f"{label}, every linear in FP8: the loss and "
                                                                       f"every gradient finite")

            (l_none, grads_none), _ = reference(set())
            runs = []  # per linear alone: (its gradient's error, noise, distance without FP8; the loss's error, noise)
            for m in sorted(hf_fp8):
                alone, got1 = probe(DEFAULT_IGNORE + [f"^(?!{re.escape(m)}$)"], experts=False)
                if got1 is None or {n for n, d in alone.items() if d == "fp8"} != {m}:
                    check(False, f"{label}: {m} alone in FP8 by a lookahead pattern")
                    continue
                (l1, g1), (l1_64, g1_64) = reference({m})
                w = m + ".weight"
                runs.append((m, rel(got1[w], g1[w]), rel(g1_64[w], g1[w]), rel(grads_none[w], g1[w]),
                             abs(got1["loss"].item() - l1), abs(l1_64 - l1), abs(l_none - l1)))
            if runs:
                # One layer's flips are few and random: the noise is their largest effect over the
                # layers; without FP8, the nearest layer's distance.
                # The bounds are each linear's own (between the noise and where its model without
                # FP8 lies), checked as fractions of them: at most 1, and without FP8 above 1.
                grad_noise, loss_noise = max(r[2] for r in runs), max(r[5] for r in runs)
                worst = max((r[1] / between(grad_noise, r[3]), r[0]) for r in runs)
                check(worst[0] <= 1, f"{label}, each FP8 linear alone: its weight's gradient nearer than between the "
                                     f"noise ({grad_noise:.1e}) and without FP8 ({worst[0]:.2f} of that at worst, {worst[1]})")
                worst = max((r[4] / between(loss_noise, r[6]), r[0]) for r in runs)
                check(worst[0] <= 1, f"{label}, each FP8 linear alone: the loss nearer than between the noise "
                                     f"({loss_noise:.1e}) and without FP8 ({worst[0]:.2f} of that at worst, with {worst[1]})")
                weakest = min((min(r[3] / between(grad_noise, r[3]), r[6] / between(loss_noise, r[6])), r[0])
                              for r in runs)
                check(weakest[0] > 1, f"{label}, each FP8 linear alone: without FP8 its gradient and the loss are "
                                      f"outside those bounds ({weakest[0]:.1f} of them at least, {weakest[1]}): the "
                                      f"comparison can fail")
            if moe:
                # The routed experts alone in FP8 (every linear kept in bf16 by "."), the same
                # way: each expert's weights' gradients within the bound, without FP8 outside.
                _, got_e = probe(["."], experts=True)
                (l_e, g_e), (l_e64, g_e64) = reference(set(), experts=True)
                expert_weights = [n for n in g_e if ".mlp.experts." in n]
                noise = max(rel(g_e64[n], g_e[n]) for n in expert_weights)
                weakest = min((rel(grads_none[n], g_e[n]), n) for n in expert_weights)
                bound = between(noise, weakest[0])
                worst = max((rel(got_e[n], g_e[n]), n) for n in expert_weights)
                check(worst[0] <= bound, f"{label}, the routed experts alone in FP8: every expert weight's gradient "
                                         f"within {bound:.1e} (noise {noise:.1e}; off by {worst[0]:.1e} at worst, {worst[1]})")
                err, loss_bound = abs(got_e["loss"].item() - l_e), between(abs(l_e64 - l_e), abs(l_none - l_e))
                check(err <= loss_bound, f"{label}, the routed experts alone in FP8: the loss within {loss_bound:.1e} "
                                         f"(noise {abs(l_e64 - l_e):.1e}; off by {err:.1e})")
                check(weakest[0] > bound and abs(l_none - l_e) > loss_bound,
                      f"{label}, the routed experts alone in FP8: without FP8 each gradient and the loss are outside "
                      f"those bounds ({weakest[0]:.1e} at least, {weakest[1]}; the loss {abs(l_none - l_e):.1e})")

def main():
    x, w = inputs()
    with tempfile.TemporaryDirectory() as work:
        got = run_probe(x, w, work)
    xv, xs = quantize(x, 1, GROUP)
    wv, ws = quantize(w, GROUP, GROUP)
    check(same(got["x_scales"], xs), "activations: one FP32 scale per row and 128 columns, max(amax / 448, 1e-4)")
    check(same(got["x_values"], xv), "activations: every e4m3 value rounded to nearest, ties to even, as defined")
    check(same(got["w_scales"], ws), "weights: one FP32 scale per 128 x 128 block")
    check(same(got["w_values"], wv), "weights: every e4m3 value as defined")
    check(same(got["wt_values"], wv.t().contiguous()) and same(got["wt_scales"], ws.t().contiguous()),
          "weights transposed (the backward's copy): the forward's blocks transposed, bit for bit")
    check(same(got["x_dequantized"], xv * xs.repeat_interleave(GROUP, 1)[:, : x.shape[1]]),
          "activations dequantised: values x scales")
    check(same(got["w_dequantized"], wv * ws.repeat_interleave(GROUP, 0).repeat_interleave(GROUP, 1)[: w.shape[0], : w.shape[1]]),
          "weights dequantised: values x scales")
    # What the format allows: half an e4m3 step of x / scale, times the scale: 1/16 of |x|
    # among the normal numbers, 2^-10 of the scale among the subnormals.
    s_each = xs.repeat_interleave(GROUP, 1)[:, : x.shape[1]]
    bound = torch.maximum(x.abs() * 2**-4, s_each * 2**-10)
    err = ((got["x_dequantized"] - x).abs() / bound).max()
    check(err <= 1 + 1e-5, f"activations dequantised within half an e4m3 step (worst {err:.3f} of one)")
    # The comparison can fail: other groups or another floor give other bits here.
    check(not same(got["x_values"], quantize(x, 1, 64)[0]), "a group of 64 gives other values")
    check(not same(got["x_scales"], quantize(x, 1, GROUP, floor=1e-12)[1]), "a floor of 1e-12 gives other scales")
    check(not same(got["w_values"], quantize(w, 64, 64)[0]), "64 x 64 weight blocks give other values")

    linear_matches_reference()

    # Which layers are FP8: prime-rl's default patterns, matched as prime-rl matches them.
    patterns = [r"lm_head", r"router", r"mlp\.gate\.", r"shared_expert_gate", r"eh_proj", r"weights_proj",
                r"in_proj_a", r"in_proj_b"]
    names = [("model.layers.0.self_attn.q_proj", 4096, 2048), ("model.layers.0.mlp.gate_proj", 768, 2048),
             ("model.layers.0.mlp.gate.proj", 128, 2048), ("model.layers.3.mlp.router.gate", 128, 2048),
             ("lm_head", 151936, 2048), ("model.layers.1.mlp.shared_expert_gate", 128, 2048),
             ("model.layers.0.self_attn.k_proj", 100, 2048), ("model.layers.0.mlp.down_proj", 2048, 6144),
             ("model.layers.12.mlp.experts.gate_up_proj", 1536, 2048), ("model.mtp.eh_proj", 2048, 4096)]
    with tempfile.TemporaryDirectory() as work:
        pf, nf = os.path.join(work, "patterns"), os.path.join(work, "names")
        with open(pf, "w") as f:
            f.write("\n".join(patterns) + "\n")
        with open(nf, "w") as f:
            f.write("".join(f"{n} {o} {i}\n" for n, o, i in names))
        p = subprocess.run([PROBE, "decide", pf, nf], capture_output=True, text=True)
    lines = p.stdout.splitlines()
    check(p.returncode == 0 and len(lines) == len(names), "the probe decides every name")
    for (name, o, i), line in zip(names, lines):
        hit = next((pat for pat in patterns if re.search(pat, name)), None)
        want = f'matches ignore pattern "{hit}"' if hit else (
            "fp8" if o % 128 == 0 and i % 128 == 0 else f"{o} x {i} is not a multiple of 128 in both dimensions")
        check(line == want, f"{name} ({o} x {i}): {want}")

    model_matches_reference()
    if failures:
        raise SystemExit(f"{len(failures)} failed")
    print("all passed")


main()
