#!/usr/bin/env bash
# Compile time at -O2 of a TU with the whole config tree and loading
# (load_sft.cpp) against a TU that only parses TOML with toml++ (parse_only.cpp),
# with toml++ header-only and with toml++ compiled once elsewhere
# (TOML_HEADER_ONLY=0: the TU holds only its declarations).
# Usage: bench/library/compile_time.sh [CXX] [extra flags...]; CPU (user + system)
# seconds of the compiler, best of 3 runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
cxx=${1:-g++}
shift || true
extra=("$@")
best() {  # best FILE HEADER_ONLY
  local best_s=999
  for _ in 1 2 3; do
    local t
    t=$( { /usr/bin/time -f '%U %S' "$cxx" -std=c++20 -O2 -Iinclude -DTOML_HEADER_ONLY="$2" "${extra[@]}" \
           -c "$1" -o /dev/null; } 2>&1 >/dev/null | tail -1)
    best_s=$(python3 -c "print(min($best_s, sum(map(float, '$t'.split()))))")
  done
  printf '%.2f' "$best_s"
}
echo "| translation unit | toml++ header-only (s) | toml++ compiled once (s) |"
echo "| --- | ---: | ---: |"
for f in parse_only load_sft; do
  echo "| bench/library/$f.cpp | $(best bench/library/$f.cpp 1) | $(best bench/library/$f.cpp 0) |"
done
