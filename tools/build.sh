#!/usr/bin/env bash
# Configures (once) and builds into build/: everything (the library's tools, the
# tests and, where LibTorch is installed, primecfg-train), or only the targets named
# as arguments (tools/run.sh builds primecfg-train alone).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f build/build.ninja ]; then
  meson setup build --buildtype=release
else
  meson configure build -Dtrainer=auto -Dtests=true >/dev/null
fi
ninja -C build -j"$(nproc)" "$@"
