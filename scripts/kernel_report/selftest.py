#!/usr/bin/env python3
"""Self-test of the kernel report on two fixtures:
- selftest/kernels/inst/mock_pipeline.cu, a launcher shaped like the coming pass-1 kernel (cp.async
  stages in dynamic shared memory, layout as a template parameter, two instantiations in one file, a
  fully unrolled tile and one block-stride loop): read correctly, guard passes;
- selftest-bad/kernels/inst/bad_transpose.cu: scalar 2-byte shared stores and local memory; the guard
  must fail on both.

Every expected value below follows from the fixtures' design constants (kStages = 3, 128 threads,
kTile = 64 tokens of head-128 K/V, 2-byte or (fp8 caches) 1-byte elements, kScratch = 1024), not from
the report's code.
Usage: selftest.py BUILD_DIR (run by scripts/ci-static.sh). Exit 0 when every check holds.
"""
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def report(fixture: str, build: Path) -> tuple[int, str, list[dict]]:
    """Runs the report with --guard on a fixture; (exit code, output, JSON rows)."""
    out = build / fixture / "report.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([str(ROOT / "scripts" / "kernel_report.sh"), "--source-root", str(HERE / fixture),
                           "--build-dir", str(out.parent), "--groups", "4", "--json", str(out), "--guard"],
                          capture_output=True, text=True)
    rows = json.loads(out.read_text())["kernels"] if out.exists() and proc.returncode in (0, 1) else []
    return proc.returncode, proc.stdout + proc.stderr, rows


def main() -> int:
    build = Path(sys.argv[1]).resolve() / "kernel-report-selftest"
    failures = []

    def check(what, got, want):
        if got != want:
            failures.append(f"{what}: got {got!r}, want {want!r}")

    # selftest-bad/: the guard must reject scalar 2-byte stores in the main loop and local memory.
    # V (64 tokens x 128 x 2 B) in 16-byte chunks over 128 threads: 8 trips of 8 STS.U16 per warp.
    rc, text, rows = report("selftest-bad", build)
    check("guard exit code on selftest-bad", rc, 1)
    for rule in ("[no 2-byte shared stores] BadTransposeKernel<bf16, 128>", "[no local memory] BadTransposeKernel<bf16, 128>"):
        if rule not in text:
            failures.append(f"selftest-bad: the guard did not report {rule!r}")
    check("selftest-bad sts16", [r["main_loop"]["sts16"] for r in rows], [64])
    if not all(r["local_bytes"] > 0 for r in rows):
        failures.append("selftest-bad: local_bytes should be > 0 (a dynamically indexed array)")

    # selftest/: shaped like the coming kernel; the guard must pass.
    rc, text, rows = report("selftest", build)
    if rc != 0:
        print(text)
        failures.append(f"the report exited {rc} on selftest/ (guard expected to pass)")

    names = sorted(r["kernel"] for r in rows)
    check("kernels", names, sorted([f"MockPipelinedKernel<{d}, 128, (KVLayout){l}>" for d in ("bf16", "fp16")
                                    for l in (0, 1)] + ["MockPipelinedKernel<fp8e4m3, 128, (KVLayout)0>",
                                                        "MockPipelinedKernel<fp8e5m2, 128, (KVLayout)1>"]))
    check("dtypes", sorted(r["dtype"] for r in rows), sorted(["bf16", "bf16", "fp16", "fp16", "fp8e4m3", "fp8e5m2"]))
    for r in rows:
        k = r["kernel"]
        elem = 1 if r["dtype"].startswith("fp8") else 2
        tile_bytes = 2 * 64 * 128 * elem  # K + V of one 64-token tile, head 128
        smem = 3 * tile_bytes + 1024 * 16  # three stages + scratch
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
    print(f"selftest: {'FAILED' if failures else 'passed'} (guard rejects selftest-bad; {len(rows)} instantiations "
          "of selftest checked)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
