#!/usr/bin/env bash
# FP8 against bf16 and against torchao's float8 (issue 51 item 5) on the GPU machine, from
# the repository root:
#
#   python3 -m pip download --no-deps -d .whl torchao==0.18.0   # here; .whl/ travels (carry it)
#   bash bench/trainer/fp8_speed.sh
#
# Rows, each at SEQ (8192) tokens, bench/trainer/fake.toml's run:
#   Llama-3.2-3B            primecfg `none` bf16 and FP8; PyTorch peer compiled, bf16 and
#                           torchao float8 (rowwise, tensorwise)
#   Meta-Llama-3-8B, AC     the same with every block checkpointed, cut to its first 12
#                           blocks (model.debug.num_layers; --plan: the whole model in `none`
#                           needs 141 GiB, 12 blocks 67 GiB, which an H100 holds too)
#   Meta-Llama-3-8B, AC     primecfg `full` bf16 and FP8, the whole model
# Printed per row: median step after the third (ours) or over the timed steps (peer),
# tokens/s and peak GPU memory; then each FP8 row against its bf16 row and ours against
# the best torchao row (targets: 1.3x our bf16, 1.1x torchao's tokens/s, in `none`).
# Everything lands in $RES, tarred as $OUT/fp8-speed.tgz where OUT is set.
#
# Environment: SEQ, STEPS (10), ROWS (a subset of the row names below), PY, PRIMECFG_BIN,
# RESULTS as in gpu_env.sh.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
RES=${RESULTS:-$ROOT/outputs/fp8-speed}
SEQ=${SEQ:-8192}
STEPS=${STEPS:-10}
mkdir -p "$RES"
source bench/trainer/gpu_env.sh

# torchao from a carried wheel (the GPU machine fetches nothing).
if ls "$ROOT"/.whl/torchao-*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/torchao-site \
    "$ROOT"/.whl/torchao-*.whl && export PYTHONPATH=/tmp/torchao-site${PYTHONPATH:+:$PYTHONPATH}
fi

L3=meta-llama/Llama-3.2-3B L8=meta-llama/Meta-Llama-3-8B
FP8=--model.quantization.type=fp8
# name | runner | model | flags
SPECS=(
  "3b-none-bf16|ours|$L3|--model.offload=none"
  "3b-none-fp8|ours|$L3|--model.offload=none $FP8"
  "3b-peer-bf16|peer|$L3|--compile"
  "3b-peer-float8-rowwise|peer|$L3|--compile --float8 rowwise"
  "3b-peer-float8-tensorwise|peer|$L3|--compile --float8 tensorwise"
  "8b-ac-none-bf16|ours|$L8|--model.offload=none --model.ac --model.debug.num-layers=12"
  "8b-ac-none-fp8|ours|$L8|--model.offload=none --model.ac --model.debug.num-layers=12 $FP8"
  "8b-ac-peer-bf16|peer|$L8|--compile --ac --layers 12"
  "8b-ac-peer-float8-rowwise|peer|$L8|--compile --ac --layers 12 --float8 rowwise"
  "8b-ac-peer-float8-tensorwise|peer|$L8|--compile --ac --layers 12 --float8 tensorwise"
  "8b-ac-full-bf16|ours|$L8|--model.offload=full --model.ac"
  "8b-ac-full-fp8|ours|$L8|--model.offload=full --model.ac $FP8"
)
for spec in "${SPECS[@]}"; do
  IFS='|' read -r name runner model flags <<<"$spec"
  [ -n "${ROWS:-}" ] && case " $ROWS " in *" $name "*) ;; *) continue ;; esac
  echo "== $name"
  if [ "$runner" = ours ]; then
    # shellcheck disable=SC2086  # flags are words
    timeout 400 "$TRAIN" @ bench/trainer/fake.toml --model.name="$model" --data.seq-len="$SEQ" \
      --max-steps="$STEPS" --output-dir="$RES/$name" --clean $flags >"$RES/$name.log" 2>&1
  else
    # shellcheck disable=SC2086
    timeout 400 "$PY" bench/trainer/torch_peer.py --model "$model" --seq-len "$SEQ" --steps 5 --warmup 3 \
      $flags >"$RES/$name.log" 2>&1
  fi
  echo "rc=$?" >>"$RES/$name.log"
  tail -n 3 "$RES/$name.log" | grep -E "error|rc=[1-9]" || true
done

"$PY" - "$RES" "$SEQ" <<'EOF'
import json, os, statistics, sys
res, seq = sys.argv[1], int(sys.argv[2])
rows = {}
for name in sorted(os.listdir(res)):
    if not name.endswith(".log"):
        continue
    name = name[:-4]
    metrics = os.path.join(res, name, "metrics.jsonl")
    if os.path.exists(metrics):
        m = [json.loads(l) for l in open(metrics)]
        if m:
            t = statistics.median([r["step_time_s"] for r in m[3:]] or [r["step_time_s"] for r in m])
            rows[name] = (t, m[-1]["peak_device_mem_gib"], f"loss {m[0]['loss']:.3f}->{m[-1]['loss']:.3f}")
        continue
    lines = [l for l in open(os.path.join(res, name + ".log")) if l.startswith("{")]
    if lines:
        j = json.loads(lines[-1])
        rows[name] = (j["step_time_s"], j["peak_device_mem_gib"], f"loss {j['loss_first']:.3f}->{j['loss_last']:.3f}")
print(f"{'row':<30} {'step (s)':>9} {'tokens/s':>9} {'peak GiB':>9}")
for name, (t, peak, loss) in rows.items():
    print(f"{name:<30} {t:>9.4f} {seq / t:>9.0f} {peak:>9.2f}  {loss}")
for prefix in ("3b-", "8b-ac-"):
    def get(n):
        return rows.get(prefix + n, (None,))[0]
    for mode in ("none", "full"):
        bf, f8 = get(f"{mode}-bf16"), get(f"{mode}-fp8")
        if bf and f8:
            print(f"{prefix}{mode}: FP8 is {bf / f8:.3f}x our bf16 step (target 1.3x in none)")
    f8 = get("none-fp8")
    peers = [t for t in (get("peer-float8-rowwise"), get("peer-float8-tensorwise")) if t]
    if f8 and peers:
        print(f"{prefix}none: FP8 is {min(peers) / f8:.3f}x torchao's best float8 tokens/s (target 1.1x)")
EOF
[ -n "${OUT:-}" ] && tar czf "$OUT/fp8-speed.tgz" -C "$(dirname "$RES")" "$(basename "$RES")"
exit 0
