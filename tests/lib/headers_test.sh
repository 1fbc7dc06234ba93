#!/usr/bin/env bash
# Every public header of include/primecfg/ (and every detail/*.inl, which
# includes its header) compiles on its own, first in a translation unit,
# header-only and with the loader compiled once (PRIMECFG_HEADER_ONLY=0).
#   headers_test.sh CXX SOURCE_ROOT [FLAGS THAT FIND TOML++...]
set -u
cxx=$1
root=$2
shift 2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
modes=(
  "-DTOML_HEADER_ONLY=1"
  "-DPRIMECFG_HEADER_ONLY=0 -DTOML_HEADER_ONLY=0"
)
fail=0
count=0
cd "$root/include" || exit 1
for header in primecfg/*.hpp primecfg/detail/*.inl; do
  printf '#include <%s>\n#include <%s>\n' "$header" "$header" >"$tmp/t.cpp"  # twice: include guards too
  for mode in "${modes[@]}"; do
    # shellcheck disable=SC2086
    if ! "$cxx" -std=c++20 -fsyntax-only -Wall -Wextra -DTOML_ENABLE_FORMATTERS=1 $mode -I"$root/include" "$@" \
      "$tmp/t.cpp" 2>"$tmp/err.txt"; then
      echo "FAIL: <$header> does not compile on its own ($mode):"
      head -n 20 "$tmp/err.txt"
      fail=1
    elif [ -s "$tmp/err.txt" ]; then
      echo "FAIL: <$header> warns on its own ($mode):"
      head -n 20 "$tmp/err.txt"
      fail=1
    fi
    count=$((count + 1))
  done
done
[ "$count" -gt 0 ] || { echo "FAIL: no headers found under $root/include/primecfg"; exit 1; }
[ "$fail" = 0 ] && echo "ok: $count compilations, every header on its own"
exit $fail
