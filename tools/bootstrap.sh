#!/usr/bin/env bash
# Installs everything primecfg needs on a fresh Debian 12 machine (as root, or
# with sudo). Safe to run again: it only installs what is missing.
set -euo pipefail

need_apt=()
# clang + libclang-rt-14-dev: the libFuzzer targets and tools/sanitize.sh.
# libxxhash-dev: the checksums of checkpoint manifests.
# nlohmann-json3-dev: every JSON file primecfg-train reads or writes.
# libgloo-dev: the Gloo headers LibTorch's c10d headers include (the torch wheel ships
#   Gloo's code, not its headers); sharded runs on CPUs use torch's ProcessGroupGloo.
for pkg in g++ meson ninja-build pkg-config libfmt-dev libtomlplusplus-dev doctest-dev \
           libboost1.81-dev libhwloc-dev libxxhash-dev nlohmann-json3-dev libgloo-dev clang-format clang libclang-rt-14-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if ((${#need_apt[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# LibTorch comes from the torch wheel (CPU build on this kind of machine).
if ! python3 -c 'import torch' >/dev/null 2>&1; then
  python3 -m pip install -q torch==2.13.0
fi
# The model is tested against transformers (tests/trainer/hf_parity_test.py) and
# tools/tokenize_jsonl.py uses its tokenizers; pinned, so the reference stays fixed.
if ! python3 -c 'import transformers, sys; sys.exit(transformers.__version__ != "5.24.0")' >/dev/null 2>&1; then
  python3 -m pip install -q transformers==5.24.0
fi
# The schema test cross-checks primecfg against an independent validator.
if ! command -v check-jsonschema >/dev/null 2>&1; then
  python3 -m pip install -q check-jsonschema
fi
