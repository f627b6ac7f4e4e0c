#pragma once

// The thin layer between kshard and MPI: return-code checks, datatypes, an owning
// communicator handle and the collectives (comm/agreement.hpp builds the argument agreement
// on them). Algorithms call these, never MPI directly.

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <climits>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "kshard/comm/stats.hpp"
#include "kshard/comm/watchdog.hpp"
#include "kshard/detail/element.hpp"
#include "kshard/detail/int_limit.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/error.hpp"

namespace kshard::detail {

// What most likely made an MPI call fail inside kshard, by error class ("" when nothing more
// can be said): the argument checks agree on what the ranks pass, so a size error points at
// what they do not check on every call.
inline const char* likely_mpi_cause(int error_class) {
  switch (error_class) {
    case MPI_ERR_TRUNCATE:
    case MPI_ERR_COUNT:
    case MPI_ERR_BUFFER:
      return "; the ranks most likely passed different sizes, or different matrices to one "
             "plan or call, or called kshard operations in different orders";
    case MPI_ERR_COMM:
    case MPI_ERR_GROUP:
    case MPI_ERR_RANK:
      return "; a communicator was most likely freed, or is not the one the mesh was built on";
    case MPI_ERR_FILE:
    case MPI_ERR_IO:
    case MPI_ERR_NO_SUCH_FILE:
    case MPI_ERR_ACCESS:
    case MPI_ERR_NO_SPACE:
    case MPI_ERR_READ_ONLY:
      return "; the file system refused (a path, permission or space problem)";
    default:
      return "";
  }
}

// Throws for an MPI error, naming the kshard operation, the MPI call, MPI's text and the
// likely cause.
inline void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  // One more zeroed byte: MPICH fills a long error stack up to MPI_MAX_ERROR_STRING without a
  // terminator, then takes its strlen.
  char text[MPI_MAX_ERROR_STRING + 1] = {};
  int length = 0;
  MPI_Error_string(rc, text, &length);
  int error_class = MPI_ERR_OTHER;
  MPI_Error_class(rc, &error_class);
  throw error(fmt::format("kshard::{}: {} failed: {}{}", operation_name(), call,
                          std::string(text, static_cast<std::size_t>(length)),
                          likely_mpi_cause(error_class)));
}

// The MPI type of a reducible element of the table (element.hpp).
inline MPI_Datatype reducible_mpi_datatype(ElementCode code) {
  switch (code) {
    case ElementCode::f32:
      return MPI_FLOAT;
    case ElementCode::f64:
      return MPI_DOUBLE;
    case ElementCode::i32:
      return MPI_INT32_T;
    default:
      return MPI_INT64_T;
  }
}

// Reductions use the arithmetic types; other trivially copyable elements (bf16) only move,
// as unsigned integers of their size.
template <class T>
MPI_Datatype mpi_datatype() {
  using U = std::remove_cv_t<T>;
  if constexpr (reducible_element<U>())
    return reducible_mpi_datatype(element_info<U>().code);
  else if constexpr (std::is_same_v<U, char>)
    return MPI_CHAR;
  else if constexpr (std::is_trivially_copyable_v<U> && sizeof(U) == 2)
    return MPI_UINT16_T;
  else if constexpr (std::is_trivially_copyable_v<U> && sizeof(U) == 4)
    return MPI_UINT32_T;
  else if constexpr (std::is_trivially_copyable_v<U> && sizeof(U) == 8)
    return MPI_UINT64_T;
  else
    static_assert(sizeof(U) == 0, "kshard: no MPI datatype for this element type");
}

inline int comm_rank(MPI_Comm comm) {
  int rank = 0;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  return rank;
}

inline int comm_size(MPI_Comm comm) {
  int size = 0;
  check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  return size;
}

// The rank users know, for messages.
inline int world_rank() { return comm_rank(MPI_COMM_WORLD); }

