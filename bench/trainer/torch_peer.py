#!/usr/bin/env python3
"""The PyTorch peer of primecfg-train's benchmark: the same model, batch and dtypes.

Same architecture as reference_trainer/nn/transformer.cpp (RMSNorm, RoPE, grouped-query
attention through scaled_dot_product_attention, optional QK-norm, SwiGLU), bf16
weights and compute, FP32 master weights with FP32 gradients, and
torch.optim.AdamW(fused=True) on the masters, as primecfg-train's offload = "none".
The loss is the plain one: full logits, then F.cross_entropy in FP32.

  --compile: torch.compile per transformer block (one graph, reused by every layer)
             and on the loss.
  --impl hf: the model is transformers' own (LlamaForCausalLM / Qwen3ForCausalLM from a
             config of the same sizes, random init, sdpa attention), its loss too.
  --impl liger: the same with Liger's kernels patched in first (RMSNorm, RoPE, SwiGLU,
             fused linear cross-entropy; liger-kernel must be importable).
  --float8 RECIPE: torchao's float8 training (tensorwise, rowwise or rowwise_with_gw_hp)
             on every block linear (q, k, v, o, gate, up, down), the LM head in bf16 as
             prime-rl's default ignore patterns keep it: the three matmuls of each through
             torchao's autograd function, as its Float8Linear runs them (dense presets,
             --impl own; on the CPU, torchao's emulation, only to check that it runs).
  Qwen3-MoE presets (--impl own): the routed blocks as reference_trainer/nn/moe.cpp runs
             them: the router's GEMM and softmax in FP32, top-k, the weights renormalised
             (norm_topk_prob), the slots sorted by expert and padded to multiples of 8
             rows per group, torch._grouped_mm over the stacked experts, the outputs
             weighted in FP32 and summed; --layers cuts the model to its first blocks.
  The training around the model is the same for every impl: bf16 weights, FP32
  masters and gradients, fused AdamW on the masters, the weights copied back.

Prints one JSON object (median step time over the timed steps, tokens/s, MFU,
peak GPU memory, host memory) on the last line of stdout.
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

PRESETS = {
    # vocab, hidden, layers, heads, kv_heads, head_dim, intermediate, rope_theta, eps, qk_norm, tied
    "primecfg/tiny": (260, 128, 2, 4, 2, 32, 384, 1e4, 1e-6, True, True),
    "Qwen/Qwen3-0.6B": (151936, 1024, 28, 16, 8, 128, 3072, 1e6, 1e-6, True, True),
    "meta-llama/Llama-3.2-1B": (128256, 2048, 16, 32, 8, 64, 8192, 5e5, 1e-5, False, True),
    "meta-llama/Llama-3.2-3B": (128256, 3072, 28, 24, 8, 128, 8192, 5e5, 1e-5, False, True),
    "meta-llama/Meta-Llama-3-8B": (128256, 4096, 32, 32, 8, 128, 14336, 5e5, 1e-5, False, False),
    "primecfg/tiny-moe": (260, 128, 2, 4, 2, 32, 384, 1e4, 1e-6, True, True),
    "Qwen/Qwen3-30B-A3B": (151936, 2048, 48, 32, 4, 128, 6144, 1e6, 1e-6, True, False),
}
# Routed experts: experts, top_k, moe_intermediate, norm_topk_prob, dense blocks (mlp_only_layers).
MOE = {
    "primecfg/tiny-moe": (8, 2, 96, True, (1,)),
    "Qwen/Qwen3-30B-A3B": (128, 8, 768, True, ()),
}


def matmul_params(a, moe=None):
    """What a token is multiplied by (MFU's N): a routed block counts its router and top_k experts."""
    vocab, d, layers, heads, kv, hd, inter = a[:7]
    attn = d * heads * hd + 2 * d * kv * hd + heads * hd * d
    n = vocab * d
    for l in range(layers):
        if moe and l not in moe[4]:
            experts, k, mi = moe[:3]
            n += attn + experts * d + k * 3 * d * mi
        else:
            n += attn + 3 * d * inter
    return n


def build(a, device, moe=None):
    vocab, d, layers, heads, kv, hd, inter, theta, eps, qk_norm, tied = a
    g = torch.Generator(device=device).manual_seed(0)

    def w(*shape):
        return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * 0.02).to(torch.bfloat16)

    def ones(n):
        return torch.ones(n, device=device, dtype=torch.bfloat16)

    params = {"embed": w(vocab, d), "norm": ones(d)}
    if not tied:
        params["head"] = w(vocab, d)
    blocks = []
    for l in range(layers):
        b = dict(in_norm=ones(d), wq=w(heads * hd, d), wk=w(kv * hd, d), wv=w(kv * hd, d), wo=w(d, heads * hd),
                 post_norm=ones(d))
        if moe and l not in moe[4]:
            experts, _, mi = moe[:3]
            b.update(router=w(experts, d), w1=w(experts, mi, d), w3=w(experts, mi, d), w2=w(experts, d, mi))
        else:
            b.update(w_gate=w(inter, d), w_up=w(inter, d), w_down=w(d, inter))
        if qk_norm:
            b["q_norm"] = ones(hd)
            b["k_norm"] = ones(hd)
        blocks.append(b)
    for t in list(params.values()) + [t for b in blocks for t in b.values()]:
        t.requires_grad_(True)
    return params, blocks


def rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def routed_experts(g, router, w1, w3, w2, top_k, norm_topk_prob, align=8):
    """nn/moe.cpp's grouped path: g [N, D] -> the weighted sum of each token's top_k experts."""
    N, D = g.shape
    E = router.shape[0]
    probs = F.linear(g.float(), router.float()).softmax(-1)
    weights, ids = probs.topk(top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    flat = ids.flatten()
    order = flat.argsort(stable=True)
    src = order // top_k
    rows = g[src]
    counts = torch.bincount(flat, minlength=E)
    padded = ((counts + align - 1) // align * align).clamp(min=align)
    ends = padded.cumsum(0)
    group = torch.repeat_interleave(torch.arange(E, device=g.device), counts)
    dst = (ends - padded)[group] + torch.arange(rows.shape[0], device=g.device) - (counts.cumsum(0) - counts)[group]
    buf = rows.new_zeros(int(ends[-1]), D).index_copy(0, dst, rows)
    offs = ends.to(torch.int32)
    h = F.silu(torch._grouped_mm(buf, w1.transpose(-2, -1), offs=offs)) * torch._grouped_mm(
        buf, w3.transpose(-2, -1), offs=offs)
    out = torch._grouped_mm(h, w2.transpose(-2, -1), offs=offs)[dst]
    scaled = (out.float() * weights.flatten()[order, None]).to(g.dtype)
    return torch.zeros_like(g).index_add(0, src, scaled)


def float8_matmul(recipe, device):
    """h @ w.t() with torchao's float8 training recipe, as its Float8Linear computes it."""
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.float8_linear import Float8Linear, matmul_with_hp_or_float8_args

    config = Float8LinearConfig.from_recipe_name(recipe)
    if device.type != "cuda":
        config = Float8LinearConfig(**{**config.__dict__, "emulate": True})
    mm = Float8Linear(16, 16, bias=False, config=config, device="meta").linear_mm_config
    return lambda h, w: matmul_with_hp_or_float8_args.apply(h, w.t(), mm, config)


def make_block(a, moe=None, mm=None):
    vocab, d, layers, heads, kv, hd, inter, theta, eps, qk_norm, tied = a
    mm = mm or (lambda h, w: h @ w.t())

    def block(x, cos, sin, in_norm, wq, wk, wv, wo, post_norm, w_gate=None, w_up=None, w_down=None, q_norm=None,
              k_norm=None, router=None, w1=None, w3=None, w2=None):
        B, T, _ = x.shape
        h = F.rms_norm(x, (d,), in_norm, eps)
        q = mm(h, wq).view(B, T, heads, hd)
        k = mm(h, wk).view(B, T, kv, hd)
        v = mm(h, wv).view(B, T, kv, hd)
        if q_norm is not None:
            q = F.rms_norm(q, (hd,), q_norm, eps)
            k = F.rms_norm(k, (hd,), k_norm, eps)
        q = rope(q, cos, sin).transpose(1, 2)
        k = rope(k, cos, sin).transpose(1, 2)
        v = v.transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + mm(o.transpose(1, 2).reshape(B, T, heads * hd), wo)
        g = F.rms_norm(x, (d,), post_norm, eps)
        if router is not None:
            return x + routed_experts(g.view(B * T, d), router, w1, w3, w2, moe[1], moe[3]).view(B, T, d)
        return x + mm(F.silu(mm(g, w_gate)) * mm(g, w_up), w_down)

    return block


def loss_fn(h, head, targets):
    logits = h @ head.t()
    return F.cross_entropy(logits.float(), targets)


def pcie_bandwidths(dev):
    """Pinned copies of 1 GiB each way, and both at once: GB/s."""
    n = 1 << 29
    hbuf = [torch.empty(n, dtype=torch.bfloat16, pin_memory=True) for _ in range(2)]
    dbuf = [torch.empty(n, dtype=torch.bfloat16, device=dev) for _ in range(2)]
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    def bw(fn, nbytes):
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        return 3 * nbytes / (time.perf_counter() - t0) / 1e9

    h2d = bw(lambda: dbuf[0].copy_(hbuf[0], non_blocking=True), 2 * n)
    d2h = bw(lambda: hbuf[1].copy_(dbuf[1], non_blocking=True), 2 * n)

    def both():
        with torch.cuda.stream(s1):
            dbuf[0].copy_(hbuf[0], non_blocking=True)
        with torch.cuda.stream(s2):
            hbuf[1].copy_(dbuf[1], non_blocking=True)

    duplex = bw(both, 4 * n)
    del hbuf, dbuf
    return h2d, d2h, duplex


def hf_model(name, a, device, liger):
    """transformers' model of the preset's sizes (random init, bf16, sdpa attention)."""
    import transformers

    vocab, d, layers, heads, kv, hd, inter, theta, eps, qk_norm, tied = a
    qwen = qk_norm  # Qwen3 is the preset with QK-norm
    if liger:
        import liger_kernel.transformers as lk

        (lk.apply_liger_kernel_to_qwen3 if qwen else lk.apply_liger_kernel_to_llama)()
    cls = transformers.Qwen3Config if qwen else transformers.LlamaConfig
    cfg = cls(vocab_size=vocab, hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
              num_key_value_heads=kv, head_dim=hd, intermediate_size=inter, rms_norm_eps=eps,
              tie_word_embeddings=tied, max_position_embeddings=max(40960, 2 * 32768), attention_bias=False,
              **({"rope_theta": theta} if int(transformers.__version__.split(".")[0]) < 5
                 else {"rope_parameters": {"rope_type": "default", "rope_theta": theta}}))
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16,
                                                              attn_implementation="sdpa")
    model.train()
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="Qwen/Qwen3-0.6B")
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--impl", choices=["own", "hf", "liger"], default="own",
                    help="the model: this file's (own), transformers' (hf), transformers' with Liger's kernels")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only to check that the script runs")
    ap.add_argument("--ac", action="store_true", help="checkpoint every block (torch.utils.checkpoint)")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--trace", help="write a Chrome trace of the last two steps (torch.profiler)")
    ap.add_argument("--layers", type=int, help="the model's first LAYERS blocks only (as model.debug.num_layers)")
    ap.add_argument("--float8", choices=["tensorwise", "rowwise", "rowwise_with_gw_hp"],
                    help="torchao's float8 training recipe on the block linears (--impl own, dense presets)")
    args = ap.parse_args()

    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if args.impl != "own" and (args.compile or args.ac):
        ap.error("--compile and --ac apply to --impl own")
    a = PRESETS[args.model]
    if args.layers:
        a = a[:2] + (args.layers,) + a[3:]
    moe = MOE.get(args.model)
    if moe and args.impl != "own":
        ap.error("the Qwen3-MoE presets run with --impl own")
    if args.float8 and (moe or args.impl != "own"):
        ap.error("--float8 applies to the dense presets with --impl own")
    vocab, d, layers, heads, kv, hd, inter, theta, eps, qk_norm, tied = a
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    if args.impl == "own":
        params, blocks = build(a, dev, moe)
        flat = list(params.values()) + [t for b in blocks for t in b.values()]
    else:
        model = hf_model(args.model, a, dev, args.impl == "liger")
        flat = list(model.parameters())
    masters = [p.detach().float().clone() for p in flat]
    opt = torch.optim.AdamW(masters, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, fused=True)

    block = make_block(a, moe, float8_matmul(args.float8, dev) if args.float8 else None)
    lossf = loss_fn
    if args.compile:
        block = torch.compile(block)
        lossf = torch.compile(loss_fn)

    B, T = args.batch, args.seq_len
    pos = torch.arange(T, device=dev)
    inv = theta ** (-torch.arange(0, hd, 2, device=dev, dtype=torch.float32) / hd)
    fr = pos.float()[:, None] * inv
    emb = torch.cat((fr, fr), -1)[None, :, None, :]
    cos, sin = emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)
    ids = (torch.arange(B * (T + 1), device=dev) % vocab).view(B, T + 1)  # fake data, increasing ids
    inp, tgt = ids[:, :-1], ids[:, 1:].reshape(-1)

    def fwd_bwd_hf():  # transformers shifts the labels itself
        loss = model(input_ids=inp, labels=inp).loss
        loss.backward()
        return loss

    def fwd_bwd_own():
        head = params.get("head", params["embed"])
        x = F.embedding(inp, params["embed"])
        for b in blocks:
            if args.ac:
                x = torch.utils.checkpoint.checkpoint(block, x, cos, sin, **b, use_reentrant=False)
            else:
                x = block(x, cos, sin, **b)
        h = F.rms_norm(x, (d,), params["norm"], eps).view(B * T, d)
        loss = lossf(h, head, tgt)
        loss.backward()
        return loss

    fwd_bwd = fwd_bwd_own if args.impl == "own" else fwd_bwd_hf
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def step():
        loss = fwd_bwd()
        for m, p in zip(masters, flat):
            m.grad = p.grad.float()
            p.grad = None
        opt.step()
        with torch.no_grad():
            torch._foreach_copy_(flat, masters)
        return loss

    times, fb_times, losses = [], [], []
    t_compile = time.perf_counter()
    total = args.warmup + args.steps
    prof = None
    for i in range(total):
        if args.trace and i == total - 2:
            prof = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        sync()
        t0 = time.perf_counter()
        losses.append(step().item())
        sync()
        if prof is not None and i == total - 1:
            prof.__exit__(None, None, None)
            prof.export_chrome_trace(args.trace)
        if i == 0:
            t_compile = time.perf_counter() - t_compile
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    # Forward + backward alone (the GPU compute of a step), a few times.
    for _ in range(3):
        sync()
        t0 = time.perf_counter()
        fwd_bwd()
        sync()
        fb_times.append(time.perf_counter() - t0)
        for p in flat:
            p.grad = None

    peak = torch.cuda.max_memory_allocated() if cuda else 0
    pcie = pcie_bandwidths(dev) if cuda else (None, None, None)

    rss = hwm = 0.0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = float(line.split()[1]) * 1024
            if line.startswith("VmHWM:"):
                hwm = float(line.split()[1]) * 1024
    med = statistics.median(times)
    tokens = B * T
    flops_tok = 6 * matmul_params(a, moe) + 12 * layers * heads * hd * T
    h2d, d2h, duplex = pcie
    impl = {"own": "pytorch-compile" if args.compile else "pytorch-eager", "hf": "hf-transformers",
            "liger": "hf-transformers-liger"}[args.impl] + (f"-float8-{args.float8}" if args.float8 else "")
    out = dict(
        impl=impl, model=args.model, seq_len=T, batch=B,
        ac=args.ac, step_time_s=med, step_times=times, tokens_per_s=tokens / med,
        mfu=tokens / med * flops_tok / 989e12, fwd_bwd_s=statistics.median(fb_times),
        peak_device_mem_gib=peak / 2**30, host_rss_gib=rss / 2**30,
        host_hwm_gib=hwm / 2**30, first_step_s=t_compile, loss_first=losses[0], loss_last=losses[-1],
        pcie_h2d_gbs=h2d, pcie_d2h_gbs=d2h, pcie_duplex_gbs=duplex, torch=torch.__version__,
        gpu=torch.cuda.get_device_name() if cuda else "cpu", params=sum(p.numel() for p in flat))
    if args.float8:
        import importlib.metadata

        out["torchao"] = importlib.metadata.version("torchao")
    if args.impl != "own":
        import transformers

        out["transformers"] = transformers.__version__
        if args.impl == "liger":
            import importlib.metadata

            out["liger_kernel"] = importlib.metadata.version("liger-kernel")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
