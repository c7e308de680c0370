#!/usr/bin/env bash
# One-shot GPU check: build for this device, run the GPU tests, compute-sanitizer on a small subset,
# the benchmark suites (bounded) and decode_loop with JSON output. Everything lands in OUT_DIR; a
# short summary table is printed last (and written to OUT_DIR/summary.md).
# Sized to finish within 8 minutes on one H200 with 16 cores; each stage has a timeout and the whole
# run a deadline, so a slow stage is cut (reported as TIMEOUT) rather than overrunning.
# Exit status 1, with a FAILED line above the table, when SWITCH graphs are not in use although
# driver and runtime have them (a silent kDevice -> kHost fallback would otherwise pass as green).
#
#   usage: bench/gpu_check.sh OUT_DIR
#   env:   CMAKE_PREFIX_PATH   prefix of offline deps (scripts/fetch-gpu-deps.sh), passed to CMake
#          CUDA_ARCH           e.g. 90; default: nvidia-smi's compute capability, else "native"
#          BUILD_DIR           default: <repo>/build-gpu-check (git-ignored and kept, so a rerun builds
#                              incrementally; the only thing written outside OUT_DIR)
#          JOBS                build parallelism, default: nproc
#          DEADLINE_S          whole-run budget in seconds, default 470
#          BENCH_FILTER        Google Benchmark filter for bench_attention's bandwidth run (default: below)
#          BENCH_LAUNCH_FILTER the same for its launch-bound run
#          BENCH_FP8_FILTER    the same for its fp8 run (E4M3 caches in graph mode, beside bf16)
#          SANITIZE_FILTER     gtest filter for memcheck/initcheck on dg_gpu_kernel_tests
#          SANITIZE_LIGHT_FILTER  the same for racecheck/synccheck (slower tools, lighter cases)
set -uo pipefail

if [[ $# -ne 1 || $1 == -h || $1 == --help ]]; then
  sed -n '2,20p' "$0"
  exit 2
fi
mkdir -p "$1" || exit 2
out=$(cd "$1" && pwd)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build-gpu-check}
jobs=${JOBS:-$(nproc)}
deadline=${DEADLINE_S:-470}
start=$SECONDS

# Stage bookkeeping: one row per stage for the summary.
declare -a rows=()
note() { rows+=("$1|$2|$3|$4"); }  # stage, status, seconds, detail
declare -a loud=()  # failures that make the whole run fail (exit 1), named above the table

remaining() { echo $((deadline - (SECONDS - start))); }

# run_stage NAME LOG TIMEOUT_S CMD...: runs CMD with a timeout capped by the deadline; records status.
run_stage() {
  local name=$1 log=$2 limit=$3
  shift 3
  local left
  left=$(remaining)
  if ((left < 10)); then
    note "$name" SKIP 0 "deadline reached"
    return 1
  fi
  ((limit > left)) && limit=$left
  local t0=$SECONDS rc
  echo "== $name (limit ${limit}s): $*" | tee -a "$out/commands.txt"
  timeout --signal=INT --kill-after=10 "$limit" "$@" >"$log" 2>&1
  rc=$?
  local dt=$((SECONDS - t0)) status=PASS
  if ((rc == 124 || rc == 137)); then
    status=TIMEOUT
  elif ((rc != 0)); then
    status="FAIL($rc)"
  fi
  note "$name" "$status" "$dt" "$(basename "$log")"
  return "$rc"
}

# ---------------------------------------------------------------- device and toolchain
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,compute_cap,memory.total,clocks.max.memory,driver_version --format=csv 2>&1
  nvidia-smi 2>&1 | head -20
  command -v nvcc >/dev/null 2>&1 && nvcc --version
  [[ -x /usr/local/cuda/bin/nvcc ]] && /usr/local/cuda/bin/nvcc --version
  cmake --version | head -1
} >"$out/device.txt" 2>&1

arch=${CUDA_ARCH:-}
if [[ -z $arch ]]; then
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  [[ $arch =~ ^[0-9]+$ ]] || arch=native
fi
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)

