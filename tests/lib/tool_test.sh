#!/usr/bin/env bash
# The primecfg command-line tool: exit codes and reports, as a user sees them.
set -u
primecfg=$1
root=$2
corpus="$root/tests/corpus/prime-rl-configs/559b44772"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

expect() {  # expect DESCRIPTION EXIT_CODE COMMAND...
  local what=$1 want=$2
  shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local got=$?
  if [ "$got" != "$want" ]; then
    echo "FAIL: $what: exit $got, wanted $want"; cat "$tmp/out" "$tmp/err"; failures=$((failures + 1))
  fi
}
contains() {  # contains DESCRIPTION FILE TEXT
  if ! grep -qF -- "$3" "$2"; then
    echo "FAIL: $1: '$3' not in:"; cat "$2"; failures=$((failures + 1))
  fi
}

expect "a valid SFT file" 0 "$primecfg" validate --as sft "$corpus/configs/basic/reverse-text/sft.toml"
contains "success message" "$tmp/out" "ok: valid SFTConfig"
expect "the root type is inferred" 0 "$primecfg" validate "$corpus/examples/basic/reverse-text/rl.toml"
expect "options after the files" 0 "$primecfg" validate "$corpus/configs/debug/fake/sft.toml" --model.offload=none --as sft

cat >"$tmp/four.toml" <<'TOML'
[model]
offload = "full"
nmae = "x"

[optim]
type = "muon"
lr = -1.0

[data]
type = "fake"
length = "fixd"
TOML
expect "four mistakes" 1 "$primecfg" validate --as sft "$tmp/four.toml"
contains "unknown key" "$tmp/err" "four.toml:3:1: error: model.nmae: unknown key 'nmae' in [model]; did you mean 'name'? [extra_forbidden]"
contains "bad enum" "$tmp/err" "four.toml:11:10: error: data.length: expected one of 'fixed', 'variable'; did you mean 'fixed'? [literal_error]"
contains "negative lr" "$tmp/err" "four.toml:7:6: error: optim.lr: must be greater than or equal to 0 [greater_than_equal]"
contains "offload rule" "$tmp/err" "four.toml:2:11: error: model.offload: offload = \"full\" supports only optimizer type adamw or sign_sgd"
contains "summary" "$tmp/err" "4 errors in SFTConfig"

# Machine output on stdout: `primecfg validate f --errors=json | jq` works.
expect "the same as JSON" 1 "$primecfg" validate --as sft "$tmp/four.toml" --errors=json
contains "only a summary on stderr" "$tmp/err" "4 errors in SFTConfig (the JSON report is on standard output)"
if [ "$(wc -l <"$tmp/err")" -ne 1 ]; then echo "FAIL: --errors=json wrote its report to stderr:"; cat "$tmp/err"; failures=$((failures + 1)); fi
python3 - "$tmp/out" <<'PY' || failures=$((failures + 1))
import json, sys
errors = json.load(open(sys.argv[1]))
kinds = sorted(e["kind"] for e in errors)
assert kinds == ["extra_forbidden", "greater_than_equal", "literal_error", "value_error"], kinds
assert all(e["file"].endswith("four.toml") and e["line"] > 0 for e in errors), errors
PY

expect "a valid file as JSON" 0 "$primecfg" validate --as sft "$corpus/configs/debug/fake/sft.toml" --errors=json
python3 -c 'import json, sys; assert json.load(open(sys.argv[1])) == []' "$tmp/out" ||
  { echo "FAIL: a valid file's JSON report is not []:"; cat "$tmp/out"; failures=$((failures + 1)); }
expect "a dump that fails, as JSON" 1 "$primecfg" dump --as sft "$tmp/four.toml" --errors=json
python3 -c 'import json, sys; assert len(json.load(open(sys.argv[1]))) == 4' "$tmp/out" ||
  { echo "FAIL: a failed dump's JSON report is not on stdout:"; cat "$tmp/out"; failures=$((failures + 1)); }

printf 'max_steps = 3\n[model]\nname = = "x"\n' >"$tmp/syntax.toml"
expect "a TOML syntax error" 1 "$primecfg" validate --as sft "$tmp/syntax.toml"
contains "syntax position" "$tmp/err" "syntax.toml:3:8: error: invalid TOML"

# toml++ 3.3 garbles a quoted duplicate key (marzer/tomlplusplus#300): named as written, at the key.
printf '[model]\nname = "a"\n"name" = "b"\n' >"$tmp/dup.toml"
expect "a duplicate quoted key" 1 "$primecfg" validate --as sft "$tmp/dup.toml"
contains "the key as written, at the key" "$tmp/err" "dup.toml:3:1: error: invalid TOML: Error while parsing key-value pair: cannot redefine existing string '\"name\"' [toml_syntax]"

