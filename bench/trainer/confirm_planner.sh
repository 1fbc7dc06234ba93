#!/usr/bin/env bash
# The memory planner against real runs, on the GPU machine, from the repository root:
#
#   bash bench/trainer/confirm_planner.sh
#
# For each row (model, sequence length, offload mode, activation checkpointing) it asks
# `primecfg-train --plan --plan-format=json` for the predicted peak of allocated GPU
# memory and whether the row fits, then trains a few steps and reads the measured peak
# from metrics.jsonl, or the out-of-memory report when the run does not fit. The rows
# are chosen around the edge: the largest preset each mode can train on this GPU
# (Meta-Llama-3-8B at 8192 tokens fits `optimizer` and `full` but not `none`), and
# activation checkpointing, which the main benchmark does not run.
#
# Environment: PRIMECFG_BIN  folder with a prebuilt primecfg-train (else build-bench is built)
#              PY            python3 with torch (default /opt/torch/.venv/bin/python3)
#              RESULTS       results folder (default outputs/confirm-planner)
#              ROWS          "model:seq:mode:ac[:flags] ..." (ac = ac, noac, or selective: the routed
#                            experts recomputed; flags: more primecfg-train flags, comma-separated,
#                            e.g. --model.debug.num-layers=4 to cut a model to its first blocks)
#              BUDGET_S      seconds for all rows; rows that would not fit are skipped (420)
#              ROW_MIN_S     a row starts only with this many seconds of the budget left (150);
#                            each runs at most 240 s and never past the budget
#              PLAN_PROFILE  a machine profile for --plan (--plan-profile; else the shipped one)
#
# Host memory: the plan's host peak of the row's mode against the process's resident
# peak (VmHWM, peak_host_mem_gib in metrics.jsonl) over the whole run, startup included.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
RES=${RESULTS:-$ROOT/outputs/confirm-planner}
BUDGET=${BUDGET_S:-420}
START=$(date +%s)
mkdir -p "$RES"
left() { echo $((BUDGET - ($(date +%s) - START))); }

source bench/trainer/gpu_env.sh

ROWS=${ROWS:-"meta-llama/Meta-Llama-3-8B:8192:none:noac meta-llama/Meta-Llama-3-8B:8192:optimizer:noac
  meta-llama/Meta-Llama-3-8B:8192:full:noac meta-llama/Llama-3.2-3B:8192:none:ac
  Qwen/Qwen3-0.6B:32768:none:ac"}
GPU_GIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | awk '{printf "%.2f", $1 / 1024}')
echo "== GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $GPU_GIB GiB"

table=$RES/table.md
{
  echo "| model | seq | mode | ac | planner: fits (GPU, host) | predicted peak (GiB) | measured peak (GiB) | error | host: predicted peak (GiB) | host: measured VmHWM (GiB) | host error | predicted step (s) | step (s) | time error | outcome |"
  echo "| --- | ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
} >"$table"

