#!/usr/bin/env bash
# Two commits side by side on the GPU machine, in one call, from the repository root:
#
#   bash bench/trainer/ab_commits.sh BASE [ROUNDS]
#
# Builds primecfg-train at BASE (a commit this clone holds) in /tmp/ab-base and at the
# working tree (gpu_env.sh's build-bench), then runs bench/trainer/offload_ab.sh for
# none, optimizer and full at each shape, alternating the two binaries ROUNDS times (2)
# so that a drift of the machine during the call shows as a spread, not as a difference.
# Shapes: SHAPES="model:seq ..." (Qwen3-0.6B and Llama-3.2-3B at 8192, issue 47 item 5).
# Environment as offload_ab.sh (STEPS, PY, RESULTS).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
BASE=${1:?usage: ab_commits.sh BASE [ROUNDS]}
ROUNDS=${2:-2}
RES=${RESULTS:-$ROOT/outputs/ab-commits}
SHAPES=${SHAPES:-"Qwen/Qwen3-0.6B:8192 meta-llama/Llama-3.2-3B:8192"}
mkdir -p "$RES"
source bench/trainer/gpu_env.sh
NEW=$BIN

# The base commit's tree, built the same way (its own gpu_env.sh, the same .deps); kept
# for the next call on a warm machine (BASE_ONLY=1 builds it and stops).
OLD=/tmp/ab-base/build-bench/reference_trainer
want=$(git rev-parse "$BASE^{commit}") || { echo "cannot read commit $BASE"; exit 1; }
if [ "$(cat /tmp/ab-base/.built 2>/dev/null)" != "$want" ]; then
  rm -rf /tmp/ab-base && mkdir -p /tmp/ab-base
  git archive "$BASE" | tar -x -C /tmp/ab-base || { echo "cannot read commit $BASE"; exit 1; }
  [ -d .deps ] && cp -r .deps /tmp/ab-base/
  (cd /tmp/ab-base && unset PRIMECFG_BIN && RES=$RES/base && mkdir -p "$RES" && source bench/trainer/gpu_env.sh >/dev/null) ||
    { echo "the build of $BASE failed: $RES/base/build.log"; exit 1; }
  echo "$want" >/tmp/ab-base/.built
fi
[ -n "${BASE_ONLY:-}" ] && exit 0

for shape in $SHAPES; do
  IFS=: read -r model seq <<<"$shape"
  for round in $(seq "$ROUNDS"); do
    for side in base new; do
      bin=$OLD
      [ "$side" = new ] && bin=$NEW
      echo "== $model $seq, round $round, $side"
      MODEL=$model SEQ=$seq PRIMECFG_BIN=$bin RESULTS=$RES/$side bash bench/trainer/offload_ab.sh none optimizer full
    done
  done
done
