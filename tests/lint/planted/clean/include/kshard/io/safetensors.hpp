#pragma once
// A face may include the floors below it; MPI-IO lives in io/engine/mpi_file.hpp.
#include "kshard/io/engine/mpi_file.hpp"
#include "kshard/redistribute/plan.hpp"
#include "kshard/rowwise.hpp"

namespace kshard::io {
inline const char* describe() { return "uses MPI_File_open and kshard::io::detail"; }
}  // namespace kshard::io
