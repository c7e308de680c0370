#!/usr/bin/env bash
# One-shot GPU check: build for this device, run the GPU tests, compute-sanitizer on a small subset,
# the benchmark suites (bounded) and decode_loop with JSON output. Everything lands in OUT_DIR; a
# short summary table is printed last (and written to OUT_DIR/summary.md).
# Sized to finish within 8 minutes on one H200 with 16 cores; each stage has a timeout and the whole
# run a deadline, so a slow stage is cut (reported as TIMEOUT) rather than overrunning.
#
#   usage: bench/gpu_check.sh OUT_DIR
#   env:   CMAKE_PREFIX_PATH   prefix of offline deps (scripts/fetch-gpu-deps.sh), passed to CMake
#          CUDA_ARCH           e.g. 90; default: nvidia-smi's compute capability, else "native"
#          BUILD_DIR           default: <repo>/build-gpu-check (git-ignored and kept, so a rerun builds
#                              incrementally; the only thing written outside OUT_DIR)
#          JOBS                build parallelism, default: nproc
#          DEADLINE_S          whole-run budget in seconds, default 470
#          BENCH_FILTER        Google Benchmark filter for bench_attention (default: see below)
#          SANITIZE_FILTER     gtest filter for memcheck/initcheck on dg_gpu_kernel_tests
#          SANITIZE_LIGHT_FILTER  the same for racecheck/synccheck (slower tools, lighter cases)
set -uo pipefail

