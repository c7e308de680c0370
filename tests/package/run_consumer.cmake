# cmake -P script behind the Package.* tests. MODE:
#   installed   install BUILD_DIR into WORK_DIR/prefix, build CONSUMER_DIR against it with
#               find_package(decodegraph), run it
#   shared      configure SOURCE_DIR host-only with BUILD_SHARED_LIBS=ON (library only), install it,
#               build the same consumer with spdlog and fmt hidden from it, run it
#   subproject  configure SUBPROJECT_DIR, which add_subdirectory()s SOURCE_DIR host-only with GTest
#               and Benchmark hidden and no build type, build it and run it
# The installed include tree must not mention spdlog or fmt, nor include internal headers.
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

function(check_include_tree prefix)
  file(GLOB_RECURSE headers ${prefix}/include/*)
  if(NOT headers)
    message(FATAL_ERROR "no headers installed under ${prefix}/include")
  endif()
  foreach(h IN LISTS headers)
    file(READ ${h} text)
    if(text MATCHES "[Ss][Pp][Dd][Ll][Oo][Gg]|fmt/|fmt::")
      message(FATAL_ERROR "${h} mentions spdlog or fmt: they are private dependencies")
    endif()
    if(text MATCHES "#include [\"<](kernels|executor|graphs)/")
      message(FATAL_ERROR "${h} includes an internal header, which is not installed")
    endif()
  endforeach()
  if(NOT EXISTS ${prefix}/include/decodegraph/version.hpp)
    message(FATAL_ERROR "the generated version.hpp was not installed")
  endif()
endfunction()

set(common_args -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
set(prefix ${WORK_DIR}/prefix)

if(MODE STREQUAL "installed" OR MODE STREQUAL "shared")
  if(MODE STREQUAL "shared")
    run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/lib ${common_args} -DCMAKE_BUILD_TYPE=Release
        -DBUILD_SHARED_LIBS=ON -DDECODEGRAPH_ENABLE_CUDA=OFF -DDECODEGRAPH_BUILD_TESTS=OFF
        -DDECODEGRAPH_BUILD_BENCH=OFF)
    run(${CMAKE_COMMAND} --build ${WORK_DIR}/lib -j 2)
    set(BUILD_DIR ${WORK_DIR}/lib)
  endif()
  run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
  check_include_tree(${prefix})
  set(consumer_args -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
  if(MODE STREQUAL "shared")
    file(GLOB shared_libs ${prefix}/lib*/libdecodegraph.so*)
    file(GLOB static_libs ${prefix}/lib*/libdecodegraph.a)
    if(NOT shared_libs OR static_libs)
      message(FATAL_ERROR "expected only libdecodegraph.so under ${prefix}: '${shared_libs}' '${static_libs}'")
    endif()
    file(GLOB_RECURSE targets_files ${prefix}/*/decodegraphTargets*.cmake)
    foreach(f IN LISTS targets_files)
      # IMPORTED_LINK_DEPENDENT_LIBRARIES may name spdlog: it only tells the linker where the .so's
      # own dependencies are (-rpath-link) and is ignored when the target is not there.
      file(STRINGS ${f} lines REGEX "spdlog|fmt::")
      list(FILTER lines EXCLUDE REGEX "IMPORTED_LINK_DEPENDENT_LIBRARIES")
      if(lines)
        message(FATAL_ERROR "${f} passes spdlog or fmt on to consumers of the shared library")
      endif()
    endforeach()
    # A consumer of the shared library needs neither spdlog's nor fmt's CMake package.
    list(APPEND consumer_args -DCMAKE_DISABLE_FIND_PACKAGE_spdlog=ON -DCMAKE_DISABLE_FIND_PACKAGE_fmt=ON)
  endif()
  run(${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/build ${common_args} ${consumer_args})
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
  run(${WORK_DIR}/build/consumer)
  message(STATUS "${last_output}")
  if(EXPECT_CUDA)
    set(expected "cuda=1")
  else()
    set(expected "cuda=0")
  endif()
  if(NOT last_output MATCHES "decodegraph [0-9]+\\.[0-9]+\\.[0-9]+ ${expected} ok")
    message(FATAL_ERROR "unexpected consumer output: ${last_output}")
  endif()
elseif(MODE STREQUAL "subproject")
  # No CMAKE_BUILD_TYPE on purpose: the subproject must leave it empty (and it builds fastest).
  run(${CMAKE_COMMAND} -S ${SUBPROJECT_DIR} -B ${WORK_DIR}/build ${common_args}
      -DDECODEGRAPH_SOURCE_DIR=${SOURCE_DIR} -DDECODEGRAPH_ENABLE_CUDA=OFF
      -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON -DCMAKE_DISABLE_FIND_PACKAGE_benchmark=ON)
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/build -j 2)
  run(${WORK_DIR}/build/subproject_consumer)
  message(STATUS "${last_output}")
  if(NOT last_output MATCHES "decodegraph [0-9]+\\.[0-9]+\\.[0-9]+ via shared object: ok")
    message(FATAL_ERROR "unexpected output: ${last_output}")
  endif()
else()
  message(FATAL_ERROR "MODE = '${MODE}'; allowed: installed, shared, subproject")
endif()
