#!/usr/bin/env bash
# The test suite under AddressSanitizer + UndefinedBehaviorSanitizer, then each
# libFuzzer target for a bounded time (issue 7; docs/reliability.md).
#
#   bash tools/sanitize.sh
#
# Environment:
#   FUZZ_SECONDS=60        how long each fuzz target runs (e.g. 10 for a quick local run)
#   SANITIZE_JOBS=2        parallel compile jobs, and how many fuzz targets run side by side
#   SANITIZE_SKIP_FUZZ=1   only the sanitized test suite
#   SANITIZE_SKIP_TESTS=1  only the fuzz targets
#   SANITIZE_TRAINER=0     without the trainer's CPU tests (see below)
#   SANITIZE_DISTRIBUTED_SHARD=1/3  which of the distributed cases run instrumented
#                          (PRIMECFG_TEST_SHARD of tests/trainer/distributed_test.py; 0/1: all)
#
# Build folders: build-asan (g++, -Db_sanitize=address,undefined) and build-fuzz
# (clang++, -Dfuzz=true). The fuzz corpora grow in build-fuzz/fuzz-corpus/ and
# are reused by the next run; a crashing input lands in build-fuzz/fuzz-artifacts/.
#
# The trainer's CPU tests (tests/trainer: training runs, offload equivalence,
# resume, the planner) run too when LibTorch is installed: primecfg's code
# around LibTorch is instrumented, LibTorch itself is not (ASan does not need
# it to be). Leak checking is off for them only: LibTorch keeps registries and
# thread pools alive until exit. SANITIZE_TRAINER=0 leaves them out.
# The compile-fail test is skipped: it checks that code does not compile.
# `compiled loader` runs the same program built header-only and against the
# compiled loader (PRIMECFG_HEADER_ONLY=0), both instrumented.
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=${SANITIZE_JOBS:-2}
fuzz_seconds=${FUZZ_SECONDS:-60}
start=$SECONDS
say() { printf '== sanitize: %s (%ds)\n' "$*" $((SECONDS - start)); }

# Stop at the first report, with a stack, from every instrumented process
# (the tests start the tools, which inherit this).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

