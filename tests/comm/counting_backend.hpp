#pragma once

// A test-only communication backend, chosen at configure time as a real second backend would
// be (KSHARD_COMM_BACKEND_HEADER): it implements the CommBackend concept (comm/backend.hpp) on
// its own, handing each data collective to the MPI backend after counting it. It proves that the
// algorithms reach the network only through comm::Backend, and that the concept is all a
// backend needs.

#include <utility>

#include "kshard/comm/backend.hpp"
#include "kshard/comm/mpi_backend.hpp"

namespace kshard::comm {

struct CountingBackend {
  using Handle = MpiBackend::Handle;
  static Handle make_handle(MPI_Comm comm) { return MpiBackend::make_handle(comm); }

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
