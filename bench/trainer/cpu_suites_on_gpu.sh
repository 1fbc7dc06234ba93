#!/usr/bin/env bash
# The CPU test suites on the GPU machine (issue 52: device "cpu" in the CUDA build, on
# that machine's CPU), from the repository root:
#
#   bash bench/trainer/cpu_suites_on_gpu.sh [SUITE ...]
#
# Builds every target into build-bench (gpu_env.sh), then runs `meson test` on the CPU
# suites that machine can run (the transformers oracles and `schemas` need Python
# packages it lacks) in a TMPDIR of its own, which the suites must leave empty. With OUT
# set (the device runner's output folder), the test log and whatever the failed cases
# kept (distributed_test.py keeps a failing torchrun's whole stderr) are copied there.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
RES=${RESULTS:-$ROOT/outputs/cpu-suites}
mkdir -p "$RES"
source bench/trainer/gpu_env.sh
ninja -C build-bench -j"$(nproc)" >"$RES/build-all.log" 2>&1 || { tail -40 "$RES/build-all.log"; exit 1; }
SUITES=("$@")
[ ${#SUITES[@]} -eq 0 ] && SUITES=(library "compiled loader" "primecfg tool" migrate trainer trainer-exchange
  trainer-plan trainer-plan-json trainer-plan-world trainer-plan-hsdp trainer-plan-world-batch
  trainer-plan-bad-size trainer-plan-flag-alone trainer-plan-bad-model trainer-reliability
  trainer-distributed trainer-fp8-vs-reference cpu_optim cpu_optim_numa cpu_optim_torch "bad input")
export TMPDIR=$RES/tmp
# As tools/test.sh: torch's compiled-kernel cache (which importing transformers' models
# creates) is meant to outlive a run, so it goes under the build, not into TMPDIR.
export TORCHINDUCTOR_CACHE_DIR="$PWD/build-bench/torchinductor-cache"
rm -rf "$TMPDIR" && mkdir -p "$TMPDIR"
# (The device copy's git may report the session's first commit, not the tree it holds.)
echo "== $(git log -1 --format=%h 2>/dev/null), $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
(cd build-bench && PATH=$(dirname "$PY"):$PATH meson test --no-rebuild --print-errorlogs "${SUITES[@]}")
rc=$?
left=$(find "$TMPDIR" -mindepth 1 -maxdepth 1 | head -20)
[ -n "$left" ] && echo "left in TMPDIR:" && echo "$left"
if [ -n "${OUT:-}" ]; then
  cp build-bench/meson-logs/testlog.txt "$OUT/" 2>/dev/null
  [ -n "$left" ] && tar czf "$OUT/kept.tar.gz" -C "$TMPDIR" .
fi
exit $rc
