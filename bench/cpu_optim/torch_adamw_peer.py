#!/usr/bin/env python3
"""Peer for bench_cpu_optim: the same optimizer update done with torch.optim.AdamW(fused=True) on CPU.

The FullOffload update takes a bf16 gradient and must leave a bf16 copy of the new weights. With
torch that is three steps: cast the bf16 gradient into the fp32 .grad, run the fused AdamW step on
the fp32 master weights and moments, and cast the fp32 weights to the bf16 buffer. The script times
that whole path ("torch_adamw_path") and, for reference, the fused step alone on fp32 data
("torch_adamw_fused_only"). It prints one line per measurement:

    RESULT <name> <threads> <median seconds per step>

Usage: torch_adamw_peer.py --n N --threads 1,2,4 [--iters K] [--warmup W]
"""
import argparse
import statistics
import sys
import time

import torch


def median_seconds(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--threads", type=str, required=True)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    n = args.n

    print(
        f"torch {torch.__version__}, cpu capability {torch.backends.cpu.get_cpu_capability()}",
        file=sys.stderr,
    )
    # Same starting values as the C++ side (no denormals, moments in a realistic range).
    idx = torch.arange(n, dtype=torch.int64)
    x = ((idx * 2654435761) % 1000).to(torch.float32) * 1e-3 - 0.5
    param = torch.nn.Parameter(0.02 * x)
    grad_bf16 = (1e-3 * x + 1e-4).to(torch.bfloat16)
    weight_bf16 = torch.empty(n, dtype=torch.bfloat16)
    del x, idx
    param.grad = torch.empty(n, dtype=torch.float32)
    opt = torch.optim.AdamW([param], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, fused=True)
    # Create the optimizer state (exp_avg, exp_avg_sq) before timing.
    param.grad.copy_(grad_bf16)
    opt.step()
    st = opt.state[param]
    st["exp_avg_sq"].fill_(1e-6)

    def full_path():
        param.grad.copy_(grad_bf16)  # bf16 -> fp32 cast into the existing .grad
        opt.step()
        with torch.no_grad():
            weight_bf16.copy_(param)  # fp32 -> bf16 cast into the upload buffer

    def fused_only():
        opt.step()

    for t in [int(s) for s in args.threads.split(",") if s]:
        torch.set_num_threads(t)
        s = median_seconds(full_path, args.warmup, args.iters)
        print(f"RESULT torch_adamw_path {t} {s:.9f}", flush=True)
        s = median_seconds(fused_only, args.warmup, args.iters)
        print(f"RESULT torch_adamw_fused_only {t} {s:.9f}", flush=True)


if __name__ == "__main__":
    main()
