#!/usr/bin/env bash
# The trainer benchmark in one command, on the GPU machine, from the repository root:
#
#   bash bench/trainer/run_gpu.sh
#
# Runs the GPU tests and the GPU smoke (the default run), then for each shape
# (Qwen3-0.6B at 8192, Llama-3.2-3B at 8192, Qwen3-0.6B at 32768) primecfg-train in the
# three offload modes and the peers (PyTorch eager, torch.compile, HF transformers, HF
# transformers with Liger's kernels), prints one table and adds it to docs/performance.md
# as the newest section (bench/trainer/report.py; the rest of the file is kept).
#
# Liger is not installed on the GPU machine: carry its wheel (pure Python) in .whl/,
#   python3 -m pip download --no-deps -d .whl liger-kernel==VERSION
# and name .whl in the device tool's carry; without it the Liger rows say so.
#
# Environment: PRIMECFG_BIN  folder holding a prebuilt primecfg-train and trainer_gpu_tests
#                            (else the tree is built into build-bench with meson)
#              PY            python3 with torch (default /opt/torch/.venv/bin/python3)
#              RESULTS       results folder (default outputs/bench-trainer)
#              BUDGET_S      seconds for all rows; rows that would not fit are skipped (900)
#              COMMIT        commit named in the report (default: git rev-parse)
#              SHAPES        subset of: qwen0.6b-8k llama3b-8k qwen0.6b-32k
#              ROWS          order of the rows (shape:ours|eager|compile|hf|liger), see below
#              SKIP_SMOKE    set: no GPU tests and no default run
#              KEEP          set: rows that passed in an earlier call into the same RESULTS, with
#                            the same programs (primecfg-train, the GPU tests, torch_peer.py,
#                            fake.toml), are kept, not run again (without it every row runs afresh)
#
# The whole table takes about 11 minutes of an H200 machine. Where one command may run for
# less (the device tool: 10 minutes), run it twice on the same machine, the second call
# right after the first while that machine is still held:
#   BUDGET_S=540 RESULTS=/tmp/bench KEEP=1 bash bench/trainer/run_gpu.sh   # twice
# The second call runs only the rows the first did not reach and reports them all.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
PY=${PY:-/opt/torch/.venv/bin/python3}
RES=${RESULTS:-$ROOT/outputs/bench-trainer}
BUDGET=${BUDGET_S:-900}
START=$(date +%s)
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
SHAPES=${SHAPES:-"qwen0.6b-8k llama3b-8k qwen0.6b-32k"}
mkdir -p "$RES"
[ -z "${KEEP:-}" ] && rm -f "$RES"/*.ok
left() { echo $((BUDGET - ($(date +%s) - START))); }

TIMEOUT_S=${TIMEOUT_S:-120}  # --offload.timeout-s: a stuck pipeline fails fast

# A prebuilt PRIMECFG_BIN holds both programs; else both are built into build-bench.
BUILD_TARGETS=tests/trainer/trainer_gpu_tests
source bench/trainer/gpu_env.sh
[ -x "$TRAIN" ] || { echo "no primecfg-train at $TRAIN"; exit 1; }
[ -x "$GPUTESTS" ] || { echo "no trainer_gpu_tests at $GPUTESTS"; exit 1; }
# What a kept row must have been measured with: these programs, byte for byte.
STAMP=$(cat "$TRAIN" "$GPUTESTS" bench/trainer/torch_peer.py bench/trainer/fake.toml | md5sum | cut -c1-16)

step() {  # name, seconds it may take, command...
  local name=$1 limit=$2
  shift 2
  if [ -f "$RES/$name.ok" ]; then
    if [ "$(cat "$RES/$name.ok")" = "$STAMP" ]; then
      echo "$name: passed in an earlier call (KEEP)"
      return
    fi
    echo "$name: the earlier result came from other programs: run again"
  fi
  if [ "$(left)" -lt "$limit" ]; then
    echo "SKIP $name (budget: $(left) s left, needs up to $limit)"
    return
  fi
  local t0=$(date +%s)
  timeout "$limit" "$@" >"$RES/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc, $(($(date +%s) - t0)) s"
  [ $rc -eq 0 ] && echo "$STAMP" >"$RES/$name.ok"
  [ $rc -ne 0 ] && tail -5 "$RES/$name.log"
}

echo "== GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null)"
if [ -z "${SKIP_SMOKE:-}" ]; then
  step gpu-tests 300 "$GPUTESTS"
  grep -E "test cases|assertions|MESSAGE|vs none|SKIP|skipped" "$RES/gpu-tests.log" | tail -8
  step default 150 "$TRAIN" --output-dir="$RES/default" --clean
  grep -E "^primecfg-train|^step (1|50|100|150|200)/|done:|exact|warning" "$RES/default.log"
fi

# Liger from a carried wheel, beside the peers' python (nothing is fetched there).
if ls "$ROOT"/.whl/liger_kernel-*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/liger-site \
    "$ROOT"/.whl/liger_kernel-*.whl && export PYTHONPATH=/tmp/liger-site${PYTHONPATH:+:$PYTHONPATH}
fi

declare -A MODEL=([qwen0.6b-8k]=Qwen/Qwen3-0.6B [llama3b-8k]=meta-llama/Llama-3.2-3B [qwen0.6b-32k]=Qwen/Qwen3-0.6B)
declare -A SEQ=([qwen0.6b-8k]=8192 [llama3b-8k]=8192 [qwen0.6b-32k]=32768)
declare -A STEPS=([qwen0.6b-8k]=10 [llama3b-8k]=7 [qwen0.6b-32k]=7)
declare -A LIMIT=([qwen0.6b-8k]=100 [llama3b-8k]=150 [qwen0.6b-32k]=120)
# Most valuable rows first: a row that no longer fits the budget is skipped.
ROWS=${ROWS:-"qwen0.6b-8k:ours qwen0.6b-8k:compile qwen0.6b-8k:eager llama3b-8k:ours llama3b-8k:compile
  llama3b-8k:eager qwen0.6b-8k:hf qwen0.6b-8k:liger qwen0.6b-32k:ours qwen0.6b-32k:compile qwen0.6b-32k:eager
  llama3b-8k:hf llama3b-8k:liger qwen0.6b-32k:hf qwen0.6b-32k:liger"}
for row in $ROWS; do
  shape=${row%%:*} what=${row##*:}
  case " $SHAPES " in *" $shape "*) ;; *) continue ;; esac
  if [ "$what" = ours ]; then
    for mode in none optimizer full; do
      step "$shape-$mode" "${LIMIT[$shape]}" "$TRAIN" @ bench/trainer/fake.toml --model.name="${MODEL[$shape]}" \
        --model.offload=$mode --data.seq-len="${SEQ[$shape]}" --max-steps="${STEPS[$shape]}" \
        --output-dir="$RES/$shape-$mode" --clean --offload.timeout-s="$TIMEOUT_S"
      grep -E "^step ${STEPS[$shape]}/|warning|error" "$RES/$shape-$mode.log" | tail -2
    done
  else
    case $what in
      compile) flag=--compile ;;
      hf | liger) flag="--impl $what" ;;
      *) flag="" ;;
    esac
    step "$shape-$what" 240 "$PY" bench/trainer/torch_peer.py --model "${MODEL[$shape]}" \
      --seq-len "${SEQ[$shape]}" --steps 5 --warmup 3 $flag
    grep '^{' "$RES/$shape-$what.log" >"$RES/$shape-$what.json"
    if [ -s "$RES/$shape-$what.json" ]; then
      "$PY" -c 'import json,sys; j=json.load(open(sys.argv[1])); print("  step %.3f s, %.0f tok/s, mfu %.1f%%, peak %.1f GiB, first step %.0f s" % (j["step_time_s"], j["tokens_per_s"], 100*j["mfu"], j["peak_device_mem_gib"], j["first_step_s"]))' "$RES/$shape-$what.json"
    else
      rm -f "$RES/$shape-$what.json"
    fi
  fi
done

echo "== report"
"$PY" bench/trainer/report.py "$RES" docs/performance.md --commit "$COMMIT" \
  --command "bash bench/trainer/run_gpu.sh" && cp docs/performance.md "$RES/performance.md"
if [ -n "${OUT:-}" ]; then
  cp docs/performance.md "$OUT/" 2>/dev/null
  tar czf "$OUT/results.tar.gz" --exclude=checkpoints -C "$(dirname "$RES")" "$(basename "$RES")"
fi
echo "total $(($(date +%s) - START)) s"