# ---------------------------------------------------------------- configure + build
cmake_args=(-S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch"
  -DDECODEGRAPH_ENABLE_CUDA=ON -DDECODEGRAPH_BUILD_TESTS=ON -DDECODEGRAPH_BUILD_BENCH=ON)
command -v ninja >/dev/null 2>&1 && cmake_args+=(-G Ninja)
[[ -n ${CMAKE_PREFIX_PATH:-} ]] && cmake_args+=("-DCMAKE_PREFIX_PATH=$CMAKE_PREFIX_PATH")
if [[ -n ${CMAKE_PREFIX_PATH:-} ]]; then
  # CMAKE_PREFIX_PATH may be a list (';' for CMake, ':' as an environment path): every prefix's libs.
  IFS=';:' read -r -a prefixes <<<"$CMAKE_PREFIX_PATH"
  for p in "${prefixes[@]}"; do
    [[ -n $p ]] && LD_LIBRARY_PATH="$p/lib/x86_64-linux-gnu:$p/lib:${LD_LIBRARY_PATH:-}"
  done
  export LD_LIBRARY_PATH
fi

built=0
if run_stage configure "$out/configure.log" 120 cmake "${cmake_args[@]}" &&
  run_stage build "$out/build.log" 300 cmake --build "$build" -j "$jobs"; then
  built=1
fi

# bin NAME SUBDIR: the build's own binary (not a copy another test installed under $build).
bin() {
  if [[ -x $build/$2/$1 ]]; then echo "$build/$2/$1"; else find "$build" -type f -name "$1" -perm -u+x -not -path '*/prefix/*' | head -1; fi
}

