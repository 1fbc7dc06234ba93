#!/usr/bin/env bash
# A `none` run whose CUDA graph capture needs more memory than its eager steps (on the GPU
# machine, from the repository root; docs/trainer.md, "CUDA graph"): the plan, the capture
# asked for (--cuda-graph, which stops on the error) with the allocator's record read by
# capture_memory.py, then the default, which goes on eagerly after the failed capture.
#
#   RES=$OUT bash bench/trainer/capture_oom.sh      # RES: where the logs go
#
# MODEL and SEQ pick the run: by default the one that failed on an H100 on 2026-12-07
# (Qwen3-4B at 65,536 tokens with AC, planned 74.10 of 79.18 GiB); on an H200 a run near
# its limit instead (Qwen3-8B at 49,152 tokens, planned 130.82 of 139.8 GiB).
set -u
cd "$(dirname "$0")/../.."
source bench/trainer/gpu_env.sh
gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | awk '{printf "%.2f", $1 / 1024}')
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  MODEL=${MODEL:-Qwen/Qwen3-8B} SEQ=${SEQ:-49152}
else
  MODEL=${MODEL:-Qwen/Qwen3-4B} SEQ=${SEQ:-65536}
fi
run=(@ bench/trainer/fake.toml --model.name="$MODEL" --model.offload=none --data.seq-len="$SEQ" --model.ac)
echo "== $MODEL at $SEQ tokens, none with AC, on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) ($gib GiB)"
"$TRAIN" "${run[@]}" --plan --plan-gpu-memory="$gib" 2>&1 | grep -E "PEAK|device total|fits the GPU"

echo "== the capture asked for, with the allocator's record"
timeout 300 "$TRAIN" "${run[@]}" --max-steps=3 --cuda-graph --output-dir="$RES/capture" \
  --profile.memory="$RES/capture.pickle" >"$RES/capture.log" 2>&1
echo "rc=$?"
grep -E "^step|error" "$RES/capture.log" | cut -c1-700
[ -f "$RES/capture.pickle" ] && "$PY" bench/trainer/capture_memory.py "$RES/capture.pickle" | tee "$RES/capture.txt"
rm -f "$RES/capture.pickle"  # hundreds of MB; capture.txt keeps what it says

echo "== the default: eager after a capture that ran out of memory"
timeout 300 "$TRAIN" "${run[@]}" --max-steps=5 --output-dir="$RES/fallback" >"$RES/fallback.log" 2>&1
echo "rc=$?"
grep -vE "^frame" "$RES/fallback.log" | cut -c1-400 | head -12
cut -c1-200 "$RES/fallback/metrics.jsonl"
