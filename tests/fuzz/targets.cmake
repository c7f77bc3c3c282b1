# Which tests/fuzz/fuzz_*.cpp can be built in this checkout. Shared by the main build (to register
# the ctest runs) and by tests/fuzz/CMakeLists.txt (to build them with clang++).
#
# A fuzz target may name the library sources it needs in a comment line
#   // fuzz-requires: src/diagnose/pickle.cpp
# and is skipped while one of them is missing (fuzz_pickle needs src/diagnose/pickle.cpp even
# without the comment).
function(membudget_fuzz_targets root out_var)
  file(GLOB sources CONFIGURE_DEPENDS ${root}/tests/fuzz/fuzz_*.cpp)
  set(names "")
  foreach(src ${sources})
    get_filename_component(name ${src} NAME_WE)
    file(STRINGS ${src} requires REGEX "^// fuzz-requires:")
    if(name STREQUAL "fuzz_pickle")
      list(APPEND requires "// fuzz-requires: src/diagnose/pickle.cpp")
    endif()
    set(ok TRUE)
    foreach(line ${requires})
      string(REGEX REPLACE "^// fuzz-requires:[ \t]*" "" files "${line}")
      separate_arguments(files)
      foreach(f ${files})
        if(NOT EXISTS ${root}/${f})
          set(ok FALSE)
        endif()
      endforeach()
    endforeach()
    if(ok)
      list(APPEND names ${name})
    else()
      message(STATUS "membudget fuzz: skipping ${name} (a source it requires is missing)")
    endif()
  endforeach()
  set(${out_var} ${names} PARENT_SCOPE)
endfunction()
