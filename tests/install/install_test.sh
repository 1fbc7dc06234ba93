#!/usr/bin/env bash
# `meson install` puts the headers and primecfg.pc in place, and a program of
# another project builds against that installed copy (through pkg-config) and
# against primecfg used as a meson subproject.
set -euo pipefail
build=$1
source_root=$2
cxx=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

meson install -C "$build" --destdir "$tmp/stage" --quiet >/dev/null
pc=$(find "$tmp/stage" -name primecfg.pc | head -n 1)
[ -n "$pc" ] || { echo "FAIL: no primecfg.pc installed"; exit 1; }
[ -f "$(dirname "$pc")/../../include/primecfg/model.hpp" ] || [ -n "$(find "$tmp/stage" -path '*include/primecfg/model.hpp')" ] ||
  { echo "FAIL: headers not installed"; exit 1; }

# 1. pkg-config, with the staged tree standing in for the real prefix.
export PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_SYSROOT_DIR="$tmp/stage"
flags=$(pkg-config --cflags --libs primecfg)
# shellcheck disable=SC2086
"$cxx" -std=c++20 -O0 "$source_root/tests/install/consumer/main.cpp" $flags -o "$tmp/consumer"
printf '[model]\noffload = "full"\n' >"$tmp/run.toml"
out=$("$tmp/consumer" @ "$tmp/run.toml" --steps 3)
[ "$out" = "steps=3 strategy=full" ] || { echo "FAIL: installed consumer printed '$out'"; exit 1; }
if "$tmp/consumer" --steps 0 2>"$tmp/err"; then echo "FAIL: invalid config accepted"; exit 1; fi
grep -q "steps: must be greater than or equal to 1" "$tmp/err" || { echo "FAIL: unexpected error text"; cat "$tmp/err"; exit 1; }

# 2. As a meson subproject (meson.override_dependency).
unset PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR
cp -r "$source_root/tests/install/consumer" "$tmp/sub"
mkdir -p "$tmp/sub/subprojects"
ln -s "$source_root" "$tmp/sub/subprojects/primecfg"
# No installed primecfg.pc must be found here, so the fallback is used.
PKG_CONFIG_LIBDIR=/nonexistent meson setup "$tmp/sub/build" "$tmp/sub" >"$tmp/setup.log" 2>&1 ||
  { echo "FAIL: subproject setup"; cat "$tmp/setup.log"; exit 1; }
ninja -C "$tmp/sub/build" >"$tmp/ninja.log" 2>&1 || { echo "FAIL: subproject build"; cat "$tmp/ninja.log"; exit 1; }
out=$("$tmp/sub/build/consumer" --model.offload none)
[ "$out" = "steps=10 strategy=none" ] || { echo "FAIL: subproject consumer printed '$out'"; exit 1; }
echo "installed and subproject consumers work"
