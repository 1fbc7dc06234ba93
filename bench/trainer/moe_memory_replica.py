#!/usr/bin/env python3
"""The live bytes of one routed layer's forward and backward, on the CPU, for the planner.

    python3 bench/trainer/moe_memory_replica.py

A Python replica of nn/moe.cpp's grouped path (bf16, torch._grouped_mm, which torch runs
on the CPU too): the buffer gathered from the tokens (`Dispatch`), the weighted sum
gathered from the buffer (`Combine`), the stacked experts' copy released after the forward
and stacked again when the gradient reaches the GEMMs. Autograd frees what it saved in the
same order on any device, so the CPU profiler's memory events show the order in which a
routed block's backward holds its bytes: prints what the layer keeps after its forward, the
peaks of forward and backward, and the backward's timeline by operator. The shape keeps
Qwen3-30B-A3B's ratios (128 experts, top 8; D, I and the tokens an eighth of 2048, 768 and
8192), so each figure times 64 is that model's at 8,192 tokens. A replica, not the code:
it shows the order the planner's stages of the backward follow (models/qwen3_moe/spec.cpp),
not nn/moe.cpp's bytes on a GPU (the CPU's grouped GEMM backward makes copies that CUDA's
does not); the GPU tests and --profile.memory check those.
"""
import json
import os
import tempfile

import torch
torch.manual_seed(0)
N, D, I, E, K, align = 1024, 256, 96, 128, 8, 8
bf = torch.bfloat16
x = torch.randn(N, D, dtype=bf, requires_grad=True)
router = torch.randn(E, D, dtype=bf, requires_grad=True)
W1 = [(torch.randn(I, D, dtype=bf) / 20).requires_grad_() for _ in range(E)]
W3 = [(torch.randn(I, D, dtype=bf) / 20).requires_grad_() for _ in range(E)]
W2 = [(torch.randn(D, I, dtype=bf) / 12).requires_grad_() for _ in range(E)]

class Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, frm, source, row_of, fanout, padded):
        ctx.save_for_backward(row_of); ctx.fanout = fanout
        ext = torch.cat([frm, frm.new_zeros(1, frm.shape[1])]) if padded else frm
        return ext.index_select(0, source)
    @staticmethod
    def backward(ctx, g):
        (row_of,) = ctx.saved_tensors
        g = g.index_select(0, row_of)
        if ctx.fanout > 1: g = g.view(-1, ctx.fanout, g.shape[1]).sum(1)
        return g, None, None, None, None

class Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, out, w, row_of, token_of, weight_of):
        ctx.save_for_backward(out, row_of, token_of, weight_of)
        rows = out.index_select(0, row_of).view(w.shape[0], w.shape[1], out.shape[1])
        return (rows * w.unsqueeze(2)).sum(1).to(out.dtype)
    @staticmethod
    def backward(ctx, grad):
        out, row_of, token_of, weight_of = ctx.saved_tensors
        T = grad.shape[0]
        g = grad.index_select(0, token_of).float()
        gw = (g * out).sum(1).index_select(0, row_of).view(T, -1)
        go = g.mul_(weight_of.unsqueeze(1)).to(out.dtype)
        return go, gw, None, None, None

def layer(x):
    probs = torch.nn.functional.linear(x.float(), router.float()).softmax(-1)
    w, ids = probs.topk(K, -1)
    w = w / (w.sum(-1, keepdim=True) + 1e-20)
    flat = ids.flatten(); order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=E).tolist()
    rows, ends, row = 0, [], []
    for n in counts:
        row += list(range(rows, rows + n)); rows += max(align, (n + align - 1) // align * align); ends.append(rows)
    row = torch.tensor(row)
    row_of = torch.empty_like(order).index_copy_(0, order, row)
    token_of = torch.full((rows,), N).index_copy_(0, row, order // K)
    buf = Dispatch.apply(x, token_of, row_of, K, rows > N * K)
    weight_of = torch.zeros(rows).index_copy_(0, row, w.detach().flatten().index_select(0, order))
    token_of.clamp_max_(N - 1)
    s1, s3, s2 = torch.stack(W1), torch.stack(W3), torch.stack(W2)
    offs = torch.tensor(ends, dtype=torch.int32)
    h = torch.nn.functional.silu(torch._grouped_mm(buf, s1.transpose(-2, -1), offs)) * torch._grouped_mm(buf, s3.transpose(-2, -1), offs)
    o = torch._grouped_mm(h, s2.transpose(-2, -1), offs)
    # release_until_backward: the copies' bytes go, and come back when o's gradient arrives
    st = [(s, s.untyped_storage(), s.untyped_storage().nbytes(), ws) for s, ws in ((s1, W1), (s3, W3), (s2, W2))]
    for s, u, n, ws in st: u.resize_(0)
    def refill(_):
        with torch.no_grad():
            for s, u, n, ws in st:
                u.resize_(n); t = torch.empty(0, dtype=bf).set_(u, 0, s.shape); torch.stack(ws, out=t)
    o.register_hook(refill)
    del s1, s3, s2
    return Combine.apply(o, w, row_of, token_of, weight_of)

from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
    with torch.profiler.record_function("FWD"):
        y = layer(x)
    with torch.profiler.record_function("BWD"):
        y.float().sum().backward()
with tempfile.TemporaryDirectory() as tmp:
    prof.export_chrome_trace(os.path.join(tmp, "trace.json"))
    ev = json.load(open(os.path.join(tmp, "trace.json")))["traceEvents"]
mem = sorted((e for e in ev if e.get("name") == "[memory]"), key=lambda e: e["ts"])
spans = {e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("name") in ("FWD", "BWD") and "dur" in e}
live = 0; t0 = mem[0]["args"]["Total Allocated"] - mem[0]["args"]["Bytes"]
peaks = {"FWD": 0, "BWD": 0}; end_fwd = None
for e in mem:
    a = e["args"]["Total Allocated"] - t0
    for k, (s, t) in spans.items():
        if s <= e["ts"] <= t: peaks[k] = max(peaks[k], a)
    if e["ts"] <= spans["FWD"][1]: end_fwd = a
S = N * K; dt = 2
print(f"kept after forward (incl y): {end_fwd/1e6:.2f} MB; forward peak {peaks['FWD']/1e6:.2f}; backward peak {peaks['BWD']/1e6:.2f} MB")
inuse = 3 * E * I * D * dt
print(f"units: slot*D*dt = {S*D*dt/1e6:.2f} MB, slot*I*dt = {S*I*dt/1e6:.2f} MB, in_use = {inuse/1e6:.2f} MB, N*D*4 = {N*D*4/1e6:.2f}")
ops = sorted((e for e in ev if e.get("ph") == "X" and e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
def op_at(ts):
    best = None
    for o in ops:
        if o["ts"] <= ts <= o["ts"] + o["dur"]:
            if best is None or o["dur"] < best["dur"]: best = o
    return best["name"] if best else "?"
b0, b1 = spans["BWD"]
series = [(e["ts"], e["args"]["Total Allocated"] - t0) for e in mem if b0 <= e["ts"] <= b1]
last = None
for ts, a in series:
    name = op_at(ts)
    if name != last:
        print(f"{a/1e6:8.2f} MB  {name}")
        last = name
