# The API reference: a `docs` target that runs Doxygen on the public headers (HTML in
# <build>/docs/html) and, with the tests, the ctest case docs_no_undocumented, which fails
# listing Doxygen's warnings (an undocumented public symbol, a broken reference) when there is any.
find_package(Doxygen QUIET)
if(NOT DOXYGEN_FOUND)
  message(FATAL_ERROR "kshard: KSHARD_BUILD_DOCS is ON but Doxygen was not found "
                      "(install doxygen, or configure with -DKSHARD_BUILD_DOCS=OFF)")
endif()

set(KSHARD_DOCS_OUTPUT_DIR ${PROJECT_BINARY_DIR}/docs)
configure_file(${PROJECT_SOURCE_DIR}/docs/Doxyfile.in ${KSHARD_DOCS_OUTPUT_DIR}/Doxyfile @ONLY)

add_custom_target(docs
  COMMAND ${CMAKE_COMMAND} -DDOXYGEN_EXECUTABLE=${DOXYGEN_EXECUTABLE}
                           -DDOXYFILE=${KSHARD_DOCS_OUTPUT_DIR}/Doxyfile
                           -DOUTPUT_DIR=${KSHARD_DOCS_OUTPUT_DIR} -DFAIL_ON_WARNINGS=OFF
                           -P ${PROJECT_SOURCE_DIR}/cmake/kshardRunDoxygen.cmake
  COMMENT "Generating the API reference in ${KSHARD_DOCS_OUTPUT_DIR}/html"
  VERBATIM)

if(KSHARD_BUILD_TESTS)
  # Its own output directory, so that it never races a `docs` build.
  add_test(NAME docs_no_undocumented
           COMMAND ${CMAKE_COMMAND} -DDOXYGEN_EXECUTABLE=${DOXYGEN_EXECUTABLE}
                                    -DDOXYFILE=${KSHARD_DOCS_OUTPUT_DIR}/Doxyfile
                                    -DOUTPUT_DIR=${KSHARD_DOCS_OUTPUT_DIR}/check
                                    -DFAIL_ON_WARNINGS=ON
                                    -P ${PROJECT_SOURCE_DIR}/cmake/kshardRunDoxygen.cmake)
  set_tests_properties(docs_no_undocumented PROPERTIES TIMEOUT 120)
endif()