// The collectives kshard uses: checked, and counted in comm_stats() (payload this rank sends).
// Buffers must be host memory or, with a GPU-aware MPI, fenced device memory.
inline void count_collective(std::int64_t bytes) {
  ++comm_stats().collectives;
  comm_stats().bytes_sent += bytes;
}

template <class T>
void allreduce(T* data, int count, MPI_Op op, MPI_Comm comm) {
  count_collective(static_cast<std::int64_t>(count) * static_cast<std::int64_t>(sizeof(T)));
  const WatchedCollective watched("MPI_Allreduce", comm);
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, data, count, mpi_datatype<T>(), op, comm), "MPI_Allreduce");
}

template <class T>
void allreduce(const T* send, T* recv, int count, MPI_Op op, MPI_Comm comm) {
  count_collective(static_cast<std::int64_t>(count) * static_cast<std::int64_t>(sizeof(T)));
  const WatchedCollective watched("MPI_Allreduce", comm);
  check_mpi(MPI_Allreduce(send, recv, count, mpi_datatype<T>(), op, comm), "MPI_Allreduce");
}

template <class T>
void allgather(const T* send, int count, T* recv, MPI_Comm comm) {
  count_collective(static_cast<std::int64_t>(count) * static_cast<std::int64_t>(sizeof(T)));
  const WatchedCollective watched("MPI_Allgather", comm);
  check_mpi(MPI_Allgather(send, count, mpi_datatype<T>(), recv, count, mpi_datatype<T>(), comm),
            "MPI_Allgather");
}

template <class T>
void allgatherv(const T* send, int count, T* recv, const int* counts, const int* displs,
                MPI_Comm comm) {
  count_collective(static_cast<std::int64_t>(count) * static_cast<std::int64_t>(sizeof(T)));
  const WatchedCollective watched("MPI_Allgatherv", comm);
  check_mpi(
      MPI_Allgatherv(send, count, mpi_datatype<T>(), recv, counts, displs, mpi_datatype<T>(), comm),
      "MPI_Allgatherv");
}

// Rank `root` receives every rank's `count` elements, rank r's `counts[r]` at `displs[r]` of
// `recv` (`recv`, `counts` and `displs` are read on the root only). Counted: the payload this
// rank sends to the root (the root's own block is a local copy and is not counted).
template <class T>
void gatherv(const T* send, int count, T* recv, const int* counts, const int* displs, int root,
             MPI_Comm comm) {
  count_collective(comm_rank(comm) == root
                       ? 0
                       : static_cast<std::int64_t>(count) * static_cast<std::int64_t>(sizeof(T)));
  const WatchedCollective watched("MPI_Gatherv", comm);
  check_mpi(MPI_Gatherv(send, count, mpi_datatype<T>(), recv, counts, displs, mpi_datatype<T>(),
                        root, comm),
            "MPI_Gatherv");
}

// Rank `root` sends `counts[r]` elements at `displs[r]` of `send` to each rank r (`send`,
// `counts` and `displs` are read on the root only), which receives its `count` in `recv`.
// Counted on the root: the payload it sends to the other ranks (its own block is a local copy).
template <class T>
void scatterv(const T* send, const int* counts, const int* displs, T* recv, int count, int root,
              MPI_Comm comm) {
  std::int64_t elements = 0;
  if (comm_rank(comm) == root)
    for (int r = 0; r < comm_size(comm); ++r)
      if (r != root) elements += counts[r];
  count_collective(elements * static_cast<std::int64_t>(sizeof(T)));
  const WatchedCollective watched("MPI_Scatterv", comm);
  check_mpi(MPI_Scatterv(send, counts, displs, mpi_datatype<T>(), recv, count, mpi_datatype<T>(),
                         root, comm),
            "MPI_Scatterv");
}

template <class T>
void broadcast(T* data, int count, int root, MPI_Comm comm) {
  count_collective(comm_rank(comm) == root
                       ? static_cast<std::int64_t>(count) * static_cast<std::int64_t>(sizeof(T))
                       : 0);
  const WatchedCollective watched("MPI_Bcast", comm);
  check_mpi(MPI_Bcast(data, count, mpi_datatype<T>(), root, comm), "MPI_Bcast");
}

