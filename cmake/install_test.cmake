# install_test.cmake - ctest install_consumer: installs the build tree into a
# scratch prefix, then builds examples/minimal.c against it and runs it:
#   - find_package(fattn), shared and static;
#   - find_package(fattn), shared only, with the CUDA toolkit hidden
#     (CMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit): libfattn.so needs none; in a
#     CUDA build, asking for the static component then fails, as it must;
#   - pkg-config: the compiler given only what `pkg-config --cflags --libs
#     fattn` prints (no -lm of its own).
#   cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -P install_test.cmake
foreach(v BUILD_DIR SOURCE_DIR WORK_DIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "install_test.cmake: ${v} not set")
  endif()
endforeach()

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}\n${out}\n${err}")
  endif()
  set(run_out "${out}" PARENT_SCOPE)
endfunction()

# the same, for a command that must fail
function(run_fails)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "succeeded but should have failed: ${cmd}\n${out}\n${err}")
  endif()
endfunction()

run(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
# the license travels with every install: its text, and its name in the package files
if(NOT EXISTS "${prefix}/share/doc/fattn/LICENSE")
  message(FATAL_ERROR "the install lacks share/doc/fattn/LICENSE")
endif()
file(GLOB pc "${prefix}/lib*/pkgconfig/fattn.pc")
file(STRINGS "${pc}" pc_license REGEX "^License: BSD-3-Clause$")
file(GLOB cfg "${prefix}/lib*/cmake/fattn/fattnConfig.cmake")
file(STRINGS "${cfg}" cfg_license REGEX "set\\(fattn_LICENSE \"BSD-3-Clause\"\\)")
if(NOT pc_license OR NOT cfg_license)
  message(FATAL_ERROR "fattn.pc or fattnConfig.cmake does not name the license BSD-3-Clause")
endif()
# the installed program finds the installed libfattn.so by itself (its RPATH)
unset(ENV{LD_LIBRARY_PATH})
run("${prefix}/bin/fattn" run --backend cpu --seqlen 64 --iters 1)

run(${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/consumer" -B "${WORK_DIR}/consumer"
    "-DCMAKE_PREFIX_PATH=${prefix}" "-DFATTN_EXAMPLE=${SOURCE_DIR}/examples/minimal.c")
run(${CMAKE_COMMAND} --build "${WORK_DIR}/consumer")
run("${WORK_DIR}/consumer/minimal_shared")
message(STATUS "find_package, shared: ${run_out}")
run("${WORK_DIR}/consumer/minimal_static")
message(STATUS "find_package, static: ${run_out}")

# A consumer without the CUDA toolkit: find_package(CUDAToolkit) is disabled
# outright, whatever is installed on this machine.
set(hidden -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON "-DCMAKE_PREFIX_PATH=${prefix}"
    "-DFATTN_EXAMPLE=${SOURCE_DIR}/examples/minimal.c")
run(${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/consumer" -B "${WORK_DIR}/consumer-nocuda" ${hidden}
    -DFATTN_CONSUMER_STATIC=OFF)
run(${CMAKE_COMMAND} --build "${WORK_DIR}/consumer-nocuda")
run("${WORK_DIR}/consumer-nocuda/minimal_shared")
message(STATUS "find_package, shared, CUDA toolkit hidden: ${run_out}")
file(GLOB config "${prefix}/lib*/cmake/fattn/fattnConfig.cmake")
file(STRINGS "${config}" with_cuda REGEX "set\\(fattn_WITH_CUDA ON\\)")
if(with_cuda)
  run_fails(${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/consumer" -B "${WORK_DIR}/consumer-nocuda-static"
            ${hidden} -DFATTN_CONSUMER_STATIC=ON)
  message(STATUS "find_package(fattn COMPONENTS static), CUDA toolkit hidden: refused, as it must be")
endif()

# pkg-config, when present: shared library through the .pc file.
find_program(PKG_CONFIG pkg-config)
find_program(CC NAMES cc gcc clang)
if(PKG_CONFIG AND CC)
  set(ENV{PKG_CONFIG_PATH} "")
  file(GLOB pcdir "${prefix}/lib*/pkgconfig")
  set(ENV{PKG_CONFIG_PATH} "${pcdir}")
  run(${PKG_CONFIG} --cflags --libs fattn)
  string(STRIP "${run_out}" flags)
  separate_arguments(flags UNIX_COMMAND "${flags}")
  run(${CC} "${SOURCE_DIR}/examples/minimal.c" ${flags} -o "${WORK_DIR}/minimal_pc")
  file(GLOB libdir "${prefix}/lib*")
  set(ENV{LD_LIBRARY_PATH} "${libdir}")
  run("${WORK_DIR}/minimal_pc")
  message(STATUS "pkg-config: ${run_out}")
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
