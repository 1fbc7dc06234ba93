#!/usr/bin/env python3
"""The offload pipeline's steps on one time axis: GPU streams and host threads.

    python3 bench/trainer/pipeline_timeline.py host.json [kineto.json] [--bin-ms 2]

host.json is what primecfg-train writes under --profile.host-trace (the CPU
worker's jobs and copy waits, the hooks, the main thread's phases); kineto.json,
optional, is the --profile.trace trace of the same run (its last two steps),
whose GPU kernels and copies this lays beside the host rows. Both carry Unix time
in microseconds (Kineto's relative to its baseTimeNanoseconds).

Per step it prints where the time went (GPU compute busy and idle, and how much of
the idle time the forward spent waiting for deferred CPU updates; the worker's
kernel, copy-wait and idle time) and one character per bin for each row:

  compute  # busy  . idle              copies  > host to device  < device to host  x both
  worker   K update  w waits for a gradient copy  . idle
  main     f queues the forward  W waits for deferred updates  b queues backward
           F finishes the step  r reads the loss back
  hooks    h a gradient hook runs
  upload   u the upload thread queues a weight upload
"""
import argparse
import collections
import json


def load(path):
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    base = data.get("baseTimeNanoseconds", 0) / 1000.0 if isinstance(data, dict) else 0.0
    xs = [e for e in events if e.get("ph") == "X" and "dur" in e]
    if xs and base and min(e["ts"] for e in xs) < base:  # Kineto: relative to its base time
        for e in xs:
            e["ts"] = float(e["ts"]) + base
    return xs


def busy_in(spans, t0, t1):
    """Length of the union of (start, end) spans clipped to [t0, t1)."""
    total, cur = 0.0, None
    for a, b in sorted((max(a, t0), min(b, t1)) for a, b in spans if b > t0 and a < t1):
        if cur is None or a > cur[1]:
            if cur:
                total += cur[1] - cur[0]
            cur = [a, b]
        else:
            cur[1] = max(cur[1], b)
    if cur:
        total += cur[1] - cur[0]
    return total


def row(t0, t1, bin_us, layers, idle="."):
    """One character per bin: the first layer (char, spans) that covers half the bin."""
    out = []
    t = t0
    while t < t1:
        c = idle
        for ch, spans in layers:
            if busy_in(spans, t, t + bin_us) >= bin_us / 2:
                c = ch
                break
        out.append(c)
        t += bin_us
    return "".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("host")
    ap.add_argument("kineto", nargs="?")
    ap.add_argument("--bin-ms", type=float, default=2.0)
    ap.add_argument("--steps", type=int, default=2, help="the last N steps (all with Kineto events, by default 2)")
    args = ap.parse_args()
    bin_us = args.bin_ms * 1000

    host = load(args.host)
    by_tid = collections.defaultdict(list)
    for e in host:
        by_tid[e["tid"]].append(e)
    starts = sorted(e["ts"] for e in by_tid["main"] if e["name"] == "queue forward")
    ends = sorted(e["ts"] + e["dur"] for e in by_tid["main"] if e["name"] == "read back")
    steps = []
    for s in starts:
        after = [t for t in ends if t > s]
        if after:
            steps.append((s, after[0]))

    compute, h2d, d2h = [], [], []
    if args.kineto:
        gpu = [e for e in load(args.kineto) if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        streams = collections.defaultdict(float)
        for e in gpu:
            if e["cat"] == "kernel":
                streams[e.get("args", {}).get("stream", -1)] += e["dur"]
        main_stream = max(streams, key=streams.get) if streams else None
        for e in gpu:
            span = (e["ts"], e["ts"] + e["dur"])
            if e["cat"] == "kernel" and e.get("args", {}).get("stream") == main_stream:
                compute.append(span)
            elif e["cat"] == "gpu_memcpy":
                (h2d if "HtoD" in e["name"] else d2h).append(span)
        if gpu:
            g0, g1 = min(e["ts"] for e in gpu), max(e["ts"] + e["dur"] for e in gpu)
            steps = [(a, b) for a, b in steps if b > g0 and a < g1] or steps
    steps = steps[-args.steps :]

    def spans(tid, pred=lambda name: True):
        return [(e["ts"], e["ts"] + e["dur"]) for e in by_tid[tid] if pred(e["name"])]

    wait = spans("worker", lambda n: n == "copy wait")
    jobs = spans("worker", lambda n: n != "copy wait")  # the jobs' spans hold those of their kernels
    kernels = spans("worker", lambda n: n == "kernel")
    slot_waits = spans("worker", lambda n: n == "upload slot wait")
    main_rows = [
        ("W", spans("main", lambda n: n.startswith("wait for block"))),
        ("f", spans("main", lambda n: n == "queue forward")),
        ("b", spans("main", lambda n: n == "queue backward")),
        ("F", spans("main", lambda n: n == "finish step")),
        ("r", spans("main", lambda n: n == "read back")),
    ]
    both = [(max(a0, b0), min(a1, b1)) for a0, a1 in h2d for b0, b1 in d2h if min(a1, b1) > max(a0, b0)]
    ms = lambda us: us / 1000.0
    for k, (t0, t1) in enumerate(steps):
        span = t1 - t0
        print(f"step {k + 1} of {len(steps)}: {ms(span):.1f} ms (forward queued -> loss read back), "
              f"{ms(bin_us):g} ms per character")
        if compute:
            gbusy = busy_in(compute, t0, t1)
            idle_spans = []
            t = t0
            for a, b in sorted(compute):
                if b <= t0 or a >= t1:
                    continue
                if a > t:
                    idle_spans.append((t, a))
                t = max(t, b)
            if t < t1:
                idle_spans.append((t, t1))
            waits = main_rows[0][1]
            idle_waiting = sum(busy_in(waits, a, b) for a, b in idle_spans)
            print(f"  GPU compute busy {ms(gbusy):.1f} ms, idle {ms(span - gbusy):.1f} ms "
                  f"({ms(idle_waiting):.1f} of it while the forward waits for deferred updates)")
        kbusy, kwait = busy_in(jobs, t0, t1), busy_in(wait, t0, t1)
        print(f"  CPU worker: updating {ms(kbusy):.1f} ms (in the kernels {ms(busy_in(kernels, t0, t1)):.1f}, "
              f"waiting for upload room {ms(busy_in(slot_waits, t0, t1)):.1f}), waiting for copies "
              f"{ms(kwait):.1f} ms, idle {ms(span - kbusy - kwait):.1f} ms")
        print(f"  forward waits for deferred updates {ms(busy_in(main_rows[0][1], t0, t1)):.1f} ms")
        if compute:
            print("  compute |" + row(t0, t1, bin_us, [("#", compute)]) + "|")
            print("  copies  |" + row(t0, t1, bin_us, [("x", both), (">", h2d), ("<", d2h)], idle=" ") + "|")
        print("  worker  |" + row(t0, t1, bin_us, [("K", jobs), ("w", wait)]) + "|")
        print("  main    |" + row(t0, t1, bin_us, main_rows, idle=" ") + "|")
        print("  hooks   |" + row(t0, t1, bin_us, [("h", spans("hooks"))], idle=" ") + "|")
        uploads = spans("upload")
        if uploads:
            print(f"  upload thread: queueing uploads {ms(busy_in(uploads, t0, t1)):.1f} ms")
            print("  upload  |" + row(t0, t1, bin_us, [("u", uploads)], idle=" ") + "|")


if __name__ == "__main__":
    main()
