#!/usr/bin/env bash
# CI static guard of the kernels (issue 9): compiles kernels/inst/*.cu for sm_90 and runs
# scripts/kernel_report.sh --guard, which fails unless
#   1. no kernel spills or uses local memory;
#   2. no pass-1 main loop has scalar 2-byte or 1-byte shared stores (STS.U16 / STS.16, STS.U8);
#   3. pass 1 for bf16, head 128, GQA 4 executes at most 0.15 warp-instructions per K+V byte in both
#      layouts (the tensor-core math with its precise hi / lo weights), and for fp8 caches (E4M3 and
#      E5M2, head 128, GQA 4, both layouts) at most 0.30 (two values a byte);
#   4. a main loop with its logit soft-cap block is at most 1.10x the same loop without it;
#   5. the report's probe launched every kernel (so 1-4 could be checked).
# A regression guard read off the SASS, not a performance claim (docs/kernel-report.md).
# Before the guard, scripts/kernel_report/selftest.py checks the report on two fixture kernels (one
# shaped like the coming pass-1 kernel, one the guard must reject).
# Safe from a fresh clone: the report creates its venv (cuobjdump, nvdisasm from PyPI) under
# $BUILD_DIR (default build). Skips, exit 0, only when nvcc is absent. About 1.5 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
nvcc=${NVCC:-}
if [ -z "$nvcc" ]; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then nvcc=/usr/local/cuda/bin/nvcc; else nvcc=$(command -v nvcc || true); fi
fi
if [ -z "$nvcc" ]; then
  echo "ci-static: SKIPPED: nvcc not found (no CUDA toolkit at /usr/local/cuda or on PATH); the static guard needs it"
  exit 0
fi
export NVCC=$nvcc
status=0
# First the report itself, on its fixtures (scripts/kernel_report/selftest.py).
python3 scripts/kernel_report/selftest.py "${BUILD_DIR:-build}" || status=$?
scripts/kernel_report.sh --guard "$@" || status=$?
echo "ci-static: $(( $(date +%s) - start )) s, exit $status"
exit $status
