# One decode_loop check for ctest (bench/CMakeLists.txt registers them): runs PROG with ARGS
# (space-separated), then requires exit status EXPECT_RC and every regex of MATCH ("@@"-separated) in
# what it printed (stdout and stderr together). Both at once: PASS_REGULAR_EXPRESSION alone would
# ignore the exit status, WILL_FAIL alone would accept any failure (a crash included).
#   cmake -DPROG=... -DARGS="..." -DEXPECT_RC=0 -DMATCH="re1@@re2" -P decode_loop_test.cmake
separate_arguments(args UNIX_COMMAND "${ARGS}")
execute_process(COMMAND "${PROG}" ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
if(NOT "${rc}" STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "decode_loop ${ARGS}: exit status ${rc}, expected ${EXPECT_RC}; it printed:\n${all}")
endif()
# Split by hand: a CMake list would not split at a ";" inside the regexes' brackets.
set(rest "${MATCH}@@")
while(NOT rest STREQUAL "")
  string(FIND "${rest}" "@@" at)
  string(SUBSTRING "${rest}" 0 ${at} re)
  math(EXPR next "${at} + 2")
  string(SUBSTRING "${rest}" ${next} -1 rest)
  if(NOT all MATCHES "${re}")
    message(FATAL_ERROR "decode_loop ${ARGS}: nothing printed matches '${re}'; it printed:\n${all}")
  endif()
endwhile()
message(STATUS "decode_loop ${ARGS}: exit status ${rc} and ${MATCH}")