if [[ $# -ne 1 || $1 == -h || $1 == --help ]]; then
  sed -n '2,19p' "$0"
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
# Order: tests, then memcheck of the kernels, then the measurements (benchmarks, decode_loop), then
# the slower sanitizer tools with whatever time is left: a slow tool costs sanitizer coverage, never
# the numbers.
if ((built)); then
  run_stage gpu-tests "$out/gpu_tests.log" 150 \
    ctest --test-dir "$build" -R 'Gpu|GPU|gpu' -j 8 --output-on-failure --timeout 120 --no-tests=error \
    --output-junit "$out/gpu_tests.junit.xml"
  # A test that finds no usable device skips (e.g. a driver older than the CUDA runtime): count them,
  # so "PASS" with every test skipped is not read as a GPU pass.
  passed=$(grep -E 'tests passed' "$out/gpu_tests.log" | tail -1)
  skipped=$(grep -c '(Skipped)' "$out/gpu_tests.log")
  [[ -n $passed ]] && rows[${#rows[@]}-1]="${rows[${#rows[@]}-1]} ($passed; $skipped skipped)"
  if ((skipped > 0)); then
    note gpu-tests-skipped WARN 0 "$skipped GPU tests skipped: is the device visible to CUDA? see gpu_tests.log"
  fi

  # compute-sanitizer on small subsets (where the tool exists)
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  kern_bin=$(bin dg_gpu_kernel_tests tests/gpu)
  exec_bin=$(bin dg_executor_tests tests/executor)
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

  # ---------------------------------------------------------------- benchmarks
  # Bounded: Llama-3-8B shape, 1 and 32 layers, batch 1 and 8, contexts that cover the launch-bound
  # target (<= 2K, 32 layers, batch 1) and the bandwidth target (>= 32K, batch 1-8), every mode.
  bench_filter=${BENCH_FILTER:-'BM_ReadBandwidth|BM_Attention/model:llama3-8b/layers:(1|32)/batch:(1|8)/context:(512|2048|8192|8193|32768|131072)/'}
  bench_attn=$(bin bench_attention bench)
  bench_step=$(bin bench_step bench)
  if [[ -n $bench_attn ]]; then
    run_stage bench-attention "$out/bench_attention.log" 180 "$bench_attn" \
      --benchmark_filter="$bench_filter" --benchmark_min_time=0.1 \
      --benchmark_out="$out/bench_attention.json" --benchmark_out_format=json
  else
    note bench-attention SKIP 0 "bench_attention not built"
  fi
  if [[ -n $bench_step ]]; then
    run_stage bench-step "$out/bench_step.log" 60 "$bench_step" \
      --benchmark_filter='backend:(cuda|host)/body:empty' --benchmark_min_time=0.1 \
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

  # ---------------------------------------------------------------- decode_loop
  loop=$(bin decode_loop bench)
  if [[ -n $loop ]]; then
    run_stage decode-loop "$out/decode_loop.txt" 90 "$loop" --backend cuda --no-progress \
      --json "$out/decode_loop.json"
    run_stage decode-loop-b1 "$out/decode_loop_b1.txt" 60 "$loop" --backend cuda --no-progress \
      --preset llama3-8b --batch 1 --layers 32 --start-lens 1000,2000,8180,32000 --steps 48 \
      --json "$out/decode_loop_b1.json"
  else
    note decode-loop SKIP 0 "decode_loop not built"
  fi

  # ---------------------------------------------------------------- the other sanitizer tools
  if ((have_sanitizer)); then
    # The executor's graph path (capture, staging, replay of V1 and V2 graphs) under memcheck.
    [[ -n $exec_bin ]] && sanitize memcheck memcheck-executor 45 "$exec_bin" 'ExecutorGpu.*'
    sanitize racecheck racecheck 45 "$kern_bin" "$light_filter"
    sanitize initcheck initcheck 45 "$kern_bin" "$filter"
    sanitize synccheck synccheck 45 "$kern_bin" "$light_filter"
  fi
fi

# ---------------------------------------------------------------- targets from the JSON
if command -v python3 >/dev/null 2>&1 && [[ -f $out/bench_attention.json ]]; then
  python3 - "$out/bench_attention.json" >"$out/targets.txt" 2>&1 <<'PY'
import json, re, sys
d = json.load(open(sys.argv[1]))
rows = {}
for b in d.get("benchmarks", []):
    m = re.match(r"BM_Attention/model:([^/]+)/layers:(\d+)/batch:(\d+)/context:(\d+)/mode:(\w+)", b["name"])
    if m and "us_per_step" in b:
        rows[(m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)), m.group(5))] = b
print("target 1: graph replay >= 3x eager, 32 layers, context <= 2K, batch 1 (eager = the plan's kernel, V1)")
for (model, layers, batch, ctx, mode), b in sorted(rows.items()):
    if mode == "graph" and layers == 32 and batch == 1 and ctx <= 2048:
        e = rows.get((model, layers, batch, ctx, "eager_v1"))
        if e:
            s = e["us_per_step"] / b["us_per_step"]
            print("  %s ctx %6d: eager %.1f us, graph %.1f us -> %.2fx %s" % (model, ctx, e["us_per_step"],
                  b["us_per_step"], s, "MET" if s >= 3 else "MISSED"))
print("target 2: >= 80% of measured read bandwidth, context >= 32K, batch 1-8, llama3-8b (graph mode)")
for (model, layers, batch, ctx, mode), b in sorted(rows.items()):
    if mode == "graph" and model == "llama3-8b" and ctx >= 32768 and batch <= 8:
        p = b.get("pct_read_bw", 0)
        print("  layers %2d batch %d ctx %6d: %.0f GB/s = %.1f%% %s" % (layers, batch, ctx, b.get("GBps", 0), p,
              "MET" if p >= 80 else "MISSED"))
PY
fi
if command -v python3 >/dev/null 2>&1 && [[ -f $out/bench_step.json ]]; then
  python3 - "$out/bench_step.json" >>"$out/targets.txt" 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("target 3: step() host cost <= 3 us at batch 64 (body:empty)")
for b in d.get("benchmarks", []):
    if "batch:64" in b["name"] and "us_per_step" in b:
        us = b["us_per_step"]
        print("  %s: %.2f us %s" % (b["name"], us, "MET" if us <= 3 else "MISSED"))
PY
fi

# ---------------------------------------------------------------- summary (last)
{
  echo "# gpu_check: ${gpu_name:-unknown GPU} (sm_$arch), $(date -u +%Y-%m-%d)"
  echo
  echo "command: bench/gpu_check.sh $1   (total $((SECONDS - start)) s)"
  echo
  echo "| stage | status | seconds | log |"
  echo "| --- | --- | ---: | --- |"
  for r in "${rows[@]}"; do
    IFS='|' read -r a b c e <<<"$r"
    echo "| $a | $b | $c | $e |"
  done
  if [[ -f $out/targets.txt ]]; then
    echo
    echo '```'
    cat "$out/targets.txt"
    echo '```'
  fi
} >"$out/summary.md"
cat "$out/summary.md"
