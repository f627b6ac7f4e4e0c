# cmake -DDOXYGEN_EXECUTABLE=... -DDOXYFILE=... -DOUTPUT_DIR=... [-DFAIL_ON_WARNINGS=ON]
#       -P kshardRunDoxygen.cmake
# Runs Doxygen with DOXYFILE, writing into OUTPUT_DIR (HTML in OUTPUT_DIR/html, warnings in
# OUTPUT_DIR/doxygen-warnings.log), and prints the warnings; with FAIL_ON_WARNINGS, any warning
# (an undocumented public symbol, a broken reference) fails the run.
foreach(var DOXYGEN_EXECUTABLE DOXYFILE OUTPUT_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "kshardRunDoxygen.cmake: -D${var}=... is required")
  endif()
endforeach()

# Later settings override earlier ones in a Doxyfile: the same configuration, another place.
set(log ${OUTPUT_DIR}/doxygen-warnings.log)
file(MAKE_DIRECTORY ${OUTPUT_DIR})
file(REMOVE ${log})
file(READ ${DOXYFILE} config)
string(APPEND config "\nOUTPUT_DIRECTORY = \"${OUTPUT_DIR}\"\nWARN_LOGFILE = \"${log}\"\n")
file(WRITE ${OUTPUT_DIR}/Doxyfile.run "${config}")

execute_process(COMMAND ${DOXYGEN_EXECUTABLE} ${OUTPUT_DIR}/Doxyfile.run
                WORKING_DIRECTORY ${OUTPUT_DIR} RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "kshard: doxygen failed (exit status ${status})")
endif()

set(warnings "")
if(EXISTS ${log})
  file(READ ${log} warnings)
  string(STRIP "${warnings}" warnings)
endif()
if(warnings STREQUAL "")
  message(STATUS "kshard: API reference in ${OUTPUT_DIR}/html/index.html, no Doxygen warnings")
  return()
endif()
message(NOTICE "${warnings}")  # as Doxygen wrote them, one per line
string(CONCAT what "Doxygen warnings above (document every public symbol with ///; "
                   "include/kshard/detail and kshard::detail are exempt)")
if(FAIL_ON_WARNINGS)
  message(FATAL_ERROR "kshard: ${what}")
endif()
message(WARNING "kshard: ${what}; API reference in ${OUTPUT_DIR}/html/index.html")
