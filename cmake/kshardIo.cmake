# kshard::io, checkpoint I/O (include/kshard/io): header-only like kshard::kshard, but it needs
# nlohmann_json and zlib, so it is a target of its own and kshard::kshard gains no dependency. On by
# default for the top-level project when nlohmann_json 3 is installed (Debian:
# nlohmann-json3-dev); a project that adds kshard as a subdirectory turns it on itself.
set(kshard_io_default OFF)
if(PROJECT_IS_TOP_LEVEL)
  find_package(nlohmann_json 3 QUIET)
  if(nlohmann_json_FOUND)
    set(kshard_io_default ON)
  endif()
endif()
option(KSHARD_BUILD_IO "Add the kshard::io target (safetensors checkpoints; needs nlohmann_json)"
       ${kshard_io_default})

if(KSHARD_BUILD_IO)
  find_package(nlohmann_json 3 REQUIRED)
  # CRC-32 of the ZIP entries inside PyTorch DCP files (Debian: zlib1g-dev).
  find_package(ZLIB REQUIRED)
  add_library(kshard_io INTERFACE)
  add_library(kshard::io ALIAS kshard_io)
  # Installed as kshard::io too (the export's namespace is kshard::).
  set_target_properties(kshard_io PROPERTIES EXPORT_NAME io)
  target_include_directories(kshard_io INTERFACE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                                 $<INSTALL_INTERFACE:include>)
  target_compile_features(kshard_io INTERFACE cxx_std_20)
  target_link_libraries(kshard_io INTERFACE kshard nlohmann_json::nlohmann_json ZLIB::ZLIB)
  message(STATUS "kshard: kshard::io on (nlohmann_json ${nlohmann_json_VERSION})")
  if(KSHARD_INSTALL)
    # The headers are installed with include/kshard; kshardConfig.cmake finds nlohmann_json and
    # ZLIB.
    install(TARGETS kshard_io EXPORT kshardTargets)
  endif()
endif()
