#!/usr/bin/env bash
# Compile time at -O2 of a TU with the whole config tree and loading
# (load_sft.cpp) against a TU that only parses TOML with toml++ (parse_only.cpp).
# Usage: bench/library/compile_time.sh [CXX] [extra flags...]; best of 3 runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
cxx=${1:-g++}
shift || true
flags=(-std=c++20 -O2 -Iinclude -DTOML_HEADER_ONLY=1 "$@")
best() {
  local best_s=999
  for _ in 1 2 3; do
    local start end
    start=$(date +%s.%N)
    "$cxx" "${flags[@]}" -c "$1" -o /dev/null
    end=$(date +%s.%N)
    best_s=$(python3 -c "print(min($best_s, $end - $start))")
  done
  printf '%.2f' "$best_s"
}
echo "| translation unit | best of 3 at -O2 (s) |"
echo "| --- | --- |"
echo "| bench/library/parse_only.cpp (toml++ parse only) | $(best bench/library/parse_only.cpp) |"
echo "| bench/library/load_sft.cpp (config tree + load + report) | $(best bench/library/load_sft.cpp) |"
