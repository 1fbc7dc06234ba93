#!/usr/bin/env bash
# Installs what is missing, builds everything and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/bootstrap.sh
bash tools/build.sh
meson test -C build --print-errorlogs --num-processes 2
