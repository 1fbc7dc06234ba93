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
    if failures:
        raise SystemExit(f"{len(failures)} failed")
    print("all passed")


main()
