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
}


def matmul_params(a):
    vocab, d, layers, heads, kv, hd, inter = a[:7]
    per_block = d * heads * hd + 2 * d * kv * hd + heads * hd * d + 3 * d * inter
    return layers * per_block + vocab * d


def build(a, device):
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
    for _ in range(layers):
        b = dict(in_norm=ones(d), wq=w(heads * hd, d), wk=w(kv * hd, d), wv=w(kv * hd, d), wo=w(d, heads * hd),
                 post_norm=ones(d), w_gate=w(inter, d), w_up=w(inter, d), w_down=w(d, inter))
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


def make_block(a):
    vocab, d, layers, heads, kv, hd, inter, theta, eps, qk_norm, tied = a

    def block(x, cos, sin, in_norm, wq, wk, wv, wo, post_norm, w_gate, w_up, w_down, q_norm=None, k_norm=None):
        B, T, _ = x.shape
        h = F.rms_norm(x, (d,), in_norm, eps)
        q = (h @ wq.t()).view(B, T, heads, hd)
        k = (h @ wk.t()).view(B, T, kv, hd)
        v = (h @ wv.t()).view(B, T, kv, hd)
        if q_norm is not None:
            q = F.rms_norm(q, (hd,), q_norm, eps)
            k = F.rms_norm(k, (hd,), k_norm, eps)
        q = rope(q, cos, sin).transpose(1, 2)
        k = rope(k, cos, sin).transpose(1, 2)
        v = v.transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + o.transpose(1, 2).reshape(B, T, heads * hd) @ wo.t()
        g = F.rms_norm(x, (d,), post_norm, eps)
        return x + (F.silu(g @ w_gate.t()) * (g @ w_up.t())) @ w_down.t()

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
    args = ap.parse_args()

    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if args.impl != "own" and (args.compile or args.ac):
        ap.error("--compile and --ac apply to --impl own")
    a = PRESETS[args.model]
    vocab, d, layers, heads, kv, hd, inter, theta, eps, qk_norm, tied = a
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    if args.impl == "own":
        params, blocks = build(a, dev)
        flat = list(params.values()) + [t for b in blocks for t in b.values()]
    else:
        model = hf_model(args.model, a, dev, args.impl == "liger")
        flat = list(model.parameters())
    masters = [p.detach().float().clone() for p in flat]
    opt = torch.optim.AdamW(masters, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, fused=True)

    block = make_block(a)
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
    flops_tok = 6 * matmul_params(a) + 12 * layers * heads * hd * T
    h2d, d2h, duplex = pcie
    impl = {"own": "pytorch-compile" if args.compile else "pytorch-eager", "hf": "hf-transformers",
            "liger": "hf-transformers-liger"}[args.impl]
    out = dict(
        impl=impl, model=args.model, seq_len=T, batch=B,
        ac=args.ac, step_time_s=med, step_times=times, tokens_per_s=tokens / med,
        mfu=tokens / med * flops_tok / 989e12, fwd_bwd_s=statistics.median(fb_times),
        peak_device_mem_gib=peak / 2**30, host_rss_gib=rss / 2**30,
        host_hwm_gib=hwm / 2**30, first_step_s=t_compile, loss_first=losses[0], loss_last=losses[-1],
        pcie_h2d_gbs=h2d, pcie_d2h_gbs=d2h, pcie_duplex_gbs=duplex, torch=torch.__version__,
        gpu=torch.cuda.get_device_name() if cuda else "cpu", params=sum(p.numel() for p in flat))
    if args.impl != "own":
        import transformers

        out["transformers"] = transformers.__version__
        if args.impl == "liger":
            import importlib.metadata

            out["liger_kernel"] = importlib.metadata.version("liger-kernel")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
