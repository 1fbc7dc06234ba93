#!/usr/bin/env bash
# The numerics-sensitive suites again on the CPU paths that tools/test.sh did not take,
# so that a machine with AVX-512 and one without are both exercised wherever this runs:
# - ATen's AVX2 kernels (ATEN_CPU_CAPABILITY=avx2) where ATen would pick its AVX-512
#   ones: the trainer, its distributed runs, transformers parity, the CPU optimizer;
# - full offload's CPU update on each --offload.cpu-isa this CPU has below its widest (the
#   default, which tools/test.sh took), through the distributed test's `full` cases (the
#   kernels' own tests already loop over the paths).
# Expects a build from tools/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
train=build/reference_trainer/primecfg-train
if [ ! -x "$train" ]; then
  echo "test_cpu_paths.sh: $train is missing: run tools/test.sh first" >&2
  exit 1
fi
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
has() { for f in "$@"; do [[ " $flags " == *" $f "* ]] || return 1; done; }

if has avx512f; then
  echo "== ATen's AVX2 kernels (ATEN_CPU_CAPABILITY=avx2) on a CPU with AVX-512"
  # Half the distributed cases (every other one from the first: each mode on 1, 2 and 4
  # ranks, Qwen3-MoE and expert parallelism, HSDP, resuming): all of them ran on ATen's
  # AVX-512 kernels in tools/test.sh, and the whole suite again took 6.5 of CI's 80 minutes.
  ATEN_CPU_CAPABILITY=avx2 PRIMECFG_TEST_SHARD=0/2 meson test -C build --print-errorlogs --num-processes 2 \
    trainer trainer-distributed trainer-vs-transformers cpu_optim cpu_optim_torch
else
  echo "== no AVX-512 here: ATen's default kernels were the AVX2 ones in tools/test.sh"
fi

# The widest path this CPU has is the default (--offload.cpu-isa unset), which tools/test.sh
# took: the narrower ones here.
isas=(scalar)
has avx2 fma && isas+=(avx2)
has avx512f avx512bw avx512vl avx2 fma && isas+=(avx512)
unset 'isas[-1]'
for isa in "${isas[@]}"; do
  echo "== full offload's CPU update on the $isa path (--offload.cpu-isa=$isa)"
  python3 tests/trainer/distributed_test.py "$train" full -- "--offload.cpu-isa=$isa"
done
