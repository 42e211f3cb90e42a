# A Mercury program against Talaria's install (cmake -P; BUILD_DIR, SOURCE_DIR, WORK_DIR, CC):
# this build installed into a scratch prefix, the prefix moved (it must be relocatable), then
# tests/mercury/consumer built and run with find_package(mercury) and with pkg-config mercury,
# pointed at <libdir>/talaria/mercury-compat. A Mercury installed in the same prefix is not
# touched: nothing of Mercury's names is installed outside that folder.
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
endfunction()
set(staging ${WORK_DIR}/staging)
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${staging})
set(prefix ${WORK_DIR}/moved/prefix)
file(MAKE_DIRECTORY ${WORK_DIR}/moved)
file(RENAME ${staging} ${prefix})
file(GLOB_RECURSE config ${prefix}/*/mercury-config.cmake)
if(NOT config)
  message(FATAL_ERROR "no mercury-config.cmake installed under ${prefix}")
endif()
get_filename_component(cmakedir ${config} DIRECTORY)
get_filename_component(root ${cmakedir}/../../.. ABSOLUTE)
# Nothing with Mercury's names outside the compat root.
file(GLOB_RECURSE all RELATIVE ${prefix} ${prefix}/*)
foreach(f ${all})
  get_filename_component(base ${f} NAME)
  if((base MATCHES "^(libmercury|libna)[.]" OR base MATCHES "^(mercury[a-z_]*|na|na_types|na_config)[.]h$"
      OR base MATCHES "^(mercury|na)[.]pc$" OR f MATCHES "cmake/mercury/")
     AND NOT "${prefix}/${f}" MATCHES "^${root}/")
    message(FATAL_ERROR "${f} is installed outside ${root}: it could overwrite Mercury's")
  endif()
endforeach()
file(GLOB_RECURSE installed_text ${root}/*.pc ${root}/*.cmake)
foreach(f ${installed_text})
  file(READ ${f} text)
  string(FIND "${text}" "${staging}" at)
  if(NOT at EQUAL -1)
    message(FATAL_ERROR "${f} names the install-time prefix ${staging}: not relocatable")
  endif()
endforeach()

# find_package(mercury)
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/mercury/consumer -B ${WORK_DIR}/find_package -G Ninja
    -DCMAKE_PREFIX_PATH=${root} -DCMAKE_C_COMPILER=${CC})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/find_package)
run(${WORK_DIR}/find_package/consumer)

# pkg-config mercury
find_program(PKG_CONFIG pkg-config REQUIRED)
set(ENV{PKG_CONFIG_PATH} ${root}/lib/pkgconfig)
execute_process(COMMAND ${PKG_CONFIG} --cflags --libs mercury RESULT_VARIABLE rc
                OUTPUT_VARIABLE pc_flags ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config mercury: ${err}")
endif()
separate_arguments(pc_flags UNIX_COMMAND "${pc_flags}")
run(${CC} -std=c11 -o ${WORK_DIR}/pc_consumer ${SOURCE_DIR}/tests/mercury/consumer/main.c
    ${pc_flags} -Wl,-rpath,${root}/lib)
run(${WORK_DIR}/pc_consumer)
