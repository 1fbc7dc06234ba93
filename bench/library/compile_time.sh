#!/usr/bin/env bash
# Compile time at -O2 of a TU with the whole config tree, loading from files
# and the command line and the error report (load_sft.cpp), against a TU that
# only parses TOML with toml++ (parse_only.cpp), in three build modes:
#   header-only        everything in the TU (the default)
#   toml++ compiled    TOML_HEADER_ONLY=0: toml++'s parser compiled once elsewhere
#   primecfg compiled  PRIMECFG_HEADER_ONLY=0 too: the loader compiled once
#                      (tools/libprimecfg/primecfg.cpp; detail/header_only.hpp)
# Usage: bench/library/compile_time.sh [CXX] [extra flags...]; CPU (user +
# system) seconds of the compiler, best of 3 runs. This machine's compile
# times drift by up to 30% over minutes: compare runs made side by side.
set -euo pipefail
cd "$(dirname "$0")/../.."
cxx=${1:-g++}
shift || true
extra=("$@")
best() {  # best FILE FLAGS...
  local file=$1 best_s=999 t
  shift
  for _ in 1 2 3; do
    t=$( { /usr/bin/time -f '%U %S' "$cxx" -std=c++20 -O2 -Iinclude "$@" "${extra[@]}" \
           -c "$file" -o /dev/null; } 2>&1 >/dev/null | tail -1)
    best_s=$(python3 -c "print(min($best_s, sum(map(float, '$t'.split()))))")
  done
  printf '%.2f' "$best_s"
}
header_only=(-DTOML_HEADER_ONLY=1)
toml_compiled=(-DTOML_HEADER_ONLY=0)
both_compiled=(-DTOML_HEADER_ONLY=0 -DPRIMECFG_HEADER_ONLY=0)
echo "| translation unit | header-only (s) | toml++ compiled once (s) | toml++ and primecfg's loader compiled once (s) |"
echo "| --- | ---: | ---: | ---: |"
echo "| bench/library/parse_only.cpp | $(best bench/library/parse_only.cpp "${header_only[@]}") |" \
     "$(best bench/library/parse_only.cpp "${toml_compiled[@]}") | |"
echo "| bench/library/load_sft.cpp | $(best bench/library/load_sft.cpp "${header_only[@]}") |" \
     "$(best bench/library/load_sft.cpp "${toml_compiled[@]}") |" \
     "$(best bench/library/load_sft.cpp "${both_compiled[@]}") |"
