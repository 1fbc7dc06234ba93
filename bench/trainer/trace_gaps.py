#!/usr/bin/env python3
"""Where the compute stream waits, from a Kineto / torch.profiler Chrome trace.

    python3 bench/trainer/trace_gaps.py trace.json [--min-ms 0.3] [--top 15]

trace_summary.py says how much GPU time each kind of kernel takes; this says when
the stream that runs the model (the one with the most kernel time) sits idle, for
how long, and what was going on meanwhile: copies on the other streams, and the
longest host-side CUDA runtime calls and operators that overlap the gap. A gap
with a host `cudaStreamSynchronize` or a pageable `cudaMemcpyAsync` in it is the
host holding the GPU back; a gap with only copies in it is a cross-stream wait.
"""
import argparse
import collections
import json

from trace_summary import short, union_length as union  # same folder


def overlap(a0, a1, b0, b1):
    return max(0.0, min(a1, b1) - max(a0, b0))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--min-ms", type=float, default=0.3, help="smallest gap listed")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--steps", type=int, default=2, help="steps in the trace")
    args = ap.parse_args()

    with open(args.trace) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    xs = [e for e in events if e.get("ph") == "X" and "dur" in e]
    gpu = [e for e in xs if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    host_rt = [e for e in xs if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    host_ops = [e for e in xs if e.get("cat") in ("cpu_op", "user_annotation")]
    if not gpu:
        print(f"{args.trace}: no GPU events")
        return

    by_stream = collections.defaultdict(list)
    for e in gpu:
        by_stream[e.get("args", {}).get("stream", -1)].append(e)
    kernel_time = {s: sum(e["dur"] for e in es if e["cat"] == "kernel") for s, es in by_stream.items()}
    compute = max(kernel_time, key=kernel_time.get)
    t0 = min(e["ts"] for e in gpu)
    t1 = max(e["ts"] + e["dur"] for e in gpu)
    per = lambda us: us / 1000.0 / args.steps

    print(f"== {args.trace}")
    print(f"GPU span {per(t1 - t0):.1f} ms per step; streams (busy ms per step, kernels, copies):")
    for s, es in sorted(by_stream.items(), key=lambda kv: -union((e["ts"], e["ts"] + e["dur"]) for e in kv[1])):
        busy = union((e["ts"], e["ts"] + e["dur"]) for e in es)
        copies = [e for e in es if e["cat"] != "kernel"]
        nbytes = sum(e.get("args", {}).get("bytes", 0) for e in copies)
        mark = "  <- compute" if s == compute else ""
        print(f"  stream {s}: busy {per(busy):7.1f}, {sum(1 for e in es if e['cat'] == 'kernel') / args.steps:6.0f} "
              f"kernels, {len(copies) / args.steps:5.0f} copies ({nbytes / args.steps / 2**30:.2f} GiB){mark}")

    cs = sorted(by_stream[compute], key=lambda e: e["ts"])
    gaps = []
    for a, b in zip(cs, cs[1:]):
        g0, g1 = a["ts"] + a["dur"], b["ts"]
        if g1 - g0 >= args.min_ms * 1000:
            gaps.append((g1 - g0, g0, g1, a, b))
    total_gap = sum(g[0] for g in gaps)
    print(f"compute stream idle in gaps >= {args.min_ms} ms: {per(total_gap):.1f} ms per step in "
          f"{len(gaps) / args.steps:.0f} gaps")

    others = [e for s, es in by_stream.items() if s != compute for e in es]
    why = collections.Counter()
    for length, g0, g1, a, b in sorted(gaps, key=lambda g: -g[0])[: args.top]:
        print(f"  {length / 1000:7.2f} ms at +{(g0 - t0) / 1000:8.2f} ms  after {short(a['name'])} "
              f"-> before {short(b['name'])}")
        cp = [e for e in others if overlap(g0, g1, e["ts"], e["ts"] + e["dur"]) > 0]
        if cp:
            kinds = collections.Counter(f"stream {e.get('args', {}).get('stream')} {short(e['name'])}" for e in cp)
            print("      other streams: " + ", ".join(f"{k} x{n}" for k, n in kinds.most_common(3)))
        rt = sorted((e for e in host_rt if overlap(g0, g1, e["ts"], e["ts"] + e["dur"]) > 0.2 * (g1 - g0)),
                    key=lambda e: -e["dur"])[:3]
        if rt:
            print("      host runtime: " + ", ".join(f"{e['name']} {e['dur'] / 1000:.2f} ms" for e in rt))
        ops = sorted((e for e in host_ops if overlap(g0, g1, e["ts"], e["ts"] + e["dur"]) > 0.5 * (g1 - g0)),
                     key=lambda e: e["dur"])[:3]
        if ops:
            print("      host ops: " + ", ".join(f"{e['name']} {e['dur'] / 1000:.2f} ms" for e in ops))
    for length, g0, g1, a, b in gaps:
        rt = [e["name"] for e in host_rt if overlap(g0, g1, e["ts"], e["ts"] + e["dur"]) > 0.5 * (g1 - g0)]
        why[rt[0] if rt else "(no long host call: cross-stream wait or launch gap)"] += length
    print("gap time by the host call spanning most of it (ms per step):")
    for k, us in why.most_common(8):
        print(f"  {per(us):7.2f}  {k}")


if __name__ == "__main__":
    main()
