#!/usr/bin/env python3
"""Self-test of the kernel report on selftest/kernels/inst/mock_pipeline.cu, a launcher shaped like
the coming pass-1 kernel (cp.async stages in dynamic shared memory, layout as a template parameter,
two instantiations in one file, a fully unrolled tile and one block-stride loop).

Every expected value below follows from the fixture's design constants (kStages = 3, 128 threads,
kTile = 64 tokens for 2-byte head-128 K/V, kScratch = 1024), not from the report's code.
Usage: selftest.py BUILD_DIR (run by scripts/ci-static.sh). Exit 0 when every check holds.
"""
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def main() -> int:
    build = Path(sys.argv[1]).resolve() / "kernel-report-selftest"
    out = build / "report.json"
    build.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([str(ROOT / "scripts" / "kernel_report.sh"), "--source-root", str(HERE / "selftest"),
                           "--build-dir", str(build), "--groups", "4", "--json", str(out), "--guard"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stdout + proc.stderr)
        print(f"selftest: FAILED: the report exited {proc.returncode} on the fixture (guard expected to pass)")
        return 1
    rows = json.loads(out.read_text())["kernels"]
    failures = []

    def check(what, got, want):
        if got != want:
            failures.append(f"{what}: got {got!r}, want {want!r}")

    tile_bytes = 2 * 64 * 128 * 2  # K + V of one 64-token tile, head 128, 2-byte elements
    smem = 3 * tile_bytes + 1024 * 16  # three stages + scratch
    names = sorted(r["kernel"] for r in rows)
    check("kernels", names, sorted(f"MockPipelinedKernel<{d}, 128, (KVLayout){l}>" for d in ("bf16", "fp16")
                                   for l in (0, 1)))
    for r in rows:
        k = r["kernel"]
        check(f"{k} group", r["group"], 4)
        check(f"{k} smem_dynamic", r["smem_dynamic"], smem)
        check(f"{k} smem_static", r["smem_static"], 0)
        # 128 threads and <= 64 registers would allow 8 blocks; 228 KB / (smem + 1 KB reserved) allows 2.
        check(f"{k} blocks_per_sm", r["blocks_per_sm"], (228 * 1024) // (smem + 1024))
        ml = r["main_loop"]
        check(f"{k} ldgsts per warp per tile", ml["ldgsts"], tile_bytes // 16 // 128)
        check(f"{k} sts128 (8 trips of the scratch loop)", ml["sts128"], 1024 // 128)
        check(f"{k} bar", ml["bar"], 2)
        for key in ("ldg", "sts16", "sts32", "sts64", "shfl", "hmma"):
            check(f"{k} {key}", ml[key], 0)
        per_byte = r["warp_instr_per_kv_byte"]
        if not (isinstance(per_byte, (int, float)) and 0 < per_byte < 1):
            failures.append(f"{k} warp_instr_per_kv_byte: {per_byte!r} not in (0, 1)")
    for f in failures:
        print(f"selftest: {f}")
    print(f"selftest: {'FAILED' if failures else 'passed'} ({len(rows)} instantiations of the fixture checked)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