# ---------------------------------------------------------------- GPU tests
# Order: tests, then memcheck of the kernels, then the measurements (decode_loop per band with its
# bitwise check first, then the benchmarks), then the slower sanitizer tools with whatever time is
# left: a slow tool costs sanitizer coverage, never the numbers.
if ((built)); then
  # The simulator's runs of the GPU tests (sim.*) are CPU tests, minutes each: not here.
  run_stage gpu-tests "$out/gpu_tests.log" 150 \
    ctest --test-dir "$build" -R 'Gpu|GPU|gpu' -E '^sim\.' -j 8 --output-on-failure --timeout 120 --no-tests=error \
    --output-junit "$out/gpu_tests.junit.xml"
  # A test that finds no usable device skips (e.g. a driver older than the CUDA runtime): count them,
  # so "PASS" with every test skipped is not read as a GPU pass.
  passed=$(grep -E 'tests passed' "$out/gpu_tests.log" | tail -1)
  skipped=$(grep -c '(Skipped)' "$out/gpu_tests.log")
  [[ -n $passed ]] && rows[${#rows[@]}-1]="${rows[${#rows[@]}-1]} ($passed; $skipped skipped)"
  if ((skipped > 0)); then
    note gpu-tests-skipped WARN 0 "$skipped GPU tests skipped: is the device visible to CUDA? see gpu_tests.log"
  fi

  # The review's checks (issue 20) in one process, their output kept: SWITCH graphs in use where
  # driver and runtime have them (a probe that fell back makes every SWITCH test skip, and the run
  # must not pass then), and the driver's answers to issue 22's questions ("[driver]" lines: VMM and
  # pool address ranges, cudaGraphExecUpdate on a new conditional handle).
  exec_bin=$(bin dg_executor_tests tests/executor)
  if [[ -n $exec_bin ]]; then
    run_stage switch-and-driver "$out/switch_and_driver.log" 60 "$exec_bin" \
      --gtest_filter='ExecutorGpu.SwitchGraphsAreInUseWhereTheDriverHasThem:ExecutorGpu.CacheInAVmmRangeOfSeveralMappingsIsAccepted:ExecutorGpu.CacheFromAMemoryPoolIsAccepted:ExecutorGpu.WhatGraphExecUpdateDoesWithANewConditionalHandle'
    band=$(grep -m1 '^\[driver\] driver .*band_select' "$out/switch_and_driver.log" | sed 's/^\[driver\] //')
    if grep -q 'SILENT kDevice FALLBACK' "$out/switch_and_driver.log"; then
      note switch-in-use FAIL 0 "SILENT kDevice FALLBACK: ${band:-see switch_and_driver.log}"
      loud+=("SWITCH graphs not in use although driver and runtime have them: ${band:-see switch_and_driver.log}")
    elif grep -q 'FAILED  \] ExecutorGpu.SwitchGraphsAreInUseWhereTheDriverHasThem' "$out/switch_and_driver.log"; then
      note switch-in-use FAIL 0 "kDevice in effect, but its graph's output or band counts are wrong: see switch_and_driver.log"
      loud+=("the SWITCH graph check failed: see switch_and_driver.log")
    elif grep -q 'OK \] ExecutorGpu.SwitchGraphsAreInUseWhereTheDriverHasThem' "$out/switch_and_driver.log"; then
      note switch-in-use PASS 0 "${band}"
    else
      note switch-in-use SKIP 0 "${band:-the check did not run: see switch_and_driver.log}"
    fi
  else
    note switch-in-use FAIL 0 "dg_executor_tests not found"
    loud+=("dg_executor_tests not found: whether SWITCH graphs are in use is unknown")
  fi

  # Issue 20's engine paths, their output kept: step() inside the caller's own stream capture (both
  # band choices, replayed across a band edge) and two executors on two devices from one thread
  # (skipped, and reported so, with fewer than 2 devices).
  if [[ -n $exec_bin ]]; then
    run_stage engine-capture-and-devices "$out/engine_capture_and_devices.log" 60 "$exec_bin" \
      --gtest_filter='ExecutorGpu.StepInsideTheCallersCapture*:ExecutorGpu.TwoExecutorsOnTwoDevicesFromOneThread'
    if grep -q 'SKIPPED \] ExecutorGpu.TwoExecutorsOnTwoDevicesFromOneThread' "$out/engine_capture_and_devices.log"; then
      note two-devices SKIP 0 "fewer than 2 CUDA devices: the multi-device check did not run"
    fi
  fi

  # The approximate instructions under the soft-cap (issue 39): ex2.approx and rcp.approx in ulps,
  # the kernels' soft-cap against a float64 tanh; its "[device math]" lines go into the summary.
  kern_bin=$(bin dg_gpu_kernel_tests tests/gpu)
  if [[ -n $kern_bin ]]; then
    run_stage device-math "$out/device_math.log" 60 "$kern_bin" --gtest_filter='GpuKernels.SoftcapDeviceMathAgainstTanh'
  fi

  # compute-sanitizer on small subsets (where the tool exists)
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  filter=${SANITIZE_FILTER:-GpuKernels.IrregularLengths:GpuKernels.OddBatchesWithPaddedRows:GpuKernels.AppendKvMatchesHostAppend}
  # racecheck and synccheck instrument every shared-memory access and barrier: lighter cases only.
  light_filter=${SANITIZE_LIGHT_FILTER:-GpuKernels.OddBatchesWithPaddedRows:GpuKernels.ManyPartitions:GpuKernels.AppendKvMatchesHostAppend}
  have_sanitizer=0
  [[ -x $sanitizer && -n $kern_bin ]] && have_sanitizer=1
  sanitize() {  # sanitize TOOL NAME LIMIT BINARY FILTER
    local extra=()
    [[ $1 == memcheck ]] && extra=(--leak-check full)
    run_stage "sanitizer-$2" "$out/sanitizer_$2.log" "$3" \
      "$sanitizer" --tool "$1" "${extra[@]}" --error-exitcode 3 "$4" --gtest_filter="$5"
  }
  if ((have_sanitizer)); then
    sanitize memcheck memcheck 60 "$kern_bin" "$filter"
  else
    note sanitizer SKIP 0 "compute-sanitizer or dg_gpu_kernel_tests not found"
  fi

  # ---------------------------------------------------------------- decode_loop
  loop=$(bin decode_loop bench)
  if [[ -n $loop ]]; then
    # Per band at batch 1, 8 and 64 (llama3-8b): every bucket captured up front (capture time and
    # graph memory for all of them), segments that walk across 2K, 8192 and into 32K, eager vs graph
    # checked bitwise on every step. Layers kept to what 64 x 32K tokens of cache allows.
    for b in 1 8 64; do
      layers=4
      ((b == 64)) && layers=2
      run_stage "decode-loop-b$b" "$out/decode_loop_b$b.txt" 75 "$loop" --backend cuda --no-progress \
        --preset llama3-8b --batch "$b" --layers "$layers" --capture up-front --steps 24 \
        --start-lens 400:480,1990:2030,8150:8180,30000:32000 --json "$out/decode_loop_b$b.json"
    done
    # Speculative decoding's verify loop: steps of n = 1 and 4 (3 drafts), per (band, n), eager vs
    # graph bitwise on every row, and the KV bytes per generated token against n = 1.
    run_stage decode-loop-verify "$out/decode_loop_verify.txt" 60 "$loop" --backend cuda --no-progress \
      --preset llama3-8b --batch 8 --layers 4 --q-lens 1,4 --steps 24 \
      --start-lens 400:480,1990:2030,8150:8180,30000:32000 --json "$out/decode_loop_verify.json"
    run_stage decode-loop "$out/decode_loop.txt" 90 "$loop" --backend cuda --no-progress \
      --json "$out/decode_loop.json"
  else
    note decode-loop SKIP 0 "decode_loop not built"
  fi


  # ---------------------------------------------------------------- benchmarks
  # Bounded, and in two runs with their own JSON (a run cut by its timeout loses only its own file).
  # Launch-bound: llama3-8b, 32 layers, batch 1, context <= 2K; graph vs the same plan launched eagerly,
  # and vs eager V1. Bandwidth: 1 layer at batch 1, 8 and 64; the plan eagerly (new and legacy pass 1
  # side by side) and as a graph; both bandwidth ceilings first. fp8 E4M3 (issue 25): the graph at
  # long context, beside bf16's rows.
  launch_filter=${BENCH_LAUNCH_FILTER:-'BM_Attention/model:llama3-8b/kv:auto/layers:32/batch:1/context:(512|2048)/mode:(eager_v1|eager_plan|graph)/'}
  bench_filter=${BENCH_FILTER:-'BM_ReadBandwidth|BM_CopyBandwidth|BM_Attention/model:llama3-8b/kv:auto/layers:1/batch:(1|8|64)/context:(2048|8192|8193|32768|131072)/mode:(eager_plan|graph)/'}
  fp8_filter=${BENCH_FP8_FILTER:-'BM_ReadBandwidth|BM_Attention/model:llama3-8b/kv:fp8_e4m3/layers:1/batch:(1|8|64)/context:(8192|32768|131072)/mode:graph/'}
  bench_attn=$(bin bench_attention bench)
  bench_step=$(bin bench_step bench)
  if [[ -n $bench_attn ]]; then
    run_stage bench-attention-launch "$out/bench_attention_launch.log" 60 "$bench_attn" \
      --benchmark_filter="$launch_filter" --benchmark_min_time=0.1 \
      --benchmark_out="$out/bench_attention_launch.json" --benchmark_out_format=json
    run_stage bench-attention-bw "$out/bench_attention_bw.log" 150 "$bench_attn" \
      --benchmark_filter="$bench_filter" --benchmark_min_time=0.1 \
      --benchmark_out="$out/bench_attention_bw.json" --benchmark_out_format=json
    run_stage bench-attention-fp8 "$out/bench_attention_fp8.log" 60 "$bench_attn" \
      --benchmark_filter="$fp8_filter" --benchmark_min_time=0.1 \
      --benchmark_out="$out/bench_attention_fp8.json" --benchmark_out_format=json
  else
    note bench-attention SKIP 0 "bench_attention not built"
  fi
  if [[ -n $bench_step ]]; then
    run_stage bench-step "$out/bench_step.log" 60 "$bench_step" \
      --benchmark_filter='backend:(cuda|host)/body:empty/.*validation:cheap' --benchmark_min_time=0.1 \
      --benchmark_out="$out/bench_step.json" --benchmark_out_format=json
  else
    note bench-step SKIP 0 "bench_step not built"
  fi
  # Issue 12: replay cost of BandSelect kDevice (SWITCH graph per batch bucket) against kHost, with
  # device-resident inputs (kHost without a hint copies seq_lens back; with one it does not), batch
  # 1 and 64, one layer of real attention at 16 tokens. Capture time and graph memory of both come
  # from the decode-loop stages below (their "capture cost" table and capture_compare in the JSON).
  if [[ -n $bench_step ]]; then
    run_stage bench-step-band "$out/bench_step_band.log" 60 "$bench_step" \
      --benchmark_filter='backend:cuda/body:(empty|attention)/context:16/validation:cheap/inputs:device(_hint)?/band:(host|device)/batch:(1|64)$' \
      --benchmark_min_time=0.1 --benchmark_out="$out/bench_step_band.json" --benchmark_out_format=json
  fi

  # ---------------------------------------------------------------- the other sanitizer tools
  if ((have_sanitizer)); then
    # The executor's graph path (capture, staging, replay of V1 and V2 graphs) under memcheck.
    [[ -n $exec_bin ]] && sanitize memcheck memcheck-executor 45 "$exec_bin" 'ExecutorGpu.*:-ExecutorGpu.WhatGraphExecUpdate*'
    sanitize racecheck racecheck 45 "$kern_bin" "$light_filter"
    sanitize initcheck initcheck 45 "$kern_bin" "$filter"
    sanitize synccheck synccheck 45 "$kern_bin" "$light_filter"
  fi
fi

# ---------------------------------------------------------------- targets from the JSON
if command -v python3 >/dev/null 2>&1; then
  python3 - "$out/bench_attention_launch.json" "$out/bench_attention_bw.json" "$out/bench_attention_fp8.json" \
    >"$out/targets.txt" 2>&1 <<'PY'
import json, os, re, sys
rows, fp8, ceilings = {}, {}, []
for f in sys.argv[1:]:
    if not os.path.exists(f):
        print("%s: missing (stage failed or cut)" % os.path.basename(f))
        continue
    for b in json.load(open(f)).get("benchmarks", []):
        if b["name"].startswith(("BM_ReadBandwidth", "BM_CopyBandwidth")) and "GBps" in b:
            ceilings.append("%s: %.0f GB/s" % (b["name"].split("/")[0], b["GBps"]))
        m = re.match(r"BM_Attention/model:([^/]+)/kv:(\w+)/layers:(\d+)/batch:(\d+)/context:(\d+)/mode:(\w+)/kernel:(\w+)",
                     b["name"])
        if m and "us_per_step" in b:
            key = (m.group(1), int(m.group(3)), int(m.group(4)), int(m.group(5)), m.group(6), m.group(7))
            (rows if m.group(2) == "auto" else fp8)[key] = b
print("\n".join(ceilings))
print("target 1: graph replay >= 3x eager, 32 layers, context <= 2K, batch 1 (eager = the same plan launched eagerly)")
for (model, layers, batch, ctx, mode, kern), b in sorted(rows.items()):
    if mode == "graph" and layers == 32 and batch == 1 and ctx <= 2048:
        for em in ("eager_plan", "eager_v1"):
            e = rows.get((model, layers, batch, ctx, em, "new"))
            if e:
                s = e["us_per_step"] / b["us_per_step"]
                print("  %s ctx %6d: %s %.1f us, graph %.1f us -> %.2fx %s" % (model, ctx, em, e["us_per_step"],
                      b["us_per_step"], s, ("MET" if s >= 3 else "MISSED") if em == "eager_plan" else ""))
print("target 2: >= 85% of measured read bandwidth, context >= 32K, batch 1-8, llama3-8b (graph mode)")
for (model, layers, batch, ctx, mode, kern), b in sorted(rows.items()):
    if mode == "graph" and model == "llama3-8b" and ctx >= 32768 and batch <= 8:
        p = b.get("pct_read_bw", 0)
        print("  layers %2d batch %d ctx %6d: %.0f GB/s = %.1f%% of read, %.1f%% of copy %s" % (layers, batch, ctx,
              b.get("GBps", 0), p, b.get("pct_copy_bw", 0), "MET" if p >= 85 else "MISSED"))
print("fp8 E4M3 against bf16 (graph, 1 layer): us p50, GB/s of the bytes each reads, % of read bandwidth")
for (model, layers, batch, ctx, mode, kern), b in sorted(fp8.items()):
    o = rows.get((model, layers, batch, ctx, mode, kern))
    print("  batch %2d ctx %6d: fp8 %.1f us %.0f GB/s (%.1f%%) | bf16 %s" % (batch, ctx, b["us_per_step"],
          b.get("GBps", 0), b.get("pct_read_bw", 0),
          "%.1f us %.0f GB/s -> fp8 is %.2fx" % (o["us_per_step"], o.get("GBps", 0), o["us_per_step"] / b["us_per_step"])
          if o else "-"))
print("pass 1 new vs legacy (eager_plan, 1 layer): us p50 / GB/s")
for (model, layers, batch, ctx, mode, kern), b in sorted(rows.items()):
    if mode == "eager_plan" and layers == 1 and kern == "new":
        o = rows.get((model, layers, batch, ctx, mode, "legacy"))
        print("  batch %2d ctx %6d %s P=%4d: new %.1f us %.0f GB/s (%.1f%%) | legacy %s" % (batch, ctx,
              "v2" if b.get("kernel_v2") else "v1", b.get("P", 0), b["us_per_step"], b.get("GBps", 0),
              b.get("pct_read_bw", 0),
              "%.1f us %.0f GB/s -> new is %.2fx" % (o["us_per_step"], o.get("GBps", 0), o["us_per_step"] / b["us_per_step"])
              if o else "-"))
PY
fi
if command -v python3 >/dev/null 2>&1 && [[ -f $out/bench_step.json ]]; then
  python3 - "$out/bench_step.json" >>"$out/targets.txt" 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("target 3: step() host cost <= 3 us at batch 64 (body:empty; batch 1 and 256 shown)")
for b in d.get("benchmarks", []):
    if "us_per_step" in b and "backend:cuda" in b["name"]:
        us = b["us_per_step"]
        met = ("MET" if us <= 3 else "MISSED") if "batch:64" in b["name"] else ""
        print("  %s: %.2f us %s" % (b["name"], us, met))
PY
fi
# Tests, sanitizers, and per band from decode_loop: what issue-style summaries ask for, from the logs.
if command -v python3 >/dev/null 2>&1; then
  python3 - "$out" >"$out/results.txt" 2>&1 <<'PY'
import glob, json, os, re, sys
out = sys.argv[1]
log = os.path.join(out, "gpu_tests.log")
if os.path.exists(log):
    t = open(log, errors="replace").read()
    m = re.search(r"(\d+)% tests passed, (\d+) tests failed out of (\d+)", t)
    skipped = t.count("(Skipped)") + t.count("***Skipped")
    if m:
        total, failed = int(m.group(3)), int(m.group(2))
        print("GPU tests: %d passed, %d failed, %d skipped (of %d; ctest)" % (total - failed - skipped, failed, skipped, total))
for f in sorted(glob.glob(os.path.join(out, "sanitizer_*.log"))):
    t = open(f, errors="replace").read()
    m = re.findall(r"ERROR SUMMARY: (\d+) error", t)
    print("compute-sanitizer %-20s %s" % (os.path.basename(f)[10:-4] + ":", (m[-1] + " errors") if m else "no summary (see log)"))
f = os.path.join(out, "device_math.log")
if os.path.exists(f):
    lines = [l[len("[device math] "):].rstrip() for l in open(f, errors="replace") if l.startswith("[device math] ")]
    if lines:
        print("\ndevice math against float64 (issue 39; GpuKernels.SoftcapDeviceMathAgainstTanh):")
        for l in lines:
            print("  " + l)
f = os.path.join(out, "switch_and_driver.log")
if os.path.exists(f):
    answers = [l[len("[driver] "):].rstrip() for l in open(f, errors="replace") if l.startswith("[driver] ")]
    if answers:
        print("\ndriver answers (issue 22):")
        for a in answers:
            print("  " + a)
for b in (1, 8, 64):
    f = os.path.join(out, "decode_loop_b%d.json" % b)
    if not os.path.exists(f):
        continue
    j = json.load(open(f))
    c, cap, mem = j.get("check", {}), j.get("captures", {}), j.get("memory", {})
    print("\ndecode_loop %s batch %d, %d layers: eager == graph bitwise on %s of %s checked steps (%s mismatching);"
          " read %.0f GB/s, copy %.0f GB/s" % (j["config"]["preset"], j["config"]["batch"], j["config"]["layers"], c.get("bitwise_equal_steps"),
          c.get("bitwise_equal_steps", 0) + c.get("mismatch_steps", 0), c.get("mismatch_steps"),
          j.get("read_bandwidth_gbs") or 0, j.get("copy_bandwidth_gbs") or 0))
    print("  graphs: %s distinct for %s buckets, capture %.1f ms + instantiate %.1f ms, graph memory %.1f MiB" % (
          cap.get("distinct_graphs"), cap.get("buckets"), cap.get("capture_ms", 0), cap.get("instantiate_ms", 0),
          (mem.get("graphs") or 0) / 2**20))
    # model: the planner's predicted us per step (bands[].predicted_us: every layer, interpolated at
    # the row's mean length, docs/benchmarks.md), beside graph p50; graph/model their ratio.
    print("  %-16s %-6s %6s %9s %9s %9s %9s %9s %11s %8s %7s %7s" % ("band", "kernel", "P", "eager p50", "eager p99",
          "graph p50", "graph p99", "model", "graph/model", "GB/s", "% read", "% copy"))
    fmt = lambda v, f="%.1f": "-" if v is None else f % v
    for r in j.get("bands", []):
        g, m = r.get("graph_p50_us"), r.get("predicted_us")
        ratio = g / m if g is not None and m else None
        print("  (%6d, %6d] %-6s %6s %9s %9s %9s %9s %9s %11s %8s %7s %7s" % (r["band_lo"], r["band_hi"], r["kernel"],
              r["partition_size"] if r["kernel"] == "v2" else "-", fmt(r.get("eager_p50_us")), fmt(r.get("eager_p99_us")),
              fmt(g), fmt(r.get("graph_p99_us")), fmt(m), fmt(ratio, "%.2fx"), fmt(r.get("gbs"), "%.0f"),
              fmt(r.get("pct_read_bw")), fmt(r.get("pct_copy_bw"))))
PY
fi

# ---------------------------------------------------------------- summary (last)
{
  echo "# gpu_check: ${gpu_name:-unknown GPU} (sm_$arch), $(date -u +%Y-%m-%d)"
  echo
  for l in "${loud[@]}"; do
    echo "**FAILED: $l**"
    echo
  done
  echo "command: bench/gpu_check.sh $1   (total $((SECONDS - start)) s)"
  echo
  echo "| stage | status | seconds | log |"
  echo "| --- | --- | ---: | --- |"
  for r in "${rows[@]}"; do
    IFS='|' read -r a b c e <<<"$r"
    echo "| $a | $b | $c | $e |"
  done
  if [[ -f $out/results.txt ]]; then
    echo
    echo '```'
    cat "$out/results.txt"
    echo '```'
  fi
  if [[ -f $out/targets.txt ]]; then
    echo
    echo '```'
    cat "$out/targets.txt"
    echo '```'
  fi
} >"$out/summary.md"
cat "$out/summary.md"
((${#loud[@]} == 0)) || exit 1
