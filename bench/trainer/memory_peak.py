#!/usr/bin/env python3
"""What is live on the GPU at a run's peak, by the code that allocated it.

    primecfg-train ... --profile.memory=run.mem.pickle        # on the GPU machine
    python3 bench/trainer/memory_peak.py run.mem.pickle [--top N] [--depth D] [--json OUT] [--backward]

Reads the CUDA caching allocator's snapshot that --profile.memory writes (the pickle of
torch.cuda.memory._snapshot(), readable by pytorch.org/memory_viz too), replays its
allocation trace, finds the moment the allocated bytes peaked (the figure metrics.jsonl's
peak and --plan's GPU peak are about) and lists the blocks live then, grouped by their
allocation site: the first D frames of primecfg's own code in each block's C++ stack.
Blocks allocated before the record began are not in the trace and are not counted (the
trainer starts the record before it loads the model, so there are none of its own).

--backward lists the peak of the backward passes instead: the highest the allocated bytes
reached at an allocation made by autograd's engine (a block's backward, its recompute, the
hooks that run in it). Where a run peaks at the end of its forward, this is the figure that
--plan's backward phases are about.
"""

import argparse
import collections
import json
import pickle
import sys

GiB = 1024**3


def site(frames, depth):
    """The allocation site: the innermost `depth` frames of primecfg's code, else of anything."""
    names = [short(f.get("name", "?")) for f in frames or []]
    ours = [n for n in names if n.startswith("primecfg::")]
    return " <- ".join((ours or names)[:depth]) or "(no stack)"


def short(name):
    """A C++ frame's qualified function name: no return type, template or argument lists."""
    name = name.replace("(anonymous namespace)::", "").replace("operator()", "operator_call")
    out, angle, paren = [], 0, 0
    for c in name:
        if c == "<" and not paren:
            angle += 1
        elif c == ">" and angle and not paren:
            angle -= 1
        elif c == "(":
            paren += 1
        elif c == ")" and paren:
            paren -= 1
        elif not angle and not paren:
            out.append(c)
    words = "".join(out).replace(" const", "").split()
    return (words[-1] if words else name).replace("operator_call", "operator()")


def in_backward(frames):
    """Whether an allocation was made by autograd's engine (torch::autograd::Engine)."""
    return any("autograd::Engine::" in f.get("name", "") for f in frames or [])


def peak_of(trace, counts=lambda e: True):
    """(peak bytes, index of the event that reached it, live blocks then: addr -> event),
    over the allocations for which counts(event) holds."""
    live, total = {}, 0
    best, best_at, best_live = -1, -1, {}
    for i, e in enumerate(trace):
        action = e.get("action")
        if action == "alloc":
            live[e["addr"]] = e
            total += e["size"]
            if total > best and counts(e):
                best, best_at = total, i
                best_live = dict(live)
        elif action == "free_requested" and e["addr"] in live:
            # The allocator's allocated_bytes drop when the block is freed, not when the
            # streams that used it are done with it (free_completed).
            total -= live.pop(e["addr"])["size"]
    return best, best_at, best_live


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("snapshot")
    ap.add_argument("--top", type=int, default=25, help="sites to list (25)")
    ap.add_argument("--depth", type=int, default=2, help="frames of primecfg's code that name a site (2)")
    ap.add_argument("--json", help="write the sites at the peak here as JSON as well")
    ap.add_argument("--backward", action="store_true", help="the peak of the backward passes (see above)")
    args = ap.parse_args()
    with open(args.snapshot, "rb") as f:
        snap = pickle.load(f)
    traces = snap.get("device_traces") or []
    if not any(traces):
        sys.exit(f"{args.snapshot}: no allocation trace (was the run made with --profile.memory?)")
    for device, trace in enumerate(traces):
        if not trace:
            continue
        peak, at, live = peak_of(trace, (lambda e: in_backward(e.get("frames"))) if args.backward else
                                 (lambda e: True))
        if at < 0:
            sys.exit(f"{args.snapshot}: no allocation by autograd's engine in the trace")
        sites = collections.defaultdict(lambda: [0, 0])
        for e in live.values():
            s = sites[site(e.get("frames"), args.depth)]
            s[0] += e["size"]
            s[1] += 1
        ranked = sorted(sites.items(), key=lambda kv: -kv[1][0])
        what = "backward peak" if args.backward else "peak"
        print(f"device {device}: {what} {peak / GiB:.3f} GiB allocated at event {at} of {len(trace)}, "
              f"{len(live)} blocks live in {len(sites)} sites")
        for name, (size, count) in ranked[: args.top]:
            print(f"  {size / GiB:8.3f} GiB {count:6d} blocks  {name}")
        rest = sum(v[0] for _, v in ranked[args.top :])
        if rest:
            print(f"  {rest / GiB:8.3f} GiB in the other {len(ranked) - args.top} sites")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": device, "peak_bytes": peak,
                           "sites": [{"site": n, "bytes": b, "blocks": c} for n, (b, c) in ranked]}, f, indent=1)


if __name__ == "__main__":
    main()
