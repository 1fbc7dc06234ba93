# Sourced by the GPU benchmark scripts (from the repository root, RES set): finds the
# torch install (PY), puts its libraries on LD_LIBRARY_PATH and sets TRAIN to a
# primecfg-train binary: $PRIMECFG_BIN/primecfg-train, or one built into build-bench
# with meson (logged to $RES/build.log; BUILD_TARGETS adds targets to the build, e.g. the
# GPU tests). GPUTESTS is trainer_gpu_tests beside it, where there is one.
PY=${PY:-/opt/torch/.venv/bin/python3}
TD=$("$PY" -c 'import torch, os; print(os.path.dirname(torch.__file__))')
NV=$(dirname "$TD")/nvidia
export LD_LIBRARY_PATH="$TD/lib:$NV/cu13/lib:$NV/nccl/lib:${LD_LIBRARY_PATH:-}"

# Headers and libraries the GPU machine lacks, when they come unpacked under .deps/
# (docs/trainer.md, "On the GPU machine"): nlohmann/json and xxHash through pkg-config
# (xxHash's library at run time too), toml++ and Gloo's headers through meson options.
[ -d .deps/nlohmann/usr/share/pkgconfig ] &&
  export PKG_CONFIG_PATH="$PWD/.deps/nlohmann/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
if [ -d .deps/xxhash/usr/lib/x86_64-linux-gnu ]; then
  export PKG_CONFIG_PATH="$PWD/.deps/xxhash/usr/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export CPATH="$PWD/.deps/xxhash/usr/include${CPATH:+:$CPATH}"
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$PWD/.deps/xxhash/usr/lib/x86_64-linux-gnu"
fi
MESON_DEPS=()
[ -d .deps/tomlpp/usr/include ] && MESON_DEPS+=(-Dtoml_include_dir="$PWD/.deps/tomlpp/usr/include")
# Gloo's headers (libgloo-dev, unpacked): LibTorch's c10d headers include them.
[ -d .deps/gloo/usr/include ] && MESON_DEPS+=(-Dgloo_include_dir="$PWD/.deps/gloo/usr/include")

BIN=${PRIMECFG_BIN:-}
if [ -z "$BIN" ]; then
  t0=$(date +%s)
  [ -f build-bench/build.ninja ] ||  # kept from an earlier call: ninja rebuilds what changed
    PATH=$(dirname "$PY"):$PATH meson setup build-bench "${MESON_DEPS[@]}" >"$RES/build.log" 2>&1 ||
    { cat "$RES/build.log"; exit 1; }
  ninja -C build-bench -j"$(nproc)" reference_trainer/primecfg-train ${BUILD_TARGETS:-} >>"$RES/build.log" 2>&1 ||
    { tail -50 "$RES/build.log"; exit 1; }
  echo "build took $(($(date +%s) - t0)) s"
  BIN=$PWD/build-bench/reference_trainer
  GPUTESTS=$PWD/build-bench/tests/trainer/trainer_gpu_tests
else
  GPUTESTS=$BIN/trainer_gpu_tests
  # PRIMECFG_BIN may be a meson build's reference_trainer/ folder.
  [ -x "$GPUTESTS" ] || GPUTESTS=$BIN/../tests/trainer/trainer_gpu_tests
fi
TRAIN=$BIN/primecfg-train
