#!/usr/bin/env python3
"""Where a CUDA graph's capture put its memory, from a --profile.memory record.

    primecfg-train ... --cuda-graph --profile.memory=cap.pickle   # on the GPU machine
    python3 bench/trainer/capture_memory.py cap.pickle

A capture allocates from a private pool of the caching allocator, and the pool's free
blocks serve only requests of the same stream (docs/trainer.md, "CUDA graph"). This lists
(1) the segments still held when the record was written, by pool and stream, with the
allocation sites of their live blocks, and (2) the allocation trace from the last segment
the allocator handed back (the capture empties the cache before it begins) to the first
out-of-memory event, or to the end: per stream, the segments mapped and the bytes
allocated, freed and still live then, and the sizes of the segments mapped. A capture that
ran out of memory with free blocks in its pool shows here which stream held them and which
one asked.
"""

import argparse
import collections
import pickle
import sys

from memory_peak import site

GiB = 1024**3


def held_segments(snap, depth, top):
    pools = collections.defaultdict(lambda: [0, 0, 0])  # reserved, allocated, segments
    sites = collections.Counter()
    for seg in snap.get("segments", []):
        key = f'pool {seg.get("segment_pool_id")} stream {seg.get("stream")}'
        p = pools[key]
        p[0] += seg["total_size"]
        p[1] += seg["allocated_size"]
        p[2] += 1
        for b in seg.get("blocks", []):
            if b["state"].startswith("active"):
                sites[(key, site(b.get("frames"), depth))] += b["size"]
    print("segments held when the record was written:")
    for key, (reserved, allocated, n) in pools.items():
        print(f"  {key}: {n} segments, {reserved / GiB:.3f} GiB reserved, {allocated / GiB:.3f} GiB allocated")
    for (key, name), size in sites.most_common(top):
        print(f"    {size / GiB:8.3f} GiB  {key}  {name}")


def capture_window(trace):
    actions = [e.get("action") for e in trace]
    end = next((i for i, a in enumerate(actions) if a == "oom"), len(trace))
    frees = [i for i, a in enumerate(actions[:end]) if a == "segment_free"]
    start = frees[-1] + 1 if frees else 0
    oom = trace[end] if end < len(trace) else None
    print(f"trace from event {start} (after the last segment handed back) to {end} of {len(trace)}")
    if oom:
        print(f"  out of memory: {oom.get('size', 0) / 2**20:.1f} MiB asked on stream {oom.get('stream')}, "
              f"{oom.get('device_free', 0) / 2**20:.1f} MiB free on the device")
    per = collections.defaultdict(collections.Counter)
    live = {}
    segment_sizes = collections.Counter()
    for e in trace[start:end]:
        a, stream, size = e.get("action"), e.get("stream"), e.get("size", 0)
        if a == "segment_alloc":
            per[stream]["segments mapped"] += size
            segment_sizes[size >> 20] += 1
        elif a == "alloc":
            per[stream]["allocated"] += size
            live[e["addr"]] = (stream, size)
        elif a == "free_requested":
            per[stream]["freed"] += size
            live.pop(e["addr"], None)
    for stream, c in per.items():
        held = sum(s for st, s in live.values() if st == stream)
        parts = ", ".join(f"{k} {v / GiB:.2f} GiB" for k, v in c.items())
        print(f"  stream {stream}: {parts}, live at the end {held / GiB:.2f} GiB")
    print("  segments mapped (MiB x count):", ", ".join(f"{m} x {n}" for m, n in sorted(segment_sizes.items())))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("snapshot")
    ap.add_argument("--top", type=int, default=20, help="allocation sites to list (20)")
    ap.add_argument("--depth", type=int, default=3, help="frames of primecfg's code that name a site (3)")
    args = ap.parse_args()
    with open(args.snapshot, "rb") as f:
        snap = pickle.load(f)
    held_segments(snap, args.depth, args.top)
    traces = [t for t in snap.get("device_traces") or [] if t]
    if not traces:
        sys.exit(f"{args.snapshot}: no allocation trace (was the run made with --profile.memory?)")
    for trace in traces:
        capture_window(trace)


if __name__ == "__main__":
    main()
