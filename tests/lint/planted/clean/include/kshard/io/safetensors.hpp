#pragma once
// A higher layer may include a wing's internals; io/ holds the faces of io/detail/.
#include "kshard/io/detail/mpi_file.hpp"
#include "kshard/redistribute/plan.hpp"
#include "kshard/rowwise.hpp"

namespace kshard::io {
inline const char* describe() { return "uses MPI_File_open and kshard::io::detail"; }
}  // namespace kshard::io
