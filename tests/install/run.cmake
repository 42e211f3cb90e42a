# Downstream projects against Talaria, as a consumer's build meets it (cmake -P):
#   MODE=install  install BUILD_DIR (this build, shared or static as configured)
#   MODE=fetch    build tests/install/fetch (Talaria by FetchContent, SHARED=ON|OFF), run its
#                 consumer, then install that build
# then, in both modes, move the installed prefix elsewhere (it must be relocatable) and build and
# run the same consumer twice against it: with find_package(talaria) and with pkg-config.
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
endfunction()
function(check_shared_or_static libdir)
  file(GLOB so ${libdir}/libtalaria.so*)
  file(GLOB archives ${libdir}/libtalaria_*.a)
  if(SHARED AND (NOT so OR archives))
    message(FATAL_ERROR "shared install: want libtalaria.so and no archive, have '${so}' '${archives}'")
  elseif(NOT SHARED AND (so OR NOT archives))
    message(FATAL_ERROR "static install: want the layer archives and no .so, have '${so}' '${archives}'")
  endif()
endfunction()

set(flags "")
if(SANITIZE)
  set(flags "-DCMAKE_CXX_FLAGS=-fsanitize=${SANITIZE}" "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=${SANITIZE}")
endif()
set(staging ${WORK_DIR}/staging)
if(MODE STREQUAL "fetch")
  # Built at -O0 without debug info: this test is about the build, not the code.
  set(launcher "")
  if(LAUNCHER)
    set(launcher -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER})
  endif()
  run(${CMAKE_COMMAND} -S ${TESTS_DIR}/fetch -B ${WORK_DIR}/fetch -G Ninja
      -DTALARIA_SOURCE_DIR=${SOURCE_DIR} -DBUILD_SHARED_LIBS=${SHARED} -DCMAKE_BUILD_TYPE=
      -DCMAKE_CXX_FLAGS=-O0 -DCMAKE_CXX_COMPILER=${CXX} ${launcher})
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/fetch -j2)
  run(${WORK_DIR}/fetch/consumer)
  run(${CMAKE_COMMAND} --install ${WORK_DIR}/fetch --prefix ${staging})
else()
  run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${staging})
endif()

# Relocatable: the consumers see the prefix only where it was moved to.
set(prefix ${WORK_DIR}/moved/prefix)
file(MAKE_DIRECTORY ${WORK_DIR}/moved)
file(RENAME ${staging} ${prefix})
file(GLOB_RECURSE pc ${prefix}/*/talaria.pc)
if(NOT pc)
  message(FATAL_ERROR "no talaria.pc installed under ${prefix}")
endif()
get_filename_component(pcdir ${pc} DIRECTORY)
get_filename_component(libdir ${pcdir} DIRECTORY)
check_shared_or_static(${libdir})
file(GLOB_RECURSE installed_text ${prefix}/*.pc ${prefix}/*.cmake)
foreach(f ${installed_text})
  file(READ ${f} text)
  string(FIND "${text}" "${staging}" at)
  if(NOT at EQUAL -1)
    message(FATAL_ERROR "${f} names the install-time prefix ${staging}: not relocatable")
  endif()
endforeach()

# find_package(talaria)
run(${CMAKE_COMMAND} -S ${TESTS_DIR}/consumer -B ${WORK_DIR}/find_package -G Ninja
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${CXX} ${flags})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/find_package)
run(${WORK_DIR}/find_package/consumer)

# pkg-config (--static for the archives), with the rpath a shared install needs
find_program(PKG_CONFIG pkg-config REQUIRED)
set(static "")
if(NOT SHARED)
  set(static --static)
endif()
set(ENV{PKG_CONFIG_PATH} ${pcdir})
execute_process(COMMAND ${PKG_CONFIG} --cflags --libs ${static} talaria
                RESULT_VARIABLE rc OUTPUT_VARIABLE pc_flags ERROR_VARIABLE err
                OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config --cflags --libs ${static} talaria failed: ${err}")
endif()
message("pkg-config: ${pc_flags}")
separate_arguments(pc_flags UNIX_COMMAND "${pc_flags}")
set(san "")
if(SANITIZE)
  set(san -fsanitize=${SANITIZE})
endif()
run(${CXX} -std=c++20 ${san} ${TESTS_DIR}/consumer/main.cpp ${pc_flags} -Wl,-rpath,${libdir}
    -o ${WORK_DIR}/consumer_pkg_config)
run(${WORK_DIR}/consumer_pkg_config)
