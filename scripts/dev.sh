#!/usr/bin/env bash
# decodegraph's entry point for a fresh checkout: checks the Debian packages, configures, builds, runs.
#   scripts/dev.sh run [decode_loop options]   build and run the decode-loop program (the main job)
#   scripts/dev.sh test                        build everything and run the test suite (what CI runs)
# Environment: BUILD_DIR (default build; build-host for `run` without a GPU), JOBS (default nproc),
# CMAKE_ARGS (extra configure flags), DEV_CUDA=1 (`run`: build the CUDA kernels even without a GPU).
#
# Without a GPU (no NVIDIA driver, or no device) `run` builds decode_loop host-only: the CUDA
# kernels (sm_80 and sm_90) are most of the build and cannot run here. `test` always builds
# everything, as CI does (the simulator and the static kernel guard need the CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-}
[ $# -gt 0 ] && shift
case "$mode" in
  run|test) ;;
  *) echo "usage: scripts/dev.sh run [decode_loop options] | scripts/dev.sh test" >&2; exit 2 ;;
esac

jobs=${JOBS:-$(nproc)}
start=$(date +%s)

# A GPU this process could use: the driver lists a device (nvidia-smi), or a device node exists.
gpu_present() {
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && return 0
    return 1
  fi
  compgen -G '/dev/nvidia[0-9]*' >/dev/null
}

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

# ---------------------------------------------------------------- configure
cmake_args=${CMAKE_ARGS:-}
build_dir=${BUILD_DIR:-build}
if [ "$mode" = run ] && ! gpu_present && [ "${DEV_CUDA:-0}" != 1 ] && [[ "$cmake_args" != *DECODEGRAPH_ENABLE_CUDA* ]]; then
  build_dir=${BUILD_DIR:-build-host}
  cmake_args="$cmake_args -DDECODEGRAPH_ENABLE_CUDA=OFF"
  echo "dev.sh: no GPU here (no NVIDIA driver or device): building decode_loop host-only in $build_dir, about"
  echo "        1 to 2 min on 2 cores; it runs on the host backend. The CUDA kernels (sm_80, sm_90) would add"
  echo "        several minutes and cannot run here; DEV_CUDA=1 builds them anyway, 'dev.sh test' always does."
fi
# Configure's own summary (the decodegraph: lines), the rest of its output only on failure.
# shellcheck disable=SC2086
if ! cfg_out=$(cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release $cmake_args 2>&1); then
  echo "$cfg_out" >&2
  exit 1
fi

if [ "$mode" = run ]; then
  cmake --build "$build_dir" -j "$jobs" --target decode_loop
  echo "dev.sh: built in $(( $(date +%s) - start )) s; running $build_dir/bench/decode_loop $*"
  exec "$build_dir/bench/decode_loop" "$@"
fi

# ---------------------------------------------------------------- test: summary, estimate, build, run
cuda=OFF
echo "$cfg_out" | grep -q '^-- decodegraph: CUDA ' && cuda=ON
echo "dev.sh test: configuration"
echo "$cfg_out" | grep -E '^-- decodegraph' | sed 's/^-- /  /'
echo "  build dir $build_dir, Release, $jobs parallel jobs, $(nproc) cores, GPU present: $(gpu_present && echo yes || echo no)"
# CPU minutes of a run from scratch, measured on a 2-core machine shared with other builds
# (README.md, "Quick start"): 13 with CUDA, 11 host-only. Wall time ~ 1.4 x CPU / jobs when the
# machine is quiet, up to twice that when it is not. An incremental rebuild is much shorter.
if [ "$cuda" = ON ]; then cpu=13; else cpu=11; fi
est=$(( (cpu * 14 / 10 + jobs - 1) / jobs ))
echo "  estimate from scratch: about $est min, up to $(( 2 * est )) on a busy machine (build $( [ "$cuda" = ON ] && echo 'with every CUDA kernel, for the simulator and the GPU tests' || echo 'host-only') + ctest)"
cmake --build "$build_dir" -j "$jobs"
ctest --test-dir "$build_dir" -j "$jobs" --output-on-failure
echo "dev.sh test: done in $(( ($(date +%s) - start) / 60 )) min $(( ($(date +%s) - start) % 60 )) s"
