# Build-time transform of one device source for the CUDA simulator (tests/sim/README.md):
#   cmake -DIN=<original> -DOUT=<generated> -P transform.cmake
# Rewrites each `Kernel<...><<<grid, block, smem, stream>>>(params);` into
# `sim_launch(Kernel<...>, grid, block, smem, stream, params);` and follows each `__shared__`
# array declaration with sim::register_shared so the simulator NaN-fills it per block. Anything
# it cannot rewrite fails the build instead of silently escaping the simulator.
if(NOT DEFINED IN OR NOT DEFINED OUT)
  message(FATAL_ERROR "transform.cmake: pass -DIN=<source> -DOUT=<generated file>")
endif()
file(READ "${IN}" src)

# Launches: one per line, as the sources write them.
string(REGEX REPLACE
  "([A-Za-z_][A-Za-z0-9_:]*(<[^<>\n]*>)?)<<<([^\n]*)>>>\\(([^\n]*)\\);"
  "sim_launch(\\1, \\3, \\4);" out "${src}")
# Shared arrays: a declaration that starts its line and ends with `];` on it.
string(REGEX REPLACE
  "(\n[ \t]*__shared__ [^;\n]* ([A-Za-z_][A-Za-z0-9_]*)\\[[^;\n]*\\];)"
  "\\1 sim::register_shared(\\2, sizeof(\\2));" out "${out}")

# Nothing may escape: strip // comments, then no `<<<` may remain and every __shared__ must be
# registered.
string(REGEX REPLACE "//[^\n]*" "" code "${out}")
if(code MATCHES "<<<")
  message(FATAL_ERROR "transform.cmake: ${IN}: a kernel launch the simulator transform cannot "
                      "rewrite (write it on one line as `Kernel<...><<<g, b, smem, stream>>>(params);`)")
endif()
string(REGEX MATCHALL "__shared__" shared_decls "${code}")
string(REGEX MATCHALL "sim::register_shared" shared_regs "${code}")
list(LENGTH shared_decls n_decls)
list(LENGTH shared_regs n_regs)
if(NOT n_decls EQUAL n_regs)
  message(FATAL_ERROR "transform.cmake: ${IN}: ${n_decls} __shared__ declarations but ${n_regs} "
                      "registered; write each as one line `__shared__ T name[N];`")
endif()

file(WRITE "${OUT}.tmp" "// Generated from ${IN} by tests/sim/transform.cmake; do not edit.\n#line 1 \"${IN}\"\n${out}")
file(RENAME "${OUT}.tmp" "${OUT}")
