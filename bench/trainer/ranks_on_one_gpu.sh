#!/usr/bin/env bash
# Each rank's GPU memory in a sharded (FSDP) run, measured on a machine with one GPU,
# against the planner's per-rank prediction. From the repository root:
#
#   bash bench/trainer/ranks_on_one_gpu.sh
#
# Every rank of a row runs on the same GPU (--device=cuda:0) with Gloo's collectives
# (--dist.backend=gloo: NCCL refuses two ranks on one device). Gloo moves each
# collective through host memory, so the steps are slow, but each rank is its own
# process with its own CUDA caching allocator: its peak is what it would allocate
# on a GPU of its own. The global batch is one 8192-token sample per rank.
#
# For each row (model, sequence length, mode, activation checkpointing, ranks) it asks
# `--plan --plan-format=json --plan-world-size=N` for the per-rank peak, skips a row
# whose ranks would not fit the GPU together (the planner's per-rank total, context
# included, x N against the GPU, as the run's own memory check does; or the node's host
# memory), trains STEPS steps and reads every rank's peak from rank 0's metrics.jsonl
# (`peak_device_mem_gib_ranks`).
#
# Environment: ROWS      "model:seq:mode:ac:ranks[:flags] ..." (ac = ac or noac; flags: more
#                        options, comma-separated, e.g. --model.ep=2,--model.debug.num-layers=4)
#              STEPS     steps per row (3)
#              BUDGET_S  seconds for all rows; later rows are skipped (540)
#              MEMORY    1: every rank records its GPU allocations (--profile.memory) and
#                        bench/trainer/memory_peak.py lists what each had live at its
#                        peak and at the peak of its backward, beside the plan's terms
#                        of its peak's phase and of its largest backward phase (the file
#                        <row>.sites.txt); the record slows the steps
#              PLAN_PROFILE  a machine profile (--plan-profile) for the plan, and for the
#                        run in `optimizer`, where it chooses the pipeline by it (as
#                        confirm_planner.sh does), so that both choose the same window
#              PY, PRIMECFG_BIN, RESULTS as in gpu_env.sh
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
RES=${RESULTS:-$ROOT/outputs/ranks-on-one-gpu}
BUDGET=${BUDGET_S:-540}
STEPS=${STEPS:-3}
START=$(date +%s)
mkdir -p "$RES"
left() { echo $((BUDGET - ($(date +%s) - START))); }

source bench/trainer/gpu_env.sh

ROWS=${ROWS:-"meta-llama/Llama-3.2-3B:8192:none:ac:2 meta-llama/Llama-3.2-3B:8192:optimizer:ac:4
  meta-llama/Llama-3.2-3B:8192:full:ac:8 meta-llama/Meta-Llama-3-8B:8192:optimizer:ac:4"}
GPU_GIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | awk '{printf "%.2f", $1 / 1024}')
echo "== GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $GPU_GIB GiB"

table=$RES/table.md
{
  echo "| model | seq | mode | ac | ranks | flags | predicted per rank (GiB) | measured, each rank (GiB) | error (largest rank) | step (s) | outcome |"
  echo "| --- | ---: | --- | --- | ---: | --- | ---: | --- | ---: | ---: | --- |"
} >"$table"