if [ "${SANITIZE_SKIP_TESTS:-0}" != 1 ]; then
  say "configuring build-asan"
  # -g1: line tables are all a report's stack needs; full debug info of the LibTorch
  # headers more than doubled the one trainer object measured, and CI's disk can be small.
  asan_args="-g1 -fno-sanitize-recover=undefined -fno-omit-frame-pointer -D_GLIBCXX_ASSERTIONS"
  trainer_opt=auto
  [ "${SANITIZE_TRAINER:-1}" = 0 ] && trainer_opt=disabled
  if [ ! -f build-asan/build.ninja ]; then
    meson setup build-asan -Dtrainer=$trainer_opt -Dbuildtype=custom -Doptimization=1 -Ddebug=true \
      -Db_sanitize=address,undefined "-Dcpp_args=$asan_args" >/dev/null
  else
    meson configure build-asan -Dtrainer=$trainer_opt "-Dcpp_args=$asan_args" >/dev/null
    ninja -C build-asan build.ninja >/dev/null  # regenerate now: the test list below reads it
  fi
  targets=(tests/lib/primecfg-lib-tests tools/primecfg/primecfg tools/primecfg-migrate/primecfg-migrate
           tests/migrate/test_migrate tests/migrate/primecfg-migrate-faulty tests/bad_input/bad-input-tests
           bench/library/load_sft bench/library/load_sft_compiled)
  tests=(library 'compiled loader' 'primecfg tool' migrate 'bad input')
  # The kernels' tests, when this build has them (they need no LibTorch).
  for t in cpu_optim cpu_optim_numa; do
    if meson introspect --tests build-asan | grep -q "\"name\": \"$t\""; then
      targets+=("tests/cpu_optim/test_$t")
      tests+=("$t")
    fi
  done
  if command -v check-jsonschema >/dev/null 2>&1; then tests+=(schemas); fi
  trainer_tests=()
  if meson introspect --tests build-asan | grep -q '"name": "trainer"'; then
    targets+=(tests/trainer/trainer_tests reference_trainer/primecfg-train)
    trainer_tests=(trainer trainer-plan trainer-plan-json trainer-plan-bad-size trainer-plan-flag-alone
                   trainer-plan-bad-model trainer-reliability trainer-distributed)
  fi
  say "building ${#targets[@]} targets with ASan+UBSan"
  ninja -C build-asan -j "$jobs" "${targets[@]}"
  say "running: ${tests[*]}"
  meson test -C build-asan --no-rebuild --print-errorlogs --num-processes "$jobs" "${tests[@]}"
  if ((${#trainer_tests[@]})); then
    say "running the trainer's CPU tests: ${trainer_tests[*]}"
    # The distributed cases: a third of them (every third from the second: 2 and 4 ranks in
    # each mode, Qwen3-MoE with and without expert parallelism, HSDP, resuming on other
    # ranks, a killed rank, a failed write). They all ran uninstrumented in tools/test.sh,
    # and the whole suite instrumented took 9 of CI's 80 minutes (docs/reliability.md).
    ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0" PRIMECFG_TEST_SHARD=${SANITIZE_DISTRIBUTED_SHARD:-1/3} \
      meson test -C build-asan --no-rebuild --print-errorlogs --num-processes 1 --timeout-multiplier 4 \
      "${trainer_tests[@]}"
  fi
  say "sanitized tests passed"
fi

if [ "${SANITIZE_SKIP_FUZZ:-0}" = 1 ]; then
  say "done (fuzzing skipped)"
  exit 0
fi

# libFuzzer comes with clang; Debian 12's clang 14 needs libclang-rt-14-dev for it.
if ! command -v clang++ >/dev/null 2>&1 || ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
    clang++ -x c++ -fsanitize=fuzzer - -o /dev/null 2>/dev/null; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing clang and libFuzzer (clang libclang-rt-14-dev)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libclang-rt-14-dev >/dev/null
  else
    echo "sanitize: clang++ with libFuzzer is needed: apt-get install clang libclang-rt-14-dev" >&2
    exit 1
  fi
fi

say "configuring build-fuzz"
if [ ! -f build-fuzz/build.ninja ]; then
  CXX=clang++ meson setup build-fuzz -Dfuzz=true -Dtests=false -Dtrainer=disabled -Dbuildtype=custom \
    -Doptimization=1 -Ddebug=true >/dev/null
fi
say "building the fuzz targets"
# fuzz_load and fuzz_migrate: the config library and primecfg-migrate's engine;
# the other four: what the trainer parses (issue 16), torch-free.
fuzz_names=(load migrate safetensors hf_config jsonl checkpoint)
ninja -C build-fuzz -j "$jobs" "${fuzz_names[@]/#/tests/fuzz/fuzz_}" fuzz_dictionaries

fuzz_dir=build-fuzz/tests/fuzz
run_target() {  # run_target NAME SEED_DIR...
  local name=$1
  shift
  local corpus=build-fuzz/fuzz-corpus/$name artifacts=build-fuzz/fuzz-artifacts
  mkdir -p "$corpus" "$artifacts"
  # The generated dictionary (from the config structs), else the one in tests/fuzz/dicts/.
  local dict=$fuzz_dir/$name.dict
  [ -f "$dict" ] || dict=tests/fuzz/dicts/$name.dict
  # -timeout: one input running longer than 20 s counts as a hang (a crash);
  # -rss_limit_mb: so does using more than 2 GiB.
  "$fuzz_dir/fuzz_$name" -dict="$dict" -max_total_time="$fuzz_seconds" -timeout=20 \
    -rss_limit_mb=2048 -max_len=16384 -print_final_stats=1 -artifact_prefix="$artifacts/$name-" \
    "$corpus" "$@" >"build-fuzz/fuzz-$name.log" 2>&1
}
summary() {  # the figures docs/reliability.md reports
  local name=$1 log=build-fuzz/fuzz-$1.log
  local execs cov corpus
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
  cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -1 || true)
  corpus=$(find "build-fuzz/fuzz-corpus/$name" -type f | wc -l)
  say "fuzz_$name: ${execs} inputs in ${fuzz_seconds}s, ${cov:-no coverage line}, corpus ${corpus} files"
}

seeds_of() {  # the seed folders of a target
  case $1 in
    load) echo tests/fuzz/seeds/load tests/corpus/prime-rl-configs tests/lib/schema_cases ;;
    migrate) echo tests/fuzz/seeds/migrate tests/corpus/prime-rl-configs tests/migrate/golden ;;
    *) echo "tests/fuzz/seeds/$1" ;;
  esac
}
say "fuzzing each of ${#fuzz_names[@]} targets for ${fuzz_seconds}s (${jobs} at a time)"
status=0
pids=()
for name in "${fuzz_names[@]}"; do
  # shellcheck disable=SC2046  # the seed folders are words
  run_target "$name" $(seeds_of "$name") &
  pids+=($!)
  if ((${#pids[@]} >= jobs)); then
    wait "${pids[0]}" || status=1
    pids=("${pids[@]:1}")
  fi
done
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
for name in "${fuzz_names[@]}"; do summary "$name"; done
if [ "$status" -ne 0 ]; then
  echo "sanitize: a fuzz target found a problem; the end of its log:" >&2
  for name in "${fuzz_names[@]}"; do
    if grep -qE 'ERROR|fuzz property violated|deadly signal|Timeout|out-of-memory' "build-fuzz/fuzz-$name.log"; then
      tail -n 60 "build-fuzz/fuzz-$name.log" >&2
    fi
  done
  ls build-fuzz/fuzz-artifacts >&2
  exit 1
fi
say "done"
