#!/usr/bin/env python3
"""FP8 against bf16 in loss (issue 51 item 3): the two runs' metrics.jsonl drawn as loss
curves, and the largest relative gap over a window of steps (a single step is noisy).

    python3 bench/trainer/fp8_curve.py BF16_METRICS FP8_METRICS --out docs/img/fp8-loss.png [--window 20]

Prints one line per run (steps, first and last loss) and the gap; the plot needs matplotlib.
"""
import argparse
import json


def losses(path):
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r["step"] for r in rows if "loss" in r], [r["loss"] for r in rows if "loss" in r]


def smoothed(values, window):
    out = []
    for i in range(len(values)):
        part = values[max(0, i - window + 1) : i + 1]
        out.append(sum(part) / len(part))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bf16")
    ap.add_argument("fp8")
    ap.add_argument("--out")
    ap.add_argument("--window", type=int, default=20)
    # The stated tolerance (docs/design/fp8.md): what the format alone cost a CPU model
    # (0.5 to 0.7%), with room for the bf16 compute around the linears.
    ap.add_argument("--tolerance", type=float, default=0.02)
    a = ap.parse_args()
    (s1, l1), (s2, l2) = losses(a.bf16), losses(a.fp8)
    n = min(len(l1), len(l2))
    if n == 0 or s1[:n] != s2[:n]:
        raise SystemExit("the two runs do not share their steps")
    for name, s, l in (("bf16", s1, l1), ("fp8", s2, l2)):
        print(f"{name}: steps {s[0]}..{s[-1]}, loss {l[0]:.4f} -> {l[-1]:.4f}")
    m1, m2 = smoothed(l1[:n], a.window), smoothed(l2[:n], a.window)
    gaps = [abs(x - y) / x for x, y in zip(m1, m2)]
    first = min(a.window - 1, n - 1)  # the first step with a whole window behind it
    worst = max(range(first, n), key=lambda i: gaps[i])
    print(f"largest relative gap of the {a.window}-step means: {gaps[worst]:.4f} (step {s1[worst]}); "
          f"at the end {gaps[-1]:.4f}; within the tolerance {a.tolerance}: {'yes' if gaps[worst] <= a.tolerance else 'NO'}")
    if a.out:
        try:
            import matplotlib
        except ImportError:
            print(f"no matplotlib here: {a.out} not drawn (the metrics files draw it anywhere with it)")
            return

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(s1[:n], l1[:n], color="tab:blue", alpha=0.25, linewidth=0.8)
        ax.plot(s2[:n], l2[:n], color="tab:orange", alpha=0.25, linewidth=0.8)
        ax.plot(s1[:n], m1, color="tab:blue", label=f"bf16 ({a.window}-step mean)")
        ax.plot(s2[:n], m2, color="tab:orange", label=f"FP8 ({a.window}-step mean)")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.out, dpi=120)
        print(f"wrote {a.out}")
    if gaps[worst] > a.tolerance:
        raise SystemExit(1)


main()
