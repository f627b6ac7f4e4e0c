#pragma once

/// \file
/// `Mesh<N>`: an N-dimensional grid of MPI ranks with named dimensions and one
/// sub-communicator per dimension.

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (moved here in fmt 11)

#include "kshard/comm/group.hpp"
#include "kshard/detail/agreement.hpp"
#include "kshard/detail/mpi.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/error.hpp"

namespace kshard {

/// An N-D grid over an MPI communicator, row-major (the last dimension varies fastest, as
/// in `torch.distributed.DeviceMesh`). Copies share the communicators, which are created
/// once by the constructor (collective) and freed once, when the last copy is destroyed.
template <std::size_t N>
class Mesh {
  static_assert(N >= 1, "kshard::Mesh<N>: a mesh needs at least one dimension");

 public:
  /// Builds the mesh collectively over `comm` (which is duplicated). Every rank throws the
  /// same `kshard::error` when the shape's product is not the communicator size, an extent
  /// is < 1, names repeat, or the ranks disagree on the mesh rank `N`, the shape or the names.
  /// A rank given `MPI_COMM_NULL` throws at once, without communicating (it is in no
  /// communicator to tell the others through).
  Mesh(MPI_Comm comm, const std::array<int, N>& shape, const std::array<std::string, N>& names)
      : state_(std::make_shared<State>()) {
    const detail::Operation operation("Mesh");
    if (comm == MPI_COMM_NULL)
      throw error(
          "kshard::Mesh: the communicator is MPI_COMM_NULL on this rank (a rank outside the "
          "group of an MPI_Comm_split or MPI_Comm_create); build the mesh only on the ranks of "
          "the communicator");
    State& s = *state_;
    s.shape = shape;
    s.names = names;
    // Duplicate first (collective whatever the arguments): the checks then run on kshard's own
    // communicator, whose MPI errors come back as codes that check_mpi turns into
    // kshard::error, instead of aborting through the caller's error handler.
    auto whole = detail::Communicator::duplicate(comm);
    detail::check_mpi(MPI_Comm_set_errhandler(whole.get(), MPI_ERRORS_RETURN),
                      "MPI_Comm_set_errhandler");
    whole.set_name("the whole mesh");
    s.group = comm::Group(whole);
    s.size = s.group.size();
    s.rank = s.group.rank();
    agree_on_shape(s.group, shape, names, s.size);
    s.coords = coords_of(s.rank);
    for (std::size_t m = 0; m < N; ++m) {
      // Ranks that differ only in coordinate m share a colour: the linear index of the others.
      int colour = 0;
      for (std::size_t j = 0; j < N; ++j)
        if (j != m) colour = colour * shape[j] + s.coords[j];
      MPI_Comm sub = MPI_COMM_NULL;
      detail::check_mpi(MPI_Comm_split(whole.get(), colour, s.coords[m], &sub), "MPI_Comm_split");
      auto dimension = detail::Communicator::adopt(sub);
      dimension.set_name(fmt::format("mesh dimension {} ('{}')", m, names[m]));
      s.dim_groups[m] = comm::Group(dimension);
    }
  }

  /// Builds the mesh with default dimension names "d0", "d1", ...
  Mesh(MPI_Comm comm, const std::array<int, N>& shape) : Mesh(comm, shape, default_names()) {}

  /// Number of mesh dimensions.
  static constexpr std::size_t rank() { return N; }
  /// Extent of every mesh dimension.
  [[nodiscard]] const std::array<int, N>& shape() const { return state_->shape; }
  /// Extent of mesh dimension `m`.
  [[nodiscard]] int extent(std::size_t m) const { return state_->shape[m]; }
  /// Names of the mesh dimensions.
  [[nodiscard]] const std::array<std::string, N>& names() const { return state_->names; }
  /// Number of ranks in the mesh.
  [[nodiscard]] int size() const { return state_->size; }
  /// This process's rank in `comm()`.
  [[nodiscard]] int my_rank() const { return state_->rank; }
  /// This process's mesh coordinates.
  [[nodiscard]] const std::array<int, N>& coords() const { return state_->coords; }
  /// The mesh's own communicator (a duplicate of the one given).
  [[nodiscard]] MPI_Comm comm() const { return state_->group.native(); }
  /// The ranks that differ from this one only in coordinate `m`, ranked by that coordinate.
  [[nodiscard]] MPI_Comm dim_comm(std::size_t m) const { return state_->dim_groups[m].native(); }
  /// The whole mesh as kshard's communication layer sees it (kshard/comm/group.hpp).
  [[nodiscard]] const comm::Group& group() const { return state_->group; }
  /// Mesh dimension `m` as kshard's communication layer sees it (the ranks of `dim_comm(m)`).
  [[nodiscard]] const comm::Group& dim_group(std::size_t m) const { return state_->dim_groups[m]; }

