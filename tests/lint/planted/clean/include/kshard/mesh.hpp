#pragma once
#include <mpi.h>

#include "kshard/comm/group.hpp"
#include "kshard/error.hpp"

namespace kshard {
template <int N>
class Mesh {
 public:
  explicit Mesh(MPI_Comm comm) : comm_(comm) {}
  int size() const { return comm::size(comm_); }

 private:
  MPI_Comm comm_;
};
}  // namespace kshard
