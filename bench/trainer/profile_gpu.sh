#!/usr/bin/env bash
# Where a step's GPU time goes, primecfg-train against the PyTorch peer, on the GPU
# machine from the repository root:
#
#   bash bench/trainer/profile_gpu.sh
#
# Records the last two steps of primecfg-train in each offload mode (--profile.trace,
# the Kineto profiler) and of the PyTorch peer (torch.profiler; eager unless PEER_FLAGS
# say), all on Qwen3-0.6B at 8192 tokens, and prints bench/trainer/trace_summary.py for
# none vs the peer, optimizer vs none and full vs none. The traces (gzipped Chrome
# traces, chrome://tracing or ui.perfetto.dev) go to $RES and, when set, $OUT.
#
# Environment: MODEL (Qwen/Qwen3-0.6B), SEQ (8192), MODES ("none optimizer full"),
#              FLAGS (more primecfg-train flags, e.g. --model.debug.num-layers=4),
#              PEER_FLAGS (more torch_peer.py flags, e.g. "--compile --layers 4"),
#              PRIMECFG_BIN, PY, RESULTS as in gpu_env.sh.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
RES=${RESULTS:-$ROOT/outputs/profile}
MODEL=${MODEL:-Qwen/Qwen3-0.6B}
SEQ=${SEQ:-8192}
MODES=${MODES:-"none optimizer full"}
mkdir -p "$RES"
source bench/trainer/gpu_env.sh

for mode in $MODES; do
  timeout 200 "$TRAIN" @ bench/trainer/fake.toml --model.name="$MODEL" --profile.trace="$RES/ours-$mode.json" \
    --model.offload="$mode" --data.seq-len="$SEQ" --max-steps=8 --output-dir="$RES/ours-$mode" ${FLAGS:-} \
    >"$RES/ours-$mode.log" 2>&1
  echo "ours $mode: rc=$? $(grep -E '^step 8/' "$RES/ours-$mode.log")"
done
# shellcheck disable=SC2086  # FLAGS and PEER_FLAGS are words
timeout 300 "$PY" bench/trainer/torch_peer.py --model "$MODEL" --seq-len "$SEQ" --steps 5 --warmup 3 \
  --trace "$RES/peer.json" ${PEER_FLAGS:-} >"$RES/peer.log" 2>&1
echo "peer ${PEER_FLAGS:-eager}: rc=$? $(grep '^{' "$RES/peer.log" | head -c 200)"

summary() { [ -f "$1" ] && [ -f "$2" ] && "$PY" bench/trainer/trace_summary.py "$1" "$2" --top 20; }
summary "$RES/ours-none.json" "$RES/peer.json" | tee "$RES/none-vs-peer.txt"
summary "$RES/ours-optimizer.json" "$RES/ours-none.json" | tee "$RES/optimizer-vs-none.txt"
summary "$RES/ours-full.json" "$RES/ours-none.json" | tee "$RES/full-vs-none.txt"
if [ -n "${OUT:-}" ]; then
  cp "$RES"/*.txt "$OUT/" 2>/dev/null
  for t in "$RES"/*.json; do gzip -c "$t" >"$OUT/$(basename "$t").gz"; done
fi
