# ctest: install membudget to a temporary prefix, check that the installed headers and packages
# ask for nothing a consumer does not need, then build and run docs/examples/scheduler (the C++
# scheduler through the umbrella header, and the C one through the C ABI) twice: with CMake
# (find_package(membudget CONFIG), nlohmann_json disabled) and with the pkg-config flags alone.
# cmake -DBUILD_DIR=… -DSOURCE_DIR=… -DWORK_DIR=… [-DC_COMPILER=… -DCXX_COMPILER=…] -P install_example.cmake
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 240)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(LAST_OUT "${out}" PARENT_SCOPE)
endfunction()
# The scheduler's output, from whichever build.
function(check_schedulers cxx_exe c_exe how)
  run(${cxx_exe} ${SOURCE_DIR}/configs/llama-3.2-1b.yaml H100)
  message(STATUS "${how}: ${LAST_OUT}")
  if(NOT LAST_OUT MATCHES "micro-batch [0-9]+ x [0-9]+ steps")
    message(FATAL_ERROR "unexpected scheduler output (${how}):\n${LAST_OUT}")
  endif()
  run(${c_exe} ${SOURCE_DIR}/configs/llama-3.2-1b.yaml H100)
  if(NOT LAST_OUT MATCHES "max micro-batch [1-9]")
    message(FATAL_ERROR "unexpected scheduler_c output (${how}):\n${LAST_OUT}")
  endif()
endfunction()

run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
foreach(f include/membudget/api.hpp include/membudget/membudget.hpp include/membudget/membudget.h bin/membudget)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()

# ---- the public headers depend only on the standard library and on each other ----
# Allowed: "membudget/…" (or <membudget/…>), a C++ standard header (<name>, no dot or slash) and,
# for the C ABI, <stddef.h> / <stdint.h> / <stdbool.h>. Anything else (<nlohmann/json.hpp>,
# <yaml-cpp/yaml.h>) would make every consumer need that library.
file(GLOB headers ${prefix}/include/membudget/*)
file(READ ${prefix}/include/membudget/membudget.hpp umbrella)
foreach(h ${headers})
  get_filename_component(name ${h} NAME)
  file(STRINGS ${h} includes REGEX "^[ \t]*#[ \t]*include")
  foreach(line ${includes})
    if(NOT line MATCHES "^[ \t]*#[ \t]*include[ \t]*(\"membudget/[a-z_]+\\.hpp\"|<membudget/[a-z_]+\\.hpp>|<[a-z_]+>|<std(def|int|bool)\\.h>)")
      message(FATAL_ERROR "include/membudget/${name}: '${line}' is neither the standard library nor membudget")
    endif()
  endforeach()
  # the umbrella header includes every C++ header (the C ABI, membudget.h, stands apart)
  if(name MATCHES "\\.hpp$" AND NOT name STREQUAL "membudget.hpp" AND NOT umbrella MATCHES "#include \"membudget/${name}\"")
    message(FATAL_ERROR "include/membudget/membudget.hpp does not include membudget/${name}")
  endif()
endforeach()

# ---- the CMake package: find_package(membudget CONFIG) with nlohmann_json unavailable ----
file(GLOB exported ${prefix}/lib*/cmake/membudget/*.cmake ${prefix}/lib/*/cmake/membudget/*.cmake)
foreach(f ${exported})
  file(READ ${f} text)
  if(text MATCHES "nlohmann")
    message(FATAL_ERROR "${f} names nlohmann_json, which no consumer needs")
  endif()
endforeach()
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/docs/examples/scheduler -B ${WORK_DIR}/build -G Ninja
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release -DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
check_schedulers(${WORK_DIR}/build/scheduler ${WORK_DIR}/build/scheduler_c "find_package")

# ---- pkg-config: both examples against the installed library, with its flags and nothing else ----
file(GLOB pc ${prefix}/lib*/pkgconfig/membudget.pc ${prefix}/lib/*/pkgconfig/membudget.pc)
if(NOT pc)
  message(FATAL_ERROR "membudget.pc not installed")
endif()
find_program(PKG_CONFIG pkg-config)
if(NOT C_COMPILER)
  find_program(C_COMPILER NAMES cc gcc)
endif()
if(NOT CXX_COMPILER)
  find_program(CXX_COMPILER NAMES c++ g++)
endif()
if(NOT PKG_CONFIG OR NOT C_COMPILER OR NOT CXX_COMPILER)
  message(FATAL_ERROR "pkg-config, a C compiler and a C++ compiler are needed to check membudget.pc")
endif()
get_filename_component(pcdir ${pc} DIRECTORY)
set(ENV{PKG_CONFIG_PATH} ${pcdir})
run(${PKG_CONFIG} --cflags --libs membudget)
string(STRIP "${LAST_OUT}" flags)
message(STATUS "pkg-config --cflags --libs membudget: ${flags}")
separate_arguments(flags UNIX_COMMAND "${flags}")
run(${C_COMPILER} ${SOURCE_DIR}/docs/examples/scheduler/scheduler_c.c ${flags} -o ${WORK_DIR}/scheduler_c_pc)
# -std=c++20 is the consumer's choice of language (the headers are C++20), not a package flag
run(${CXX_COMPILER} -std=c++20 ${SOURCE_DIR}/docs/examples/scheduler/scheduler.cpp ${flags} -o ${WORK_DIR}/scheduler_pc)
check_schedulers(${WORK_DIR}/scheduler_pc ${WORK_DIR}/scheduler_c_pc "pkg-config")
