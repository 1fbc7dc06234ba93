#!/usr/bin/env bash
# The main job: installs what is missing, builds, and trains the reference
# model on its embedded default (a small Llama-style model learning to
# reverse text, on CPU or GPU). Arguments go to primecfg-train.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/bootstrap.sh
# Only what the run needs: the tests are built by tools/test.sh.
bash tools/build.sh reference_trainer/primecfg-train
exec ./build/reference_trainer/primecfg-train "$@"
