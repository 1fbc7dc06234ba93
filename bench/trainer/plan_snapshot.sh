#!/usr/bin/env bash
# The planner's JSON for a fixed set of configs, one file each, with the shipped H200
# profile: run it before and after a change that must not move a plan, then compare
# the two folders (`diff -r BEFORE AFTER`). 48 configs: 4 presets x 2 lengths x 6
# variants (one process; full; 8 sharded ranks; 2-sample micro-batches without
# clipping; sign_sgd on 16 ranks in 2 HSDP replicas; no activation checkpointing).
#
# usage: bench/trainer/plan_snapshot.sh PRIMECFG_TRAIN OUT_DIR
set -euo pipefail
train=$(realpath "$1") out=$(realpath -m "$2")
# From the repository root, so that the profile's path in the JSON is the same in any checkout.
cd "$(dirname "$0")/../.."
profile=reference_trainer/planner/profiles/nvidia-h200.toml
mkdir -p "$out"
variants=(
  ""
  "--model.offload=full"
  "--model.offload=none --plan-world-size=8"
  "--optim.max-norm=None --data.micro-batch-size=2"
  "--optim.type=sign_sgd --model.offload=full --plan-world-size=16 --model.dp-replicate=2"
  "--model.ac=None"
)
i=0
for model in Qwen/Qwen3-0.6B meta-llama/Llama-3.2-3B Qwen/Qwen3-8B meta-llama/Llama-3.2-1B; do
  for seq in 8192 16384; do
    for extra in "${variants[@]}"; do
      i=$((i + 1))
      # shellcheck disable=SC2086 # each variant is several flags
      "$train" --plan --plan-format=json --plan-profile="$profile" --plan-gpu-memory=139 --plan-host-memory=1500 \
        --model.name="$model" --data.type=fake --data.seq-len="$seq" --data.batch-size=16 \
        --data.micro-batch-size=1 $extra >"$out/$i.json" 2>"$out/$i.err" ||
        { echo "plan $i failed: $model $seq $extra (see $out/$i.err)" >&2; exit 1; }
    done
  done
done
echo "$i plans in $out"
