#!/usr/bin/env bash
# Issue 31, item 2: what a CUDA graph of the forward and backward saves, per shape, on
# the GPU machine (from the repository root). Builds graph_probe beside primecfg-train
# (gpu_env.sh) and runs it at each SHAPES entry (MODEL:SEQ_LEN).
#
#   RESULTS=/tmp/r bash bench/trainer/graph_probe.sh
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
RES=${RESULTS:-$ROOT/outputs/graph-probe}
mkdir -p "$RES"
BUILD_TARGETS="${BUILD_TARGETS:-} bench/trainer/graph_probe"
source bench/trainer/gpu_env.sh
PROBE=$BIN/../bench/trainer/graph_probe
SHAPES=${SHAPES:-Qwen/Qwen3-0.6B:1024 Qwen/Qwen3-0.6B:2048 Qwen/Qwen3-0.6B:8192 meta-llama/Llama-3.2-3B:8192}
for s in $SHAPES; do
  "$PROBE" "${s%%:*}" "${s##*:}" "${ROUNDS:-5}" "${PER_ROUND:-5}" 2>&1 | tee -a "$RES/graph_probe.txt" | tail -1
done
