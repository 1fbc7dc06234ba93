#!/usr/bin/env bash
# Builds the CPU optimizer and NUMA libraries, their tests and the benchmark with the compiler alone
# (no meson, no toml++), for a quick check on a machine where the full build is not set up yet.
#   bench/cpu_optim/build_standalone.sh [BUILD_DIR] [PYTHON_WITH_TORCH]
# Produces BUILD_DIR/test_cpu_optim, BUILD_DIR/test_cpu_optim_numa, BUILD_DIR/test_cpu_optim_torch (when PYTHON imports torch) and
# BUILD_DIR/bench_cpu_optim.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-build-cpu-optim}
py=${2:-python3}
cxx=${CXX:-g++}
mkdir -p "$out"
flags=(-std=c++20 -O3 -DNDEBUG -Wall -Wextra -I"$root/reference_trainer")
kflags=(-ffp-contract=off -fno-math-errno)
hw=0
hwlibs=()
if pkg-config --exists hwloc 2>/dev/null; then
  hw=1
  read -r -a hwlibs <<<"$(pkg-config --libs hwloc)"
fi
pids=()
compile() { "$cxx" "${flags[@]}" "$@" & pids+=($!); }
for f in cpu_optim kernels_avx2 kernels_avx512 thread_pool; do
  compile "${kflags[@]}" -c "$root/reference_trainer/optim/cpu/$f.cpp" -o "$out/$f.o"
done
compile -DPRIMECFG_HAVE_HWLOC=$hw -c "$root/reference_trainer/offload/full/numa/numa_binding.cpp" -o "$out/numa_binding.o"
for f in main test_kernels test_pool test_numa; do
  compile -c "$root/tests/cpu_optim/$f.cpp" -o "$out/t_$f.o"
done
compile "-DPRIMECFG_BENCH_PEER=\"$py $root/bench/cpu_optim/torch_adamw_peer.py\"" \
  -c "$root/bench/cpu_optim/bench_cpu_optim.cpp" -o "$out/bench.o"
torch=0
if td=$("$py" -c 'import torch,os;print(os.path.dirname(torch.__file__))' 2>/dev/null); then
  torch=1
  abi=$("$py" -c 'import torch;print(int(torch.compiled_with_cxx11_abi()))')
  compile -D_GLIBCXX_USE_CXX11_ABI="$abi" -isystem "$td/include" -isystem "$td/include/torch/csrc/api/include" \
    -c "$root/tests/cpu_optim/test_vs_torch.cpp" -o "$out/t_torch.o"
fi
for p in "${pids[@]}"; do wait "$p"; done
libs=("$out"/cpu_optim.o "$out"/kernels_avx2.o "$out"/kernels_avx512.o "$out"/thread_pool.o)
"$cxx" -o "$out/test_cpu_optim" "$out"/t_main.o "$out"/t_test_kernels.o "$out"/t_test_pool.o "${libs[@]}" -pthread
libs+=("$out"/numa_binding.o)
"$cxx" -o "$out/test_cpu_optim_numa" "$out"/t_main.o "$out"/t_test_numa.o "${libs[@]}" "${hwlibs[@]}" -pthread
"$cxx" -o "$out/bench_cpu_optim" "$out/bench.o" "${libs[@]}" "${hwlibs[@]}" -pthread
if [ $torch = 1 ]; then
  "$cxx" -o "$out/test_cpu_optim_torch" "$out"/t_main.o "$out"/t_torch.o "${libs[@]}" "${hwlibs[@]}" -pthread \
    -L"$td/lib" -Wl,-rpath,"$td/lib" -Wl,--no-as-needed -ltorch -ltorch_cpu -lc10 -Wl,--as-needed
fi
echo "built in $out (torch tests: $torch)"
