#!/usr/bin/env bash
# Static performance report of the kernels for sm_90: resources, occupancy on an H200, the SASS
# instruction mix of the pass-1 main loop and warp-instructions per K+V byte. Predictions from what
# nvcc produced, not measurements. See docs/kernel-report.md.
#   scripts/kernel_report.sh [--json FILE] [--guard] [--verbose] [--groups 1,4,8] [--filter REGEX]
# Environment: BUILD_DIR (default build), NVCC (default /usr/local/cuda/bin/nvcc, else nvcc on PATH),
# JOBS (parallel nvcc, default nproc).
# Needs nvcc and python3 (venv). cuobjdump and nvdisasm come from PyPI into
# $BUILD_DIR/kernel-report-venv on first use (the CUDA 13.0 toolkit here ships neither).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${BUILD_DIR:-$root/build}
case "$build_dir" in /*) ;; *) build_dir=$root/$build_dir ;; esac

nvcc=${NVCC:-}
if [ -z "$nvcc" ]; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then nvcc=/usr/local/cuda/bin/nvcc; else nvcc=$(command -v nvcc || true); fi
fi
if [ -z "$nvcc" ] || [ ! -x "$nvcc" ]; then
  echo "kernel_report: nvcc not found (set NVCC or install the CUDA toolkit at /usr/local/cuda)" >&2
  exit 2
fi

# PyPI has no 13.0 build of these tools; 13.2.51 is the oldest CUDA 13 release there. They only
# read the sm_90 cubins nvcc 13.0 writes (SASS and resource tables), which 13.2 reads unchanged.
pins="nvidia-cuda-cuobjdump==13.2.51 nvidia-cuda-nvdisasm==13.2.51"
venv=$build_dir/kernel-report-venv
tools=$venv/lib/python3*/site-packages/nvidia/cu13/bin
if [ "$(cat "$venv/.pins" 2>/dev/null || true)" != "$pins" ]; then
  echo "kernel_report: installing $pins into $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  # shellcheck disable=SC2086
  "$venv/bin/pip" install --quiet --disable-pip-version-check $pins
  echo "$pins" >"$venv/.pins"
fi
# shellcheck disable=SC2086
tools=$(cd $tools && pwd)
for t in cuobjdump nvdisasm; do
  [ -x "$tools/$t" ] || { echo "kernel_report: $tools/$t missing; remove $venv and rerun" >&2; exit 2; }
done

KERNEL_REPORT_COMMAND="scripts/kernel_report.sh $*" NVCC_PATH=$nvcc exec "$venv/bin/python" "$root/scripts/kernel_report.py" \
  --tools "$tools" --build-dir "$build_dir/kernel-report" "$@"
