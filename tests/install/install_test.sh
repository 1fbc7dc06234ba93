#!/usr/bin/env bash
# `meson install` puts the headers, primecfg.pc, libprimecfg-compiled.a and
# primecfg-compiled.pc in place, and a program of another project builds
# against that installed copy (through pkg-config) in both modes, header-only
# and with the loader compiled once, and against primecfg used as a meson
# subproject.
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
# A program built on primecfg offers --help, generated from its fields.
"$tmp/consumer" --help >"$tmp/help" || { echo "FAIL: consumer --help did not exit 0"; exit 1; }
grep -q -- "--steps INT (>= 1)" "$tmp/help" || { echo "FAIL: consumer --help:"; cat "$tmp/help"; exit 1; }

# 1a. The consumer's own standard: C++20 or later, never forced. A C++23
# consumer is compiled as C++23 (no -std=c++20 from the .pc after its own), and
# a C++17 one stops with primecfg's message, not with errors deep in the headers.
for pcname in primecfg primecfg-compiled; do
  case " $(pkg-config --cflags "$pcname") " in *" -std="*) echo "FAIL: $pcname.pc sets the C++ standard"; exit 1 ;; esac
done
printf '#include <primecfg/load.hpp>\nstatic_assert(__cplusplus > 202002L, "compiled as C++20, not C++23");\nint main() {}\n' \
  >"$tmp/cxx23.cpp"
# shellcheck disable=SC2086
"$cxx" -std=c++23 -fsyntax-only "$tmp/cxx23.cpp" $(pkg-config --cflags primecfg) 2>"$tmp/cxx23.err" ||
  { echo "FAIL: a C++23 consumer is not compiled as C++23:"; cat "$tmp/cxx23.err"; exit 1; }
# shellcheck disable=SC2086
if "$cxx" -std=c++17 -fsyntax-only "$source_root/tests/install/consumer/main.cpp" $flags 2>"$tmp/cxx17.err"; then
  echo "FAIL: a C++17 consumer compiled"; exit 1
fi
grep -q "primecfg needs C++20 or later" "$tmp/cxx17.err" ||
  { echo "FAIL: a C++17 consumer did not get primecfg's message:"; head -5 "$tmp/cxx17.err"; exit 1; }

# 1b. The compiled loader through pkg-config: primecfg-compiled.pc gives the
# defines, the static library and fmt; the consumer's own object file holds no
# loader (it is undefined there, defined in the library).
[ -f "$(dirname "$pc")/primecfg-compiled.pc" ] || { echo "FAIL: no primecfg-compiled.pc installed"; exit 1; }
[ -n "$(find "$tmp/stage" -name libprimecfg-compiled.a)" ] || { echo "FAIL: libprimecfg-compiled.a not installed"; exit 1; }
cflags=$(pkg-config --cflags primecfg-compiled)
libs=$(pkg-config --libs primecfg-compiled)
for want in -DPRIMECFG_HEADER_ONLY=0 -DTOML_HEADER_ONLY=0; do
  case " $cflags " in *" $want "*) ;; *) echo "FAIL: primecfg-compiled.pc lacks $want: $cflags"; exit 1 ;; esac
done
# shellcheck disable=SC2086
"$cxx" -std=c++20 -O0 -c "$source_root/tests/install/consumer/main.cpp" $cflags -o "$tmp/consumer-compiled.o"
nm -C "$tmp/consumer-compiled.o" >"$tmp/symbols"  # to a file: `nm | grep -q` fails under pipefail
grep -q " U primecfg::detail::load_sources(" "$tmp/symbols" ||
  { echo "FAIL: the compiled-mode consumer compiled the loader itself"; exit 1; }
# shellcheck disable=SC2086
"$cxx" "$tmp/consumer-compiled.o" $libs -o "$tmp/consumer-compiled"
out=$("$tmp/consumer-compiled" @ "$tmp/run.toml" --steps 3)
[ "$out" = "steps=3 strategy=full" ] || { echo "FAIL: compiled-mode consumer printed '$out'"; exit 1; }
if "$tmp/consumer-compiled" --steps 0 2>"$tmp/err-compiled"; then echo "FAIL: compiled mode accepted an invalid config"; exit 1; fi
cmp -s "$tmp/err" "$tmp/err-compiled" || { echo "FAIL: the two modes report differently"; diff "$tmp/err" "$tmp/err-compiled"; exit 1; }

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
echo "installed (header-only and compiled) and subproject consumers work"
