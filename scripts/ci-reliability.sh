#!/usr/bin/env bash
# CI reliability checks (issue 5), run by .ci/run after the main test suite:
#   1. the host code and every CPU test built and run under ASan + UBSan (preset "asan");
#   2. the soak at CI length (DECODEGRAPH_SOAK_STEPS, default 2000) in that sanitized build;
#   3. each libFuzzer target for a bounded time from the committed seed corpus (preset "fuzz");
#      skipped, saying so, when clang with libFuzzer is not installed.
# Environment: JOBS (default nproc), FUZZ_SECONDS (per target, default 30), DECODEGRAPH_SOAK_STEPS.
# Safe from a fresh clone: builds into build-asan/ and build-fuzz/ (git-ignored); the committed corpus
# is only read (new inputs go to a scratch copy).
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=${JOBS:-$(nproc)}
fuzz_seconds=${FUZZ_SECONDS:-30}
soak_steps=${DECODEGRAPH_SOAK_STEPS:-2000}
start=$(date +%s)
stage_start=$start
stage() {
  local now
  now=$(date +%s)
  echo "ci-reliability: [$((now - stage_start)) s] done: $1"
  stage_start=$now
}

# ---------------------------------------------------------------- 1. ASan + UBSan build, CPU tests
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
cmake --preset asan >/dev/null
cmake --build --preset asan -j "$jobs"
stage "sanitizer build"
# GPU tests are registered and report themselves skipped here; the soak runs on its own below.
ctest --preset asan -j "$jobs" -E '^Soak\.'
stage "CPU tests under ASan + UBSan"

# ---------------------------------------------------------------- 2. soak at CI length
DECODEGRAPH_SOAK_STEPS=$soak_steps build-asan/tests/reliability/soak_test --gtest_brief=1
stage "soak ($soak_steps steps, ASan + UBSan)"

# ---------------------------------------------------------------- 3. fuzzing
fuzz_ok=0
if ! command -v clang++ >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "ci-reliability: installing clang and its sanitizer runtimes for fuzzing"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libclang-rt-dev || true
fi
if command -v clang++ >/dev/null 2>&1 && command -v clang >/dev/null 2>&1; then
  probe=$(mktemp -d)
  echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
    >"$probe/p.cpp"
  if clang++ -fsanitize=fuzzer,address,undefined "$probe/p.cpp" -o "$probe/p" >/dev/null 2>&1; then
    fuzz_ok=1
  fi
  rm -rf "$probe"
fi
if [ "$fuzz_ok" -eq 0 ]; then
  echo "ci-reliability: SKIPPED fuzzing: clang/clang++ with libFuzzer not found" \
       "(Debian: apt-get install clang libclang-rt-dev); sanitizer build, tests and soak ran"
else
  cmake --preset fuzz >/dev/null
  cmake --build --preset fuzz -j "$jobs"
  stage "fuzz build"
  mkdir -p build-fuzz/artifacts
  for target in fuzz_plan_step fuzz_host_step; do
    work=build-fuzz/corpus/$target
    mkdir -p "$work"
    cp -n fuzz/corpus/$target/* "$work"/ 2>/dev/null || true
    # -timeout: one input running 10 s counts as a hang; -rss_limit_mb: a runaway allocation fails.
    log=build-fuzz/$target.log
    status=0
    build-fuzz/fuzz/$target -max_total_time="$fuzz_seconds" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix=build-fuzz/artifacts/$target- "$work" >"$log" 2>&1 || status=$?
    grep -E '^#[0-9]+ +(INITED|DONE)|^Done|stat::number_of_executed_units' "$log" || true
    if [ "$status" -ne 0 ]; then
      tail -n 60 "$log" >&2
      echo "ci-reliability: $target FAILED (exit $status); reproducer in build-fuzz/artifacts/, log $log" >&2
      exit 1
    fi
    stage "$target for $fuzz_seconds s"
  done
fi

echo "ci-reliability: all reliability checks passed in $(( $(date +%s) - start )) s"
