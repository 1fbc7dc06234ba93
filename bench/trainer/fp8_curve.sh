#!/usr/bin/env bash
# FP8 against bf16 on the GPU machine (issue 51 items 3 and 5), from the repository root:
#
#   bash bench/trainer/fp8_curve.sh
#
# 1. The FP8 GPU tests (trainer_gpu_tests' FP8 cases: the casts and the linear against the
#    CPU path, a model with FP8 linears beside bf16's).
# 2. Loss: MODEL (Qwen3-0.6B, random init) trains STEPS (300) steps of SEQ (8192) tokens of
#    real text, byte-tokenized (the Python standard library's sources and docs of this
#    machine, as {"prompt", "completion"} records), in bf16 and with model.quantization =
#    {type = "fp8"}, same seed; bench/trainer/fp8_curve.py prints the gap and draws
#    $RES/fp8-loss.png.
# 3. Speed: the two runs' median step after the third, and FP8 with the experts in bf16
#    where the model has routed experts, through offload_ab.sh (none and full).
#
# Environment: MODEL, SEQ, STEPS, PY, PRIMECFG_BIN, RESULTS as in gpu_env.sh; FLAGS: more
# primecfg-train flags for both runs (e.g. --optim.max-norm=1.0: fake.toml does not clip).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
RES=${RESULTS:-$ROOT/outputs/fp8-curve}
MODEL=${MODEL:-Qwen/Qwen3-0.6B}
SEQ=${SEQ:-8192}
STEPS=${STEPS:-300}
mkdir -p "$RES"
BUILD_TARGETS=${BUILD_TARGETS:-tests/trainer/trainer_gpu_tests}
source bench/trainer/gpu_env.sh

if [ -n "${GPUTESTS:-}" ]; then
  echo "== FP8 GPU tests"
  # The whole log stays in $RES; a failure is said here, not left to a tail of the log.
  "$GPUTESTS" -tc='*FP8*' >"$RES/fp8-gpu-tests.log" 2>&1
  rc=$?
  grep -E '^\[doctest\] (test cases|assertions)|ERROR|FAILED' "$RES/fp8-gpu-tests.log" | tail -40
  [ $rc -eq 0 ] || echo "the FP8 GPU tests FAILED (exit $rc): $RES/fp8-gpu-tests.log"
fi

# Real text, byte-tokenized: every .py and .txt file of the standard library, in pieces
# of up to 3 x SEQ bytes (packed into rows of SEQ tokens).
DATA=$RES/text.jsonl
"$PY" - "$DATA" "$SEQ" <<'PYEOF'
import json, os, sys, sysconfig
out, seq = sys.argv[1], int(sys.argv[2])
root = sysconfig.get_paths()["stdlib"]
n = 0
with open(out, "w") as f:
    for d, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            if not name.endswith((".py", ".txt")):
                continue
            try:
                text = open(os.path.join(d, name), encoding="utf-8").read()
            except (UnicodeDecodeError, OSError):
                continue
            for i in range(0, len(text), 3 * seq):
                f.write(json.dumps({"prompt": "", "completion": text[i : i + 3 * seq]}) + "\n")
                n += 1
print(f"{n} records of standard-library text in {out}")
PYEOF

run() {  # name, extra flags
  local name=$1
  shift
  rm -rf "$RES/$name"
  "$TRAIN" @ bench/trainer/fake.toml --model.name="$MODEL" --data.type=sft --data.path="$DATA" \
    --data.seq-len="$SEQ" --data.pack=true --max-steps="$STEPS" --output-dir="$RES/$name" ${FLAGS:-} "$@" \
    >"$RES/$name.log" 2>&1
  echo "$name: exit $? ($(tail -1 "$RES/$name.log"))"
}
run bf16
run fp8 --model.quantization.type=fp8
"$PY" bench/trainer/fp8_curve.py "$RES/bf16/metrics.jsonl" "$RES/fp8/metrics.jsonl" --out "$RES/fp8-loss.png"
for name in bf16 fp8; do
  "$PY" - "$RES/$name/metrics.jsonl" "$name" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = [r["step_time_s"] for r in rows[3:]]
print(f"{sys.argv[2]}: median step {statistics.median(steps):.4f} s over {len(steps)} steps, "
      f"peak GPU {max(r['peak_device_mem_gib'] for r in rows):.2f} GiB")
PYEOF
done