for row in $ROWS; do
  IFS=: read -r model seq mode ac flags <<<"$row"
  name=$(echo "$model-$seq-$mode-$ac${flags:+-$flags}" | tr '/,=' '___' | tr -d '-' | cut -c1-120)
  args=(@ bench/trainer/fake.toml --model.name="$model" --model.offload="$mode" --data.seq-len="$seq"
        --max-steps="${STEPS:-5}" --output-dir="$RES/$name")
  [ "$ac" = ac ] && args+=(--model.ac)
  [ "$ac" = selective ] && args+=(--model.ac.mode=selective '--model.ac.targets=["routed_experts"]')
  IFS=, read -r -a extra <<<"${flags:-}"
  args+=("${extra[@]}")
  # The run gets the profile too: optimizer's pipeline (deferral, its window) is chosen by
  # the profile's step times, so a plan and a run with different profiles can plan one
  # window and run another.
  # (A run reads it for that choice only, and refuses it in the other modes.)
  prof=()
  [ -n "${PLAN_PROFILE:-}" ] && prof=(--plan-profile="$PLAN_PROFILE")
  [ "$mode" = optimizer ] && args+=("${prof[@]}") && prof=()
  "$TRAIN" "${args[@]}" "${prof[@]}" --plan --plan-format=json --plan-gpu-memory="$GPU_GIB" \
    >"$RES/$name.plan.json" 2>"$RES/$name.plan.err"
  read -r predicted fits host_predicted step_predicted < <("$PY" - "$RES/$name.plan.json" "$mode" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
row = next(m for m in plan["modes"] if m["offload"] == sys.argv[2])
yn = lambda b: "yes" if b else "no"
step = (row.get("step_time") or {}).get("step_s")
print(f'{float(row["gpu"]["peak_gib"]):.2f}', f'GPU:{yn(row["gpu"]["fits"])},host:{yn(row["host"]["fits"])}',
      f'{row["host"]["peak_bytes"] / 2**30:.2f}', f'{step:.4f}' if step else "-")
PY
  )
  if [ "$(left)" -lt "${ROW_MIN_S:-150}" ]; then
    echo "SKIP $name (budget)"
    continue
  fi
  t0=$(date +%s)
  cap=$(left)
  [ "$cap" -gt 240 ] && cap=240
  timeout "$cap" "$TRAIN" "${args[@]}" >"$RES/$name.log" 2>&1
  rc=$?
  echo "$name: rc=$rc, $(($(date +%s) - t0)) s, predicted $predicted GiB, planner fits: $fits"
  "$PY" - "$RES/$name" "$rc" "$model" "$seq" "$mode" "$ac" "$fits" "$predicted" "$RES/$name.log" "$host_predicted" \
    "$step_predicted" "${flags:-}" >>"$table" <<'PY'
import json, os, sys
out, rc, model, seq, mode, ac, fits, predicted, log, host_predicted, step_predicted, flags = sys.argv[1:]
rows = []
path = os.path.join(out, "metrics.jsonl")
if os.path.exists(path):
    rows = [json.loads(l) for l in open(path) if l.strip().startswith("{")]
measured = max((r["peak_device_mem_gib"] for r in rows), default=None)
hwm = max((r["peak_host_mem_gib"] for r in rows), default=None)
# The median of the steps after the third (the first ones warm the allocator and kernels).
later = [r["step_time_s"] for r in rows[3:]] or [r["step_time_s"] for r in rows[1:]]
step = sorted(later)[len(later) // 2] if later else None
text = open(log, errors="replace").read()
if rc == "0":
    outcome = f"trained {len(rows)} steps"
elif "out of memory" in text.lower():
    outcome = "out of GPU memory (reported)"
else:
    outcome = f"exit {rc}"
err = f"{100 * (float(predicted) - measured) / measured:+.1f}%" if measured else ""
host_err = (f"{100 * (float(host_predicted) - hwm) / hwm:+.1f}% ({float(host_predicted) - hwm:+.2f} GiB)"
            if hwm else "")
fmt = lambda v, f: f.format(v) if v is not None else ""
time_err = f"{100 * (float(step_predicted) - step) / step:+.1f}%" if step and step_predicted != "-" else ""
ac_text = {"ac": "on", "selective": "selective (routed_experts)"}.get(ac, "off")
what = model + (f" ({flags.replace(',', ' ')})" if flags else "")
print(f"| {what} | {seq} | `{mode}` | {ac_text} | {fits} | {predicted} | "
      f"{fmt(measured, '{:.2f}')} | {err} | {host_predicted} | {fmt(hwm, '{:.2f}')} | {host_err} | "
      f"{step_predicted} | {fmt(step, '{:.4f}')} | {time_err} | {outcome} |")
PY
  grep -iE "out of memory|planner|predict" "$RES/$name.log" | head -4
done
cat "$table"
if [ -n "${OUT:-}" ]; then
  cp "$table" "$OUT/planner-table.md"
  tar czf "$OUT/confirm-planner.tar.gz" --exclude=checkpoints -C "$(dirname "$RES")" "$(basename "$RES")"
fi
echo "total $(($(date +%s) - START)) s"
