# ctest driver: install the build tree into a scratch prefix, then configure, build and run
# the consumer project against it. Variables: BUILD_DIR, SOURCE_DIR, WORK_DIR, DISTRIBUTED
# (ON: favor was built with MPI; also build and run the favor::distributed consumer),
# CXX_COMPILER and CXX_FLAGS (favor's compiler and its -fsanitize flags, empty unless
# FAVOR_SANITIZE).
file(REMOVE_RECURSE "${WORK_DIR}")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix"
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "install failed: ${rc}")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${WORK_DIR}/build"
                        "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix" -DCMAKE_BUILD_TYPE=Release
                        "-DFAVOR_CONSUMER_DISTRIBUTED=${DISTRIBUTED}"
                        "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}"
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configure failed: ${rc}")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" --build "${WORK_DIR}/build" RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "build failed: ${rc}")
endif()
execute_process(COMMAND "${WORK_DIR}/build/consumer" RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "consumer run failed: ${rc}")
endif()
if(DISTRIBUTED)
  execute_process(COMMAND "${WORK_DIR}/build/consumer_distributed" RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "consumer_distributed run failed: ${rc}")
  endif()
endif()
# The installed tree holds only the public headers.
file(GLOB_RECURSE headers RELATIVE "${WORK_DIR}/prefix/include" "${WORK_DIR}/prefix/include/*")
foreach(h IN LISTS headers)
  if(NOT h MATCHES "^favor/[a-z_]+\\.hpp$")
    message(FATAL_ERROR "unexpected installed file include/${h}")
  endif()
endforeach()
