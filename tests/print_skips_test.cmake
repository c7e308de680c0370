# ctest test of print_skips.cmake: a skip log with two reasons is printed grouped by reason, with the
# tests' names; an empty or missing log prints nothing.
#   cmake -DSCRIPT=tests/print_skips.cmake -DWORK=<dir> -P tests/print_skips_test.cmake
set(log "${WORK}/skipped_test.tsv")
file(WRITE "${log}" "GpuKernels.A\tno CUDA device present (or built without CUDA): GPU test not run\n"
                    "GpuKernels.B\tno CUDA device present (or built without CUDA): GPU test not run\n"
                    "GpuKernels.C\tdevice cannot hold two caches of 9 bytes\n")
execute_process(COMMAND "${CMAKE_COMMAND}" -DLOG=${log} -P "${SCRIPT}" ERROR_VARIABLE err RESULT_VARIABLE rc)
foreach(want "2 skipped: no CUDA device present (or built without CUDA): GPU test not run"
             "(GpuKernels.A, GpuKernels.B)" "1 skipped: device cannot hold two caches of 9 bytes")
  string(FIND "${err}" "${want}" at)
  if(at EQUAL -1 OR NOT rc EQUAL 0)
    message(FATAL_ERROR "print_skips.cmake (rc ${rc}) did not print '${want}':\n${err}")
  endif()
endforeach()
file(REMOVE "${log}")
execute_process(COMMAND "${CMAKE_COMMAND}" -DLOG=${log} -P "${SCRIPT}" ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT err STREQUAL "")
  message(FATAL_ERROR "without a log print_skips.cmake must print nothing and succeed (rc ${rc}): ${err}")
endif()
