#!/usr/bin/env bash
# The loader compiled once (PRIMECFG_HEADER_ONLY=0, linked from
# tools/libprimecfg) behaves as the header-only one: the same program built
# both ways gives the same exit status and the same report.
#   compiled_test.sh HEADER_ONLY_EXE COMPILED_EXE SOURCE_ROOT
set -u
header_only=$1 compiled=$2 root=$3
corpus=$root/tests/corpus/prime-rl-configs/559b44772
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '[model]\noffload = "ful"\nunknown = 1\n[optim]\nlr = -1\n' >"$tmp/bad.toml"
fail=0
check() {  # NAME EXPECTED_STATUS ARGS...
  local name=$1 want=$2 a b
  shift 2
  "$header_only" "$@" >/dev/null 2>"$tmp/a"
  a=$?
  "$compiled" "$@" >/dev/null 2>"$tmp/b"
  b=$?
  if [ "$a" != "$want" ] || [ "$b" != "$want" ] || ! cmp -s "$tmp/a" "$tmp/b" ||
    { [ "$want" != 0 ] && [ ! -s "$tmp/a" ]; }; then
    echo "FAIL: $name (exit $a header-only, $b compiled; want $want)"
    diff "$tmp/a" "$tmp/b"
    fail=1
  else
    echo "ok: $name"
  fi
}
check "a valid corpus file" 0 @ "$corpus/examples/basic/reverse-text/sft.toml"
check "errors in a file and on the command line" 1 @ "$tmp/bad.toml" --model.offlod=full --optim.lr=-1
check "a missing file" 1 @ "$tmp/none.toml"
check "an argument that is not a flag" 1 stray
grep -q "5 errors in SFTConfig" <("$compiled" @ "$tmp/bad.toml" --model.offlod=full --optim.lr=-1 2>&1) ||
  { echo "FAIL: the compiled loader missed errors"; fail=1; }
exit $fail
