#!/usr/bin/env bash
# Installs what is missing, builds everything and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/bootstrap.sh
bash tools/build.sh
# The tests run with a temporary folder of their own (TMPDIR), which they must leave
# empty: a test that keeps files after it passed fills a user's /tmp run after run.
tmp=$(mktemp -d "${TMPDIR:-/tmp}/primecfg-tests-XXXXXX")
# torch's compiled-kernel cache is meant to outlive a run: it goes under build/, not there.
export TORCHINDUCTOR_CACHE_DIR="$PWD/build/torchinductor-cache"
TMPDIR=$tmp meson test -C build --print-errorlogs --num-processes 2
left=$(find "$tmp" -mindepth 1 -maxdepth 2 | head -20)
if [ -n "$left" ]; then
  echo "error: the tests passed but left files in their temporary folder $tmp:" >&2
  echo "$left" >&2
  exit 1
fi
rmdir "$tmp"
