"""The planner's step-time prediction against a run, row by row (docs/memory-planner.md).

Each row is "MODEL SEQ MODE [flags...]": the prediction is `primecfg-train --plan
--plan-format=json` of bench/trainer/fake.toml with those settings and the profile given
(--profile; default: the shipped one), the measurement the median step time of a run of
--steps steps (steps after the third), its spread (max - min) / median over those steps. Prints one line per row, and with --markdown a
table for docs. On the GPU machine, from the repository root:

  python3 bench/trainer/step_time_accuracy.py --bin BUILD/reference_trainer/primecfg-train \
      --profile h200.toml --out results "Qwen/Qwen3-0.6B 8192 none" "meta-llama/Llama-3.2-3B 8192 full"
"""

import argparse
import json
import os
import statistics
import subprocess
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--profile")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--timeout", type=int, default=400)
    ap.add_argument("--plan-only", action="store_true", help="predict, run nothing")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("rows", nargs="+")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    lines = []
    for n, row in enumerate(a.rows):
        model, seq, mode, *flags = row.split()
        cfg = ["@", "bench/trainer/fake.toml", f"--model.name={model}", f"--data.seq-len={seq}",
               f"--model.offload={mode}", *flags]
        prof = [f"--plan-profile={a.profile}"] if a.profile else []
        plan = subprocess.run([a.bin, "--plan", "--plan-format=json", *prof, *cfg], capture_output=True, text=True)
        if plan.returncode != 0:
            print(f"{row}: --plan failed: {plan.stderr.strip()}", file=sys.stderr)
            return 1
        p = json.loads(plan.stdout)
        m = next(x for x in p["modes"] if x["offload"] == mode)
        t = m["step_time"]
        measured, spread, rc = None, None, None
        if not a.plan_only:
            out = os.path.join(a.out, f"row{n}")
            try:
                r = subprocess.run([a.bin, *cfg, f"--max-steps={a.steps}", f"--output-dir={out}", "--clean"],
                                   capture_output=True, text=True, timeout=a.timeout)
                rc = r.returncode
                with open(os.path.join(a.out, f"row{n}.log"), "w") as f:
                    f.write(r.stderr)
            except subprocess.TimeoutExpired:
                rc = "timeout"
            try:
                rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
                times = [x["step_time_s"] for x in rows[3:]]
                measured = statistics.median(times) if times else None
                spread = (max(times) - min(times)) / measured if times else None
            except OSError:
                pass
        err = f"{100 * (t['step_s'] / measured - 1):+.1f}%" if measured else "-"
        meas = f"{measured:.4f} s" if measured else f"no run (rc {rc})" if rc is not None else "-"
        spr = f"{100 * spread:.1f}%" if spread is not None else "-"
        lines.append((model, seq, mode, " ".join(flags), t["step_s"], t["bound"], meas, spr, err))
        print(f"{row:<60} predicted {t['step_s']:.4f} s ({t['bound']}) measured {meas} (spread {spr}) "
              f"error {err}", flush=True)
    if a.markdown:
        print("\n| model | seq_len | mode | flags | predicted | bound | measured | spread | error |")
        print("|---|---:|---|---|---:|---|---:|---:|---:|")
        for model, seq, mode, fl, pred, bound, meas, spr, err in lines:
            print(f"| {model} | {seq} | `{mode}` | {fl} | {pred:.4f} s | {bound} | {meas} | {spr} | {err} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
