#pragma once

// A test-only communication backend, chosen at configure time as a real second backend would
// be (KSHARD_COMM_BACKEND_HEADER): MPI underneath, counting every data collective it is handed.
// It proves that the algorithms reach the network only through comm::Backend.

#include "kshard/comm/mpi_backend.hpp"

namespace kshard::comm {

struct CountingBackend : MpiBackend {
  static int& calls() {
    static int n = 0;
    return n;
  }
  template <class... Args>
  static void allreduce(Args&&... args) {
    ++calls();
    MpiBackend::allreduce(std::forward<Args>(args)...);
  }
  template <class... Args>
  static void bcast(Args&&... args) {
    ++calls();
    MpiBackend::bcast(std::forward<Args>(args)...);
  }
  template <class... Args>
  static void allgatherv(Args&&... args) {
    ++calls();
    MpiBackend::allgatherv(std::forward<Args>(args)...);
  }
  template <class... Args>
  static void alltoallv(Args&&... args) {
    ++calls();
    MpiBackend::alltoallv(std::forward<Args>(args)...);
  }
  template <class... Args>
  static void reduce_scatter(Args&&... args) {
    ++calls();
    MpiBackend::reduce_scatter(std::forward<Args>(args)...);
  }
};

using Backend = CountingBackend;

}  // namespace kshard::comm
