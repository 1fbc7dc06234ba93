# Sourced by the GPU benchmark scripts (from the repository root): finds the
# torch install (PY), puts its libraries on LD_LIBRARY_PATH and sets TRAIN to a
# primecfg-train binary: $PRIMECFG_BIN/primecfg-train, or one built into
# build-bench with meson (logged to $RES/build.log).
PY=${PY:-/opt/torch/.venv/bin/python3}
TD=$("$PY" -c 'import torch, os; print(os.path.dirname(torch.__file__))')
NV=$(dirname "$TD")/nvidia
export LD_LIBRARY_PATH="$TD/lib:$NV/cu13/lib:$NV/nccl/lib:${LD_LIBRARY_PATH:-}"

# nlohmann/json, when it comes unpacked under .deps/ (docs/trainer.md, GPU smoke).
[ -d .deps/nlohmann/usr/share/pkgconfig ] &&
  export PKG_CONFIG_PATH="$PWD/.deps/nlohmann/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"

BIN=${PRIMECFG_BIN:-}
if [ -z "$BIN" ]; then
  TOML=()
  [ -d .deps/tomlpp/usr/include ] && TOML=(-Dtoml_include_dir="$PWD/.deps/tomlpp/usr/include")
  # Gloo's headers (libgloo-dev, unpacked): LibTorch's c10d headers include them.
  [ -d .deps/gloo/usr/include ] && TOML+=(-Dgloo_include_dir="$PWD/.deps/gloo/usr/include")
  [ -f build-bench/build.ninja ] ||
    PATH=$(dirname "$PY"):$PATH meson setup build-bench "${TOML[@]}" >"$RES/build.log" 2>&1 ||
    { cat "$RES/build.log"; exit 1; }
  ninja -C build-bench -j"$(nproc)" reference_trainer/primecfg-train >>"$RES/build.log" 2>&1 ||
    { tail -50 "$RES/build.log"; exit 1; }
  BIN=$PWD/build-bench/reference_trainer
fi
TRAIN=$BIN/primecfg-train