for row in $ROWS; do
  IFS=: read -r model seq mode ac ranks flags <<<"$row"
  flags=${flags:-}
  name=$(echo "$model-$seq-$mode-$ac-$ranks${flags:+-$flags}" | tr '/,=' '___' | tr -d '-' | cut -c1-120)
  args=(@ bench/trainer/fake.toml --model.name="$model" --model.offload="$mode" --data.seq-len="$seq"
        --data.batch-size="$ranks" --max-steps="$STEPS" --output-dir="$RES/$name")
  [ "$ac" = ac ] && args+=(--model.ac)
  [ -n "$flags" ] && IFS=, read -r -a extra <<<"$flags" && args+=("${extra[@]}")
  prof=()
  [ -n "${PLAN_PROFILE:-}" ] && prof=(--plan-profile="$PLAN_PROFILE")
  [ "$mode" = optimizer ] && args+=("${prof[@]}") && prof=()
  "$TRAIN" "${args[@]}" "${prof[@]}" --dist.backend=gloo --plan --plan-format=json --plan-world-size="$ranks" --plan-ranks-per-node="$ranks" \
    --plan-gpu-memory="$GPU_GIB" >"$RES/$name.plan.json" 2>"$RES/$name.plan.err"
  read -r predicted together host_fits < <("$PY" - "$RES/$name.plan.json" "$mode" "$ranks" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
row = next(m for m in plan["modes"] if m["offload"] == sys.argv[2])
gib = row["gpu"]["peak_bytes"] / 2**30
total = row["gpu"]["total_bytes"] / 2**30  # + CUDA context and allocator slack, as the run's memory check
print(f"{gib:.3f}", f"{total * int(sys.argv[3]):.1f}", "yes" if row["host"]["fits"] else "no")
PY
  )
  if awk -v t="$together" -v g="$GPU_GIB" 'BEGIN { exit !(t > g) }' || [ "$host_fits" = no ]; then
    echo "| $model | $seq | \`$mode\` | ${ac/noac/off} | $ranks | ${flags//,/ } | $predicted | | | | skipped: $ranks ranks need $together GiB of GPU together, host fits: $host_fits |" >>"$table"
    echo "SKIP $name (together $together GiB, host fits $host_fits)"
    continue
  fi
  if [ "$(left)" -lt 60 ]; then
    echo "SKIP $name (budget)"
    continue
  fi
  t0=$(date +%s)
  rm -rf "$RES/$name"
  mem=()
  [ -n "${MEMORY:-}" ] && mem=("--profile.memory=$RES/$name.mem.pickle")
  # One rank runs as one process, as --plan-world-size=1 plans it: under torchrun a world
  # of one is a process group, which shards (FSDP over one rank) and plans otherwise.
  launch=("$PY" -m torch.distributed.run --standalone --nproc-per-node "$ranks" --no-python)
  [ "$ranks" = 1 ] && launch=()
  timeout "$(( $(left) < 240 ? $(left) : 240 ))" "${launch[@]}" "$TRAIN" "${args[@]}" --device=cuda:0 \
    --dist.backend=gloo "${mem[@]}" >"$RES/$name.log" 2>&1
  rc=$?
  if [ -n "${MEMORY:-}" ]; then
    {
      "$PY" - "$RES/$name.plan.json" "$mode" <<'PY'
import json, sys
plan, mode = sys.argv[1:]
m = next(x for x in json.load(open(plan))["modes"] if x["offload"] == mode)["gpu"]
phases = {p["name"]: p for p in m["phases"]}
backward = max((p for p in m["phases"] if p["name"].startswith("backward")), key=lambda p: p["bytes"])
for name in dict.fromkeys([m["peak_phase"], backward["name"]]):
    print(f"plan: {phases[name]['bytes'] / 2**30:.3f} GiB at {name}{' (its peak)' if name == m['peak_phase'] else ''}:")
    for t in phases[name]["terms"]:
        print(f"  {m['terms'][t] / 2**30:8.3f} GiB  {t}")
PY
      for f in "$RES/$name.mem.pickle" "$RES/$name.mem.pickle".rank*; do
        [ -f "$f" ] && echo "== $(basename "$f")" && "$PY" bench/trainer/memory_peak.py "$f" --top 20 &&
          "$PY" bench/trainer/memory_peak.py "$f" --top 20 --backward
      done
    } >"$RES/$name.sites.txt" 2>&1
    rm -f "$RES/$name.mem.pickle" "$RES/$name.mem.pickle".rank*  # large; the sites say what they held
  fi
  echo "$name: rc=$rc, $(($(date +%s) - t0)) s, predicted $predicted GiB per rank"
  "$PY" - "$RES/$name" "$rc" "$model" "$seq" "$mode" "$ac" "$ranks" "$predicted" "${flags//,/ }" >>"$table" <<'PY'
import json, os, sys
out, rc, model, seq, mode, ac, ranks, predicted, flags = sys.argv[1:]
path = os.path.join(out, "metrics.jsonl")
rows = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
# One rank writes no per-rank list: its own peak is the list.
ranks_of = lambda r: r.get("peak_device_mem_gib_ranks", [r["peak_device_mem_gib"]])
per_rank = [max(ranks_of(r)[i] for r in rows) for i in range(int(ranks))] if rows else []
step = sorted(r["step_time_s"] for r in rows[1:])[len(rows[1:]) // 2] if len(rows) > 1 else None
measured = " / ".join(f"{v:.2f}" for v in per_rank)
err = f"{100 * (float(predicted) - max(per_rank)) / max(per_rank):+.2f}%" if per_rank else ""
outcome = f"trained {len(rows)} steps" if rc == "0" else f"exit {rc}"
head = f"| {model} | {seq} | `{mode}` | {'on' if ac == 'ac' else 'off'} | {ranks} | {flags} | {predicted} | {measured} | "
print(head + (f"{err} | {step:.1f} | {outcome} |" if step else f"{err} | | {outcome} |"))
PY
  [ "$rc" = 0 ] || tail -5 "$RES/$name.log"
done
cat "$table"
if [ -n "${OUT:-}" ]; then
  cp "$table" "$OUT/ranks-table.md"
  tar czf "$OUT/ranks-on-one-gpu.tar.gz" --exclude=checkpoints -C "$(dirname "$RES")" "$(basename "$RES")"
fi
echo "total $(($(date +%s) - START)) s"