expect "a missing file" 2 "$primecfg" validate --as sft "$tmp/nope.toml"
contains "missing file message" "$tmp/err" "nope.toml: error: cannot open"
expect "a directory" 2 "$primecfg" validate --as sft "$tmp"
expect "a bad --as" 2 "$primecfg" validate --as ppo "$tmp/four.toml"
expect "an unknown command" 2 "$primecfg" frobnicate
for help in --help -h; do
  expect "primecfg $help" 0 "$primecfg" "$help"
  contains "primecfg $help prints the usage" "$tmp/out" "usage: primecfg COMMAND"
done
expect "schema into a folder that does not exist" 2 "$primecfg" schema --out-dir "$tmp/no/such/dir"
contains "the folder, named with a colon" "$tmp/err" "primecfg: error: --out-dir $tmp/no/such/dir: No such file or directory"
if grep -q '\.tmp' "$tmp/err"; then echo "FAIL: the temporary file is named"; failures=$((failures + 1)); fi
expect "an override that names no field" 1 "$primecfg" validate --as sft "$corpus/configs/debug/fake/sft.toml" --model.ofload=full
contains "flag suggestion" "$tmp/err" "did you mean '--model.offload'?"

expect "dump" 0 "$primecfg" dump --as sft "$corpus/configs/debug/fake/sft.toml" --model.offload=none
cp "$tmp/out" "$tmp/dumped.toml"
contains "provenance comment" "$tmp/dumped.toml" 'offload = "none"  # command line --model.offload'
expect "the dump is valid" 0 "$primecfg" validate --as sft "$tmp/dumped.toml"
expect "dumping the dump" 0 "$primecfg" dump --as sft "$tmp/dumped.toml" --format=json
cp "$tmp/out" "$tmp/second.json"
expect "JSON of the original" 0 "$primecfg" dump --as sft "$corpus/configs/debug/fake/sft.toml" --model.offload=none --format=json
if ! cmp -s "$tmp/out" "$tmp/second.json"; then echo "FAIL: dump round trip changed the config"; failures=$((failures + 1)); fi

# Issue 16: nothing a user wrote is dropped (more in tests/lib/guarantees_test.cpp).
printf '[optim]\nlr = 3e-4\n' >"$tmp/lr.toml"
printf '[optim]\ntype = "muon"\n' >"$tmp/muon.toml"
expect "a later file switching the optimizer" 0 "$primecfg" dump --as sft @ "$tmp/lr.toml" @ "$tmp/muon.toml"
contains "lr carried over to muon" "$tmp/out" "lr = 0.0003  # $tmp/lr.toml:2:6"
expect "flags in either order" 0 "$primecfg" dump --as sft "$tmp/lr.toml" --optim.lr=1 --optim.type=muon
contains "lr from the flag" "$tmp/out" "lr = 1.0  # command line --optim.lr"
expect "a value given twice" 0 "$primecfg" validate --as sft "$tmp/lr.toml" --max-steps=1 --max-steps=2
contains "the note" "$tmp/err" "note: max_steps: max_steps is given twice on the command line"
expect "--no-ckpt with a ckpt field" 1 "$primecfg" validate --as sft "$tmp/lr.toml" --ckpt.interval=5 --no-ckpt
expect "typed opaque values" 0 "$primecfg" dump --as sft "$tmp/lr.toml" --eval.flag=false --eval.n=6
contains "a boolean" "$tmp/out" "flag = false"
contains "an integer" "$tmp/out" "n = 6"

# Floats are written as the shortest text that reads back as the same double,
# everywhere: schema, dumps (TOML, JSON, kept tables) and error messages.
printf '[optim]\nlr = -0.85\n[eval]\nx = 0.85\n' >"$tmp/floats.toml"
expect "a float in an error message" 1 "$primecfg" validate --as sft "$tmp/floats.toml"
contains "shortest input" "$tmp/err" "(input: -0.85)"
expect "the schema" 0 "$primecfg" schema --as sft
contains "shortest default in the schema" "$tmp/out" '"default" : 1e-06'
contains "shortest default in the schema" "$tmp/out" '"default" : 0.9,'
printf '[optim]\nlr = 0.85\n[eval]\nx = 0.85\n' >"$tmp/floats.toml"
expect "a JSON dump" 0 "$primecfg" dump --as sft "$tmp/floats.toml" --format=json
contains "shortest float in a JSON dump" "$tmp/out" '"lr" : 0.85,'
expect "a TOML dump" 0 "$primecfg" dump --as sft "$tmp/floats.toml"
contains "shortest float in a kept table" "$tmp/out" "x = 0.85"
for f in "$tmp/err" "$tmp/out" "$root"/schemas/*.json; do
  if grep -qE '[0-9]\.?[0-9]{15}' "$f"; then echo "FAIL: a float with 16 digits or more in $f"; failures=$((failures + 1)); fi
done

expect "help" 0 "$primecfg" help --as sft
contains "help lists offload" "$tmp/out" "--model.offload {none|optimizer|full}"

expect "reference" 0 "$primecfg" reference
if ! cmp -s "$tmp/out" "$root/docs/config-reference.md"; then
  echo "FAIL: docs/config-reference.md is stale: run 'ninja -C build docs' and commit it"; failures=$((failures + 1))
fi

if [ "$failures" -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "all tool checks passed"