// Personalised all-to-all. Counted: the payload this rank sends to the other ranks (what it
// sends to itself is a local copy and is not counted).
template <class T>
void alltoallv(const T* send, const int* send_counts, const int* send_displs, T* recv,
               const int* recv_counts, const int* recv_displs, MPI_Comm comm) {
  const int size = comm_size(comm);
  const int self = comm_rank(comm);
  std::int64_t elements = 0;
  for (int r = 0; r < size; ++r)
    if (r != self) elements += send_counts[r];
  count_collective(elements * static_cast<std::int64_t>(sizeof(T)));
  const WatchedCollective watched("MPI_Alltoallv", comm);
  check_mpi(MPI_Alltoallv(send, send_counts, send_displs, mpi_datatype<T>(), recv, recv_counts,
                          recv_displs, mpi_datatype<T>(), comm),
            "MPI_Alltoallv");
}

// Reduction of `send` (the blocks of every rank, in rank order, `recv_counts[r]` elements for
// rank r) whose block for this rank lands in `recv`. Counted: the payload this rank sends to
// the other ranks, i.e. its addends of their blocks (its own block stays here).
template <class T>
void reduce_scatter(const T* send, T* recv, const int* recv_counts, MPI_Op op, MPI_Comm comm) {
  const int size = comm_size(comm);
  const int self = comm_rank(comm);
  std::int64_t elements = 0;
  for (int r = 0; r < size; ++r)
    if (r != self) elements += recv_counts[r];
  count_collective(elements * static_cast<std::int64_t>(sizeof(T)));
  const WatchedCollective watched("MPI_Reduce_scatter", comm);
  check_mpi(MPI_Reduce_scatter(send, recv, recv_counts, mpi_datatype<T>(), op, comm),
            "MPI_Reduce_scatter");
}

// True when `a` and `b` hold the same processes in the same order (MPI_IDENT or
// MPI_CONGRUENT), so rank r of one is rank r of the other. Local, not a collective.
inline bool congruent(MPI_Comm a, MPI_Comm b) {
  int result = MPI_UNEQUAL;
  check_mpi(MPI_Comm_compare(a, b, &result), "MPI_Comm_compare");
  return result == MPI_IDENT || result == MPI_CONGRUENT;
}

// Owns an MPI communicator and frees it exactly once, when the last copy goes (and only
// while MPI is still alive, so a handle outliving MPI_Finalize is harmless).
class Communicator {
 public:
  Communicator() = default;
  static Communicator adopt(MPI_Comm comm) { return Communicator(comm); }
  static Communicator duplicate(MPI_Comm comm) {
    MPI_Comm copy = MPI_COMM_NULL;
    check_mpi(MPI_Comm_dup(comm, &copy), "MPI_Comm_dup");
    return Communicator(copy);
  }
  [[nodiscard]] MPI_Comm get() const { return handle_ ? *handle_ : MPI_COMM_NULL; }
  // Names the communicator for MPI's tools and kshard's watchdog messages.
  void set_name(const std::string& name) const {
    check_mpi(MPI_Comm_set_name(get(), name.c_str()), "MPI_Comm_set_name");
  }

 private:
  struct Free {
    void operator()(MPI_Comm* comm) const {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized && *comm != MPI_COMM_NULL) MPI_Comm_free(comm);
      delete comm;
    }
  };
  explicit Communicator(MPI_Comm comm) : handle_(new MPI_Comm(comm), Free{}) {}
  std::shared_ptr<MPI_Comm> handle_;
};

// MPI counts are int: refuse, rather than truncate, a message longer than INT_MAX elements.
// The running operation names the message.
inline int mpi_count(std::int64_t count) {
  return checked_int(count, operation_name(), "the number of elements in one MPI message");
}

}  // namespace kshard::detail
