#!/usr/bin/env python3
"""What the Python Executor.step costs over the C++ Executor::step, on the host backend.

The issue-36 target: Python step() at most 2 us above C++ at batch 1, 64 and 256, median and p99.

Both are timed on the same executor and the same inputs, in the same process, in alternating
blocks of --steps steps (short blocks: a burst of load on a shared machine, which lasts
milliseconds, then falls on both sides alike):
  C++     Executor::step called in a C++ loop (the binding's _time_cpp_steps), each call timed with
          std::chrono::steady_clock;
  Python  dg.Executor.step(seq_lens, block_tables, slot_mapping) as an engine calls it, numpy
          inputs, each call timed with time.perf_counter_ns (whose own cost, an empty timed region,
          is printed as "timer"; it is not subtracted).
The step is bench_step's body:empty (bench/bench_step.cpp): llama3-8b's attention shape (32 / 8
heads of 128, bf16, blocks of 16), one layer, max_batch 256, max_seq_len 32768 (block tables of
2048 entries per row), 16-token contexts, a step body that enqueues nothing: what remains is
validation, bucket choice, staging and the replay of an empty recording. The garbage collector
stays on, as in an engine. This is a benchmark, not a test: it asserts nothing.

    python bench/python_step.py [--runs 5] [--rounds 400] [--steps 50] [--batches 1,64,256]
        [--json out.json] [--inputs host|host_staging] [--band-select host|device] [--validation cheap|full]

With --runs N the whole measurement is made N times, and each cell is the median of the N runs'
values with [min..max] beside it: the spread between runs, which on a shared machine is mostly the
other processes' (a run that a burst of load hits shows in its p99s, not in the median of runs).
    python bench/python_step.py --layer-step [--batch 64] [--contexts 16,128,512]

--layer-step times something else: a real step of one llama3-8b layer on the host backend (KV
append and attention of every sequence, in C++ on the CPU, one thread), milliseconds per step at
each context: what the host backend costs as an inference path (it is a correctness tool).

Results: bench/results/host/ (with the date, the machine and the command).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any, Dict, List

# numpy's OpenBLAS threads would spin beside the benchmark on a small machine; nothing here uses BLAS.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import decodegraph as dg  # noqa: E402

MAX_BATCH = 256
MAX_SEQ_LEN = 32768
CONTEXT = 16
SPEC = dg.AttentionSpec(num_q_heads=32, num_kv_heads=8, head_size=128, block_size=16, dtype="bf16")


def percentile(sorted_ns: List[int], q: float) -> float:
    """The q-quantile (nearest rank) of sorted samples, in microseconds."""
    i = min(len(sorted_ns) - 1, max(0, int(round(q * (len(sorted_ns) - 1)))))
    return sorted_ns[i] / 1000.0


def make_executor(args: argparse.Namespace) -> dg.Executor:
    num_blocks = MAX_BATCH  # one block per sequence: 16 tokens
    bf16 = dg.numpy_dtype(SPEC.dtype)
    layers = [dg.LayerBuffers(np.zeros(SPEC.k_cache_shape(num_blocks), bf16),
                              np.zeros(SPEC.v_cache_shape(num_blocks), bf16))]
    return dg.Executor(spec=SPEC, layers=layers, max_batch=MAX_BATCH, max_seq_len=MAX_SEQ_LEN, backend="host",
                       band_select=args.band_select, validation=args.validation, log_level="off",
                       step_body=lambda ctx: None)


def inputs(ex: dg.Executor, batch: int, staged: bool) -> tuple[Any, Any, Any]:
    lens = np.full(batch, CONTEXT, np.int32)
    tables = np.zeros((batch, MAX_SEQ_LEN // SPEC.block_size), np.int32)
    tables[:, 0] = np.arange(batch)
    slots = tables[:, 0].astype(np.int64) * SPEC.block_size + CONTEXT - 1
    if not staged:
        return lens, tables, slots
    hs = ex.host_staging()  # written once: the contents do not change between steps
    hs.seq_lens[:batch] = lens
    hs.block_tables[:batch] = tables
    hs.slot_mapping[:batch] = slots
    return hs.seq_lens[:batch], hs.block_tables[:batch], hs.slot_mapping[:batch]


def run_batch(ex: dg.Executor, batch: int, args: argparse.Namespace) -> Dict[str, Any]:
    lens, tables, slots = inputs(ex, batch, args.inputs == "host_staging")
    step = ex.step
    # The binding's _time_cpp_steps loop calls the C++ Executor::step. A build without it (before
    # issue 36) times the Python side only: its C++ columns then repeat the Python ones.
    cpp_steps = getattr(ex._core, "_time_cpp_steps", None)
    if cpp_steps is None:
        def cpp_steps(lens: Any, tables: Any, slots: Any, q_len: int, iters: int) -> List[int]:
            out = []
            for _ in range(iters):
                t0 = time.perf_counter_ns()
                step(lens, tables, slots)
                out.append(time.perf_counter_ns() - t0)
            return out
    for _ in range(2000):  # warm-up: the graph is captured, caches and branch predictors warm
        step(lens, tables, slots)
    cpp_steps(lens, tables, slots, 1, 2000)
    cpp: List[int] = []
    py: List[int] = []
    timer: List[int] = []
    clock = time.perf_counter_ns
    for _ in range(args.rounds):
        cpp += cpp_steps(lens, tables, slots, 1, args.steps)
        for _ in range(args.steps):
            t0 = clock()
            step(lens, tables, slots)
            py.append(clock() - t0)
        for _ in range(max(1, args.steps // 4)):
            t0 = clock()
            timer.append(clock() - t0)
    cpp.sort()
    py.sort()
    timer.sort()
    row = {"batch": batch, "samples": len(py)}
    for name, ns in (("cpp", cpp), ("python", py), ("timer", timer)):
        row[f"{name}_median_us"] = percentile(ns, 0.5)
        row[f"{name}_p99_us"] = percentile(ns, 0.99)
    row["over_median_us"] = row["python_median_us"] - row["cpp_median_us"]
    row["over_p99_us"] = row["python_p99_us"] - row["cpp_p99_us"]
    return row


def layer_step(args: argparse.Namespace) -> int:
    """ms per step of one llama3-8b layer (append + attention) at batch args.batch, per context."""
    bf16 = dg.numpy_dtype(SPEC.dtype)
    rng = np.random.default_rng(0)
    print(f"# machine: {machine()}")
    print(f"# command: {' '.join([os.path.basename(sys.executable)] + sys.argv)}")
    print(f"# one llama3-8b layer (32 / 8 heads of 128, bf16, vllm layout), batch {args.batch}, append + attention, "
          f"host backend; median of {args.repeats} steps after one warm-up")
    print("| context | ms per step | min ms |")
    print("| ---: | ---: | ---: |")
    for ctx in (int(c) for c in args.contexts.split(",")):
        per_seq = -(-ctx // SPEC.block_size)
        blocks = args.batch * per_seq
        layers = [dg.LayerBuffers(rng.standard_normal(SPEC.k_cache_shape(blocks), np.float32).astype(bf16),
                                  rng.standard_normal(SPEC.v_cache_shape(blocks), np.float32).astype(bf16))]
        ex = dg.Executor(spec=SPEC, layers=layers, max_batch=args.batch, max_seq_len=max(ctx, 16), backend="host",
                         log_level="off")
        lens = np.full(args.batch, ctx, np.int32)
        tables = np.arange(blocks, dtype=np.int32).reshape(args.batch, per_seq)
        pos = ctx - 1
        slots = tables[:, pos // SPEC.block_size].astype(np.int64) * SPEC.block_size + pos % SPEC.block_size
        ex.query(0)[:] = rng.standard_normal((args.batch, 32, 128), np.float32).astype(bf16)
        ex.step(lens, tables, slots)
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            ex.step(lens, tables, slots)
            times.append((time.perf_counter() - t0) * 1e3)
        print(f"| {ctx} | {statistics.median(times):.1f} | {min(times):.1f} |")
    return 0


def summarise(per_run: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One batch's rows of every run: each value's median over the runs, with its min and max."""
    out: Dict[str, Any] = {"batch": per_run[0]["batch"], "samples": per_run[0]["samples"], "runs": len(per_run)}
    for k, v in per_run[0].items():
        if k.endswith("_us"):
            vals = [r[k] for r in per_run]
            out[k] = statistics.median(vals)
            out[k + "_min"], out[k + "_max"] = min(vals), max(vals)
    return out