  /// Index of the dimension called `name`; throws `kshard::error` when there is none.
  [[nodiscard]] std::size_t dim(std::string_view name) const {
    for (std::size_t m = 0; m < N; ++m)
      if (state_->names[m] == name) return m;
    throw error(fmt::format("kshard: mesh has no dimension named '{}' (it has {})", name,
                            fmt::join(state_->names, ", ")));
  }

  /// Coordinates of `rank` (row-major).
  [[nodiscard]] std::array<int, N> coords_of(int rank) const {
    std::array<int, N> c{};
    for (std::size_t m = N; m-- > 0;) {
      c[m] = rank % state_->shape[m];
      rank /= state_->shape[m];
    }
    return c;
  }

  /// Rank at coordinates `c` (row-major).
  [[nodiscard]] int rank_of(const std::array<int, N>& c) const {
    int rank = 0;
    for (std::size_t m = 0; m < N; ++m) rank = rank * state_->shape[m] + c[m];
    return rank;
  }

  /// Two meshes are the same when they share their communicators (copies of one mesh).
  friend bool operator==(const Mesh& a, const Mesh& b) { return a.state_ == b.state_; }

 private:
  struct State {
    std::array<int, N> shape{};
    std::array<std::string, N> names{};
    int size = 0;
    int rank = 0;
    std::array<int, N> coords{};
    comm::Group group;
    std::array<comm::Group, N> dim_groups{};
  };

  static std::array<std::string, N> default_names() {
    std::array<std::string, N> names;
    for (std::size_t m = 0; m < N; ++m) names[m] = fmt::format("d{}", m);
    return names;
  }

  // One agreement: the mesh rank first (a Mesh<1> on one rank and a Mesh<2> on another meet
  // in the same fixed-size collective), then names and shape, then each rank's own checks.
  static void agree_on_shape(const comm::Group& group, const std::array<int, N>& shape,
                             const std::array<std::string, N>& names, int size) {
    detail::Agreement agreement(group);
    agreement.same("the mesh rank (number of dimensions)", static_cast<std::int64_t>(N));
    detail::Digest digest;
    for (const std::string& name : names) digest.add(name);
    const std::int64_t mine = digest.value();
    agreement.same("the mesh dimension names", mine, [&](std::int64_t v) {
      return v == mine ? fmt::format("({})", fmt::join(names, ", ")) : std::string("other names");
    });
    for (std::size_t m = 0; m < N; ++m)
      agreement.same(fmt::format("the extent of mesh dimension {}", m), shape[m]);
    agreement.problem(shape_problem(shape, names, size));
    agreement.settle();
  }

  static std::optional<std::string> shape_problem(const std::array<int, N>& shape,
                                                  const std::array<std::string, N>& names,
                                                  int size) {
    std::int64_t product = 1;
    bool overflow = false;
    for (std::size_t m = 0; m < N; ++m) {
      if (shape[m] < 1)
        return fmt::format("kshard: mesh dimension {} ('{}') has extent {}; it must be >= 1", m,
                           names[m], shape[m]);
      overflow = overflow || __builtin_mul_overflow(product, std::int64_t{shape[m]}, &product);
      for (std::size_t j = 0; j < m; ++j)
        if (names[j] == names[m])
          return fmt::format("kshard: mesh dimension name '{}' is used twice", names[m]);
    }
    if (overflow)
      return fmt::format("kshard: mesh shape ({}) holds more than {} ranks", fmt::join(shape, ", "),
                         std::numeric_limits<std::int64_t>::max());
    if (product != size)
      return fmt::format("kshard: mesh shape ({}) holds {} ranks but the communicator has {}",
                         fmt::join(shape, ", "), product, size);
    return std::nullopt;
  }

  std::shared_ptr<State> state_;
};

/// Deduces `N` from a braced shape: `Mesh(comm, {2, 2})` is a `Mesh<2>`.
template <std::size_t N>
Mesh(MPI_Comm, const int (&)[N]) -> Mesh<N>;
/// Deduces `N` from a braced shape and names: `Mesh(comm, {2, 2}, {"dp", "tp"})`.
template <std::size_t N>
Mesh(MPI_Comm, const int (&)[N], const char* const (&)[N]) -> Mesh<N>;

}  // namespace kshard
