#!/usr/bin/env bash
# decodegraph's entry point for a fresh checkout: checks the Debian packages, configures, builds, runs.
#   scripts/dev.sh run [decode_loop options]   build and run the decode-loop program (the main job)
#   scripts/dev.sh test                        build everything and run the test suite (what CI runs)
# Environment: BUILD_DIR (default build), JOBS (default nproc), CMAKE_ARGS (extra configure flags).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-}
[ $# -gt 0 ] && shift
case "$mode" in
  run|test) ;;
  *) echo "usage: scripts/dev.sh run [decode_loop options] | scripts/dev.sh test" >&2; exit 2 ;;
esac

build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}

# ---------------------------------------------------------------- Debian packages
# libfmt-dev comes with libspdlog-dev but is named: the bench programs use fmt directly, as they
# use CLI11 and nlohmann-json.
pkgs=(cmake ninja-build g++ libspdlog-dev libfmt-dev libgtest-dev libbenchmark-dev libcli11-dev
      nlohmann-json3-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "dev.sh: installing missing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
  else
    echo "dev.sh: missing Debian packages. Run this, then run dev.sh again:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi
if [ ! -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null 2>&1; then
  echo "dev.sh: no CUDA toolkit at /usr/local/cuda: building the host parts only (host backend, CPU tests)"
fi

# ---------------------------------------------------------------- configure + build
# shellcheck disable=SC2086
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-} >/dev/null
if [ "$mode" = run ]; then
  cmake --build "$build_dir" -j "$jobs" --target decode_loop
  exec "$build_dir/bench/decode_loop" "$@"
fi
cmake --build "$build_dir" -j "$jobs"
ctest --test-dir "$build_dir" -j "$jobs" --output-on-failure