def cell(r: Dict[str, Any], k: str, spread: bool, signed: bool) -> str:
    fmt = "{:+.2f}" if signed else "{:.2f}"
    text = fmt.format(r[k])
    if spread:
        text += f" [{fmt.format(r[k + '_min'])}..{fmt.format(r[k + '_max'])}]"
    return text


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    return (f"{cpu}, {os.cpu_count()} logical CPUs, load average {', '.join(f'{x:.2f}' for x in load)}; "
            f"Python {platform.python_version()}, numpy {np.__version__}, decodegraph {dg.__version__}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1, help="whole measurements; cells: median [min..max] (default 1)")
    ap.add_argument("--rounds", type=int, default=400, help="alternating C++ / Python blocks (default 400)")
    ap.add_argument("--steps", type=int, default=50, help="steps per block and side (default 50)")
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--inputs", choices=["host", "host_staging"], default="host")
    ap.add_argument("--band-select", choices=["host", "device"], default="host")
    ap.add_argument("--validation", choices=["cheap", "full"], default="cheap")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--layer-step", action="store_true", help="time a real llama3-8b layer step instead")
    ap.add_argument("--batch", type=int, default=64, help="--layer-step: sequences (default 64)")
    ap.add_argument("--contexts", default="16,128,512", help="--layer-step: tokens per sequence")
    ap.add_argument("--repeats", type=int, default=5, help="--layer-step: timed steps per context")
    args = ap.parse_args()
    if args.layer_step:
        return layer_step(args)
    ex = make_executor(args)
    batches = [int(b) for b in args.batches.split(",")]
    runs = [[run_batch(ex, b, args) for b in batches] for _ in range(args.runs)]
    rows = [summarise([run[i] for run in runs]) for i in range(len(batches))]
    print(f"# machine: {machine()}")
    print(f"# command: {' '.join([os.path.basename(sys.executable)] + sys.argv)}")
    print(f"# inputs {args.inputs}, band_select {args.band_select}, validation {args.validation}, "
          f"{args.rounds} blocks x {args.steps} steps per side and batch, alternating; microseconds per step()")
    if args.runs > 1:
        print(f"# {args.runs} runs: each cell the median of the runs' values [min..max]")
    print("| batch | C++ median | C++ p99 | Python median | Python p99 | Python - C++ median | "
          "Python - C++ p99 | timer median |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    keys = ["cpp_median_us", "cpp_p99_us", "python_median_us", "python_p99_us", "over_median_us", "over_p99_us",
            "timer_median_us"]
    for r in rows:
        cells = [cell(r, k, args.runs > 1, signed=k.startswith("over")) for k in keys]
        print(f"| {r['batch']} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "argv": sys.argv, "runs": runs, "rows": rows}, f, indent=1)
    worst = max(max(r["over_median_us"], r["over_p99_us"]) for r in rows)
    print(f"# worst Python - C++: {worst:+.2f} us (target: <= 2 us); median of the per-batch medians "
          f"{statistics.median(r['over_median_us'] for r in rows):+.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
