#!/usr/bin/env python3
"""Where the GPU time of a step goes, from Chrome traces of torch.profiler / Kineto.

    python3 bench/trainer/trace_summary.py ours.json peer.json [--top 25]

For each trace (two steps each, see profile_gpu.sh): the wall span of GPU activity, the
time at least one GPU kernel or copy runs (busy), the idle rest, kernel launches, and
GPU time by kind of kernel and by kernel name, per step. Kernel names are shortened to
their function name, so template instantiations of one kernel add up.
"""
import argparse
import collections
import json
import re

KINDS = [  # first match wins
    ("GEMM", r"gemm|cutlass|nvjet|sm90_xmma|cublas|splitK"),
    ("attention", r"flash|fmha|attention|sdpa|cudnn"),
    ("optimizer", r"multi_tensor|adam|foreach"),
    ("cross-entropy / softmax", r"softmax|nll|cross_entropy|log_softmax"),
    ("norm", r"norm|rsqrt"),
    ("reduction", r"reduce|sum_kernel|norm_kernel"),
    ("copy / cast", r"copy|cast|Memcpy|Memset|fill|unrolled_elementwise_kernel<.*direct_copy"),
    ("elementwise", r"elementwise|vectorized|unrolled"),
]


def short(name):
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\(.*$", "", name)
    name = re.sub(r"<.*$", "", name)
    return name.split("::")[-1][:70]


def kind_of(name):
    for kind, pattern in KINDS:
        if re.search(pattern, name, re.IGNORECASE):
            return kind
    return "other"


def load(path):
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    return gpu


def union_length(intervals):
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def summarize(path, steps, top):
    gpu = load(path)
    if not gpu:
        print(f"{path}: no GPU events")
        return {}
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in gpu]
    start = min(a for a, _ in spans)
    end = max(b for _, b in spans)
    busy = union_length(spans)
    by_kind = collections.Counter()
    by_name = collections.Counter()
    count = collections.Counter()
    for e in gpu:
        name = e["name"] if e["cat"] == "kernel" else e["cat"]
        by_kind[kind_of(name) if e["cat"] == "kernel" else "copy / cast"] += e["dur"]
        by_name[short(name)] += e["dur"]
        count[short(name)] += 1
    kernels = sum(1 for e in gpu if e["cat"] == "kernel")
    ms = lambda us: us / 1000.0 / steps
    print(f"== {path}")
    print(f"per step: GPU span {ms(end - start):.1f} ms, busy {ms(busy):.1f} ms, "
          f"idle {ms(end - start - busy):.1f} ms, {kernels / steps:.0f} kernels, "
          f"{sum(1 for e in gpu if e['cat'] != 'kernel') / steps:.0f} copies/memsets")
    for kind, us in by_kind.most_common():
        print(f"  {kind:<26} {ms(us):8.2f} ms")
    print(f"  top {top} by GPU time (ms per step, launches per step):")
    for name, us in by_name.most_common(top):
        print(f"    {ms(us):8.2f}  {count[name] / steps:6.0f}  {name}")
    return {"span": ms(end - start), "busy": ms(busy), "kinds": {k: ms(v) for k, v in by_kind.items()}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--steps", type=int, default=2, help="steps in each trace")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    results = [summarize(t, args.steps, args.top) for t in args.traces]
    if len(results) == 2 and all(results):
        a, b = results
        print(f"== {args.traces[0]} minus {args.traces[1]} (ms per step)")
        print(f"  span {a['span'] - b['span']:+.2f}, busy {a['busy'] - b['busy']:+.2f}")
        for k in sorted(set(a["kinds"]) | set(b["kinds"])):
            print(f"  {k:<26} {a['kinds'].get(k, 0) - b['kinds'].get(k, 0):+8.2f}")


if __name__ == "__main__":
    main()
