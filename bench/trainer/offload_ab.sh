#!/usr/bin/env bash
# Side-by-side runs of primecfg-train variants on the GPU machine, from the repository root:
#
#   bash bench/trainer/offload_ab.sh "none" "optimizer" "full" \
#        "full --offload.cpu-threads=8" "full --data.input-ids=random"
#
# Each argument is a mode followed by extra primecfg-train flags (config fields or
# options, e.g. --offload.ring-mib=512). Every variant trains STEPS steps (10) of
# bench/trainer/fake.toml (Qwen3-0.6B at 8192 tokens unless MODEL / SEQ say
# otherwise); printed per variant: the median step time over the steps after the
# third, peak GPU memory, host RSS and the offload pipeline's figures of the last
# step. PROFILE=1 also records the last two steps with the Kineto profiler and
# prints bench/trainer/trace_gaps.py for them (PROFILE=gpu: only the GPU's kernels and
# copies, which leaves the host's timing alone); PROFILE or TIMELINE=1 record the
# host threads of the offload pipeline (--profile.host-trace) and print
# bench/trainer/pipeline_timeline.py (with the GPU rows when PROFILE is set).
#
# Environment: MODEL, SEQ, STEPS, PROFILE, TIMELINE, PY, PRIMECFG_BIN, RESULTS as in gpu_env.sh.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
RES=${RESULTS:-$ROOT/outputs/offload-ab}
MODEL=${MODEL:-Qwen/Qwen3-0.6B}
SEQ=${SEQ:-8192}
STEPS=${STEPS:-10}
mkdir -p "$RES"
source bench/trainer/gpu_env.sh

n=0
for spec in "$@"; do
  n=$((n + 1))
  read -r mode rest <<<"$spec"
  flags=()
  for word in $rest; do flags+=("$word"); done
  out="$RES/v$n"
  rm -rf "$out" "$out.host.json" "$out.trace.json"
  prof=()
  [ -n "${PROFILE:-}" ] && prof=("--profile.trace=$out.trace.json")
  [ "${PROFILE:-}" = gpu ] && prof+=("--no-profile.cpu-ops")
  [ -n "${PROFILE:-}${TIMELINE:-}" ] && prof+=("--profile.host-trace=$out.host.json")
  # RANKS=N: through torchrun's N ranks (N = 1: the sharded step's collectives over one rank).
  runner=()
  [ -n "${RANKS:-}" ] && runner=("$PY" -m torch.distributed.run --standalone --nproc-per-node "$RANKS" --no-python)
  timeout 300 "${runner[@]}" "$TRAIN" @ bench/trainer/fake.toml --model.name="$MODEL" \
    --model.offload="$mode" --data.seq-len="$SEQ" --max-steps="$STEPS" --output-dir="$out" "${prof[@]}" \
    "${flags[@]}" >"$out.log" 2>&1
  rc=$?
  "$PY" - "$out/metrics.jsonl" "$spec" "$rc" <<'EOF'
import json, statistics, sys
path, spec, rc = sys.argv[1:]
try:
    rows = [json.loads(l) for l in open(path)]
except OSError:
    rows = []
if not rows:
    print(f"{spec:<48} rc={rc}: no metrics")
    sys.exit()
times = [r["step_time_s"] for r in rows[3:]] or [r["step_time_s"] for r in rows]
last = rows[-1]
pipe = " ".join(f"{k}={v:.3g}" for k, v in sorted(last.get("pipeline", {}).items()))
print(f"{spec:<48} rc={rc} step {statistics.median(times):.4f} s (min {min(times):.4f}) "
      f"peak {last['peak_device_mem_gib']:.2f} GiB rss {last['host_mem_gib']['rss']:.2f} GiB "
      f"loss {rows[0]['loss']:.3f}->{last['loss']:.3f} {pipe}")
EOF
  if [ -n "${PROFILE:-}" ] && [ -f "$out.trace.json" ]; then
    "$PY" bench/trainer/trace_gaps.py "$out.trace.json" --top 8 | sed 's/^/    /'
    [ -n "${OUT:-}" ] && gzip -c "$out.trace.json" >"$OUT/$(basename "$out").trace.json.gz"
  fi
  if [ -f "$out.host.json" ]; then
    kineto=()
    [ -f "$out.trace.json" ] && kineto=("$out.trace.json")
    "$PY" bench/trainer/pipeline_timeline.py "$out.host.json" "${kineto[@]}" | sed 's/^/    /'
    [ -n "${OUT:-}" ] && gzip -c "$out.host.json" >"$OUT/$(basename "$out").host.json.gz"
  fi
done
