# Warnings for kshard's own code (tests, examples): strict, and errors when
# KSHARD_WARNINGS_AS_ERRORS is on. Kokkos, MPI and fmt come in as system headers.
option(KSHARD_WARNINGS_AS_ERRORS "Treat warnings in kshard's own code as errors" OFF)

add_library(kshard_warnings INTERFACE)
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(kshard_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion
                              $<$<BOOL:${KSHARD_WARNINGS_AS_ERRORS}>:-Werror>>)
endif()
