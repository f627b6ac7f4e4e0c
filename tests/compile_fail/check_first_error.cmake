# cmake -DBINARY_DIR=... -DTARGET=... -DREGEX=... -P check_first_error.cmake
# Builds TARGET, which must fail, and checks that the compiler's FIRST error line matches
# REGEX: kshard's message must lead, not follow a screen of candidates and notes.
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BINARY_DIR} --target ${TARGET}
                OUTPUT_VARIABLE output ERROR_VARIABLE output RESULT_VARIABLE result)
if(result EQUAL 0)
  message(FATAL_ERROR "${TARGET} compiled; it must not")
endif()
# GCC, Clang and nvcc write "error:", MSVC "error C<number>:".
string(REGEX MATCH "[^\n]*error( C[0-9]+)?:[^\n]*" first "${output}")
if(NOT first)
  message(FATAL_ERROR "${TARGET} failed without an error line:\n${output}")
endif()
if(NOT first MATCHES "${REGEX}")
  message(FATAL_ERROR "The first error line is not the expected kshard message '${REGEX}':\n"
                      "${first}\n\nThe whole output:\n${output}")
endif()
message(STATUS "First error line: ${first}")
