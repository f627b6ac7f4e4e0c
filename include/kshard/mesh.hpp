#pragma once

/// \file
/// `Mesh<N>`: an N-dimensional grid of MPI ranks with named dimensions and one
/// sub-communicator per dimension.

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (moved here in fmt 11)

#include "kshard/comm/agreement.hpp"
#include "kshard/comm/group.hpp"
#include "kshard/comm/mpi.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/error.hpp"
#include "kshard/layout_mapping.hpp"

namespace kshard {

namespace detail {
// A mesh dimension as `Mesh::sub` takes it: its name or its index.
template <class D>
concept MeshDimension = std::convertible_to<const D&, std::string_view> ||
    (std::integral<D> && !std::same_as<D, bool>);

// The mesh rank of a named shape given to Mesh's constructor. A shape whose length is known
// only at run time is refused here, before deduction lists every constructor that failed.
template <class Shape>
struct shape_rank {
  static_assert(sizeof(Shape) == 0,
                "kshard::Mesh: the mesh shape must be a std::array<int, N> or a braced list of N "
                "ints: N is the mesh rank, fixed at compile time (a std::vector's length is not)");
  static constexpr std::size_t value = 1;
};
template <std::size_t N>
struct shape_rank<std::array<int, N>> {
  static constexpr std::size_t value = N;
};

// A duplicate of a caller's communicator, shared by the meshes of every shape and rank built
// over it as their whole-mesh communicator, with the tag that names it on every rank.
struct SharedWhole {
  comm::Group group;
  std::uint64_t tag = 0;
};

// Values built over a caller's communicator and still alive in this process, by that
// communicator (compared as a handle, then checked congruent with the value's group: a freed
// handle may come back for another group).
template <class Value>
class LiveRegistry {
 public:
  // The first live value over `comm` that `wanted` accepts, else null.
  template <class Wanted>
  std::shared_ptr<Value> find(MPI_Comm comm, Wanted wanted) {
    const std::lock_guard lock(mutex_);
    std::erase_if(entries_, [](const Entry& e) { return e.value.expired(); });
    for (const Entry& e : entries_)
      if (auto value = e.value.lock();
          value && e.comm == comm && congruent(comm, value->group.native()) && wanted(*value))
        return value;
    return nullptr;
  }
  void add(MPI_Comm comm, const std::shared_ptr<Value>& value) {
    const std::lock_guard lock(mutex_);
    entries_.push_back({comm, value});
  }

 private:
  struct Entry {
    MPI_Comm comm;
    std::weak_ptr<Value> value;
  };
  std::mutex mutex_;
  std::vector<Entry> entries_;
};

// The shared whole-mesh communicators of this process (meshes of any rank).
inline LiveRegistry<SharedWhole>& shared_wholes() {
  static LiveRegistry<SharedWhole> wholes;
  return wholes;
}
}  // namespace detail

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
  /// communicator to tell the others through). A mesh built alike to one still alive (over
  /// the same communicator, with the same shape and names, on every rank of it) is that mesh:
  /// equal to it, with its communicators, so that ranks that built it twice, or picked the
  /// other of two such meshes, still meet in the same collectives. Meshes of other shapes over
  /// `comm` share one duplicate of it as their whole-mesh communicator, and a dimension (or
  /// sub-mesh) that holds every rank in mesh order is that communicator, so that ranks that
  /// pick matrices on different such meshes meet in an agreement that names the difference
  /// instead of waiting on communicators of their own. Cost: one all-reduce of four integers
  /// over `comm`; a new mesh also agrees on the shape and splits one communicator per
  /// dimension that holds some but not all ranks, and the first mesh over `comm` duplicates it.
  Mesh(MPI_Comm comm, const std::array<int, N>& shape, const std::array<std::string, N>& names) {
    const detail::Operation operation("Mesh");
    if (comm == MPI_COMM_NULL)
      throw error(
          "kshard::Mesh: the communicator is MPI_COMM_NULL on this rank (a rank outside the "
          "group of an MPI_Comm_split or MPI_Comm_create); build the mesh only on the ranks of "
          "the communicator");
    const Alive alive = alive_over(comm, shape, names);
    if (alive.alike) {
      state_ = alive.alike;
      return;
    }
    state_ = std::make_shared<State>();
    State& s = *state_;
    s.shape = shape;
    s.names = names;
    // The checks run on kshard's own communicator, whose MPI errors come back as codes that
    // check_mpi turns into kshard::error, instead of aborting through the caller's error
    // handler. The first mesh over `comm` duplicates it (collective whatever the arguments).
    if (alive.whole) {
      s.whole = alive.whole;
    } else {
      auto whole = detail::Communicator::duplicate(comm);
      detail::check_mpi(MPI_Comm_set_errhandler(whole.get(), MPI_ERRORS_RETURN),
                        "MPI_Comm_set_errhandler");
      whole.set_name("the whole mesh");
      s.whole = std::make_shared<detail::SharedWhole>(detail::SharedWhole{comm::Group(whole)});
    }
    s.group = s.whole->group;
    s.size = s.group.size();
    s.rank = s.group.rank();
    agree_on_shape(s.group, shape, names, s.size);
    s.coords = coords_of(s.rank);
    for (std::size_t m = 0; m < N; ++m)
      s.dim_groups[m] = split({m}, fmt::format("mesh dimension {} ('{}')", m, names[m]));
    s.tag = new_tag(s.group);
    if (!alive.whole) {
      s.whole->tag = s.tag;
      detail::shared_wholes().add(comm, s.whole);
    }
    registry().add(comm, state_);
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
  /// The mesh's communicator: a duplicate of the one given, shared by every mesh built over it.
  [[nodiscard]] MPI_Comm comm() const { return state_->group.native(); }
  /// The ranks that differ from this one only in coordinate `m`, ranked by that coordinate.
  [[nodiscard]] MPI_Comm dim_comm(std::size_t m) const { return state_->dim_groups[m].native(); }
  /// The whole mesh as kshard's communication layer sees it (kshard/comm/group.hpp).
  [[nodiscard]] const comm::Group& group() const { return state_->group; }
  /// Mesh dimension `m` as kshard's communication layer sees it (the ranks of `dim_comm(m)`).
  [[nodiscard]] const comm::Group& dim_group(std::size_t m) const { return state_->dim_groups[m]; }

  /// Index of the dimension called `name`; throws `kshard::error` when there is none.
  [[nodiscard]] std::size_t dim(std::string_view name) const {
    const detail::Operation operation("Mesh::dim");
    std::optional<std::string> problem;
    const std::size_t m = resolve(name, problem);
    if (problem) throw error(*problem);
    return m;
  }

  /// The mesh over dimensions `dims` of this one, given by name or index in the order the
  /// sub-mesh takes them (DeviceMesh's `mesh["tp"]` is `mesh.sub("tp")`, `mesh["dp", "tp"]`
  /// is `mesh.sub("dp", "tp")`): the ranks that share this rank's coordinates along every
  /// other dimension, with the extents, names and per-dimension communicators of the chosen
  /// dimensions. It is a mesh like any other (distribute, redistribute, lookups).
  /// Cost: one fixed-size agreement over this mesh (an all-reduce), so that a bad or
  /// rank-dependent choice is the same error everywhere; one dimension then shares this mesh's
  /// communicator for it, several split one new communicator (`MPI_Comm_split`, collective).
  /// Build sub-meshes once, outside loops. An unknown name, an index >= N, a dimension given
  /// twice and ranks that choose different dimensions throw the same `kshard::error` on every
  /// rank.
  template <class... Dims>
  requires(sizeof...(Dims) >= 1 && (detail::MeshDimension<Dims> && ...))
      [[nodiscard]] Mesh<sizeof...(Dims)> sub(const Dims&... dims) const {
    constexpr std::size_t K = sizeof...(Dims);
    const detail::Operation operation("Mesh::sub");
    std::optional<std::string> problem;
    const std::array<std::size_t, K> chosen{resolve(dims, problem)...};
    if (!problem) problem = repetition(chosen);
    agree_on_sub(chosen, std::move(problem));
    if constexpr (K == 1)
      return Mesh<1>(*this, chosen, dim_group(chosen[0]));
    else
      return Mesh<K>(*this, chosen,
                     split({chosen.begin(), chosen.end()},
                           fmt::format("sub-mesh ({})", fmt::join(names_of(chosen), ", "))));
  }

  /// Coordinates of `rank` (row-major).
  [[nodiscard]] std::array<int, N> coords_of(int rank) const {
    return mesh_coords(state_->shape, rank);
  }

  /// Rank at coordinates `c` (row-major).
  [[nodiscard]] int rank_of(const std::array<int, N>& c) const {
    int rank = 0;
    for (std::size_t m = 0; m < N; ++m) rank = rank * state_->shape[m] + c[m];
    return rank;
  }

  /// Two meshes are the same when they share their communicators: copies of one mesh, or
  /// meshes built alike while it was alive (see the constructor).
  friend bool operator==(const Mesh& a, const Mesh& b) { return a.state_ == b.state_; }

 private:
  template <std::size_t>
  friend class Mesh;

  // The sub-mesh of `parent` over its dimensions `dims`, whose ranks `whole` holds in
  // row-major order of their coordinates along `dims` (Mesh::sub).
  template <std::size_t P>
  Mesh(const Mesh<P>& parent, const std::array<std::size_t, N>& dims, comm::Group whole)
      : state_(std::make_shared<State>()) {
    State& s = *state_;
    for (std::size_t i = 0; i < N; ++i) {
      s.shape[i] = parent.extent(dims[i]);
      s.names[i] = parent.names()[dims[i]];
      s.coords[i] = parent.coords()[dims[i]];
      s.dim_groups[i] = parent.dim_group(dims[i]);
    }
    s.group = std::move(whole);
    s.size = s.group.size();
    s.rank = s.group.rank();
  }

  struct State {
    std::array<int, N> shape{};
    std::array<std::string, N> names{};
    int size = 0;
    int rank = 0;
    std::array<int, N> coords{};
    comm::Group group;
    std::array<comm::Group, N> dim_groups{};
    std::uint64_t tag = 0;  // the same on every rank of the mesh, unique to it; 0: a sub-mesh
    std::shared_ptr<detail::SharedWhole> whole;  // null for a sub-mesh
  };

  // What this rank holds alive over one communicator: a mesh built alike, and the whole-mesh
  // communicator that meshes of any shape over it share.
  struct Alive {
    std::shared_ptr<State> alike;
    std::shared_ptr<detail::SharedWhole> whole;
  };

  // The meshes of rank N built in this process and still alive.
  static detail::LiveRegistry<State>& registry() {
    static detail::LiveRegistry<State> meshes;
    return meshes;
  }

  // The live mesh built alike over `comm`, and the whole-mesh communicator a new mesh can
  // share, each kept only where every rank of `comm` has the same one (their tags agree: the
  // least tag and the least complement of a tag over `comm` give the least and the greatest),
  // so that every rank decides alike.
  static Alive alive_over(MPI_Comm comm, const std::array<int, N>& shape,
                          const std::array<std::string, N>& names) {
    Alive alive{
        registry().find(comm, [&](const State& s) { return s.shape == shape && s.names == names; }),
        detail::shared_wholes().find(comm, [](const detail::SharedWhole&) { return true; })};
    const std::uint64_t tag = alive.alike ? alive.alike->tag : 0;
    const std::uint64_t whole = alive.whole ? alive.whole->tag : 0;
    std::uint64_t least[4] = {tag, ~tag, whole, ~whole};
    detail::check_mpi(MPI_Allreduce(MPI_IN_PLACE, least, 4, MPI_UINT64_T, MPI_MIN, comm),
                      "MPI_Allreduce");
    if (tag == 0 || least[0] != tag || ~least[1] != tag) alive.alike = nullptr;
    if (whole == 0 || least[2] != whole || ~least[3] != whole) alive.whole = nullptr;
    return alive;
  }

  // Rank 0's random non-zero tag for a new mesh, on every rank of `group`.
  static std::uint64_t new_tag(const comm::Group& group) {
    std::uint64_t tag = 0;
    if (group.rank() == 0) {
      std::random_device random;
      while (tag == 0) tag = (std::uint64_t{random()} << 32) ^ random();
    }
    group.bcast(&tag, 1, 0);
    return tag;
  }

  static std::array<std::string, N> default_names() {
    std::array<std::string, N> names;
    for (std::size_t m = 0; m < N; ++m) names[m] = fmt::format("d{}", m);
    return names;
  }

  // Index of dimension `name`; N, and the reason in `problem` (unless it holds one), when the
  // mesh has none.
  std::size_t resolve(std::string_view name, std::optional<std::string>& problem) const {
    for (std::size_t m = 0; m < N; ++m)
      if (state_->names[m] == name) return m;
    if (!problem)
      problem = fmt::format("kshard::{}: mesh has no dimension named '{}' (it has {})",
                            detail::operation_name(), name, fmt::join(state_->names, ", "));
    return N;
  }

  // `index` itself; N, and the reason in `problem` (unless it holds one), when it is out of range.
  template <std::integral I>
  std::size_t resolve(I index, std::optional<std::string>& problem) const {
    if (std::cmp_greater_equal(index, 0) && std::cmp_less(index, N))
      return static_cast<std::size_t>(index);
    if (!problem)
      problem = fmt::format(
          "kshard::{}: mesh dimension index {} is out of range: the mesh has {} dimensions, 0 to "
          "{} "
          "({})",
          detail::operation_name(), index, N, N - 1, fmt::join(state_->names, ", "));
    return N;
  }

  // Why `dims` choose a dimension twice, if they do.
  template <std::size_t K>
  std::optional<std::string> repetition(const std::array<std::size_t, K>& dims) const {
    for (std::size_t i = 0; i < K; ++i)
      for (std::size_t j = 0; j < i; ++j)
        if (dims[i] == dims[j])
          return fmt::format("kshard::{}: mesh dimension {} ('{}') is chosen twice for a sub-mesh",
                             detail::operation_name(), dims[i], state_->names[dims[i]]);
    return std::nullopt;
  }

  // The names of dimensions `dims`, in that order.
  template <std::size_t K>
  std::vector<std::string> names_of(const std::array<std::size_t, K>& dims) const {
    std::vector<std::string> names;
    for (const std::size_t m : dims) names.push_back(state_->names[m]);
    return names;
  }

  // Ranks that chose other dimensions would split the mesh into groups that do not fit
  // together: the agreement turns that, and any rank's own problem, into one error everywhere.
  template <std::size_t K>
  void agree_on_sub(const std::array<std::size_t, K>& dims,
                    std::optional<std::string> problem) const {
    detail::Agreement agreement(group());
    agreement.same("the number of sub-mesh dimensions", static_cast<std::int64_t>(K));
    detail::Digest digest;
    for (const std::size_t m : dims) digest.add(static_cast<std::int64_t>(m));
    const std::int64_t mine = digest.value();
    agreement.same("the sub-mesh dimensions", mine, [&](std::int64_t v) {
      return v == mine ? fmt::format("({})", fmt::join(dims, ", ")) : std::string("others");
    });
    agreement.problem(std::move(problem)).settle();
  }

  // Whether `dims` hold every rank of the mesh, ranked as the mesh ranks them.
  [[nodiscard]] bool in_mesh_order(const std::vector<std::size_t>& dims) const {
    std::int64_t ranks = 1;
    std::size_t last = 0;
    bool ordered = true;
    for (const std::size_t m : dims) {
      if (state_->shape[m] == 1) continue;
      ordered = ordered && (ranks == 1 || m > last);
      last = m;
      ranks *= state_->shape[m];
    }
    return ordered && ranks == state_->size;
  }

  // Row-major index of this rank's coordinates along `dims`, in that order.
  [[nodiscard]] int position_along(const std::vector<std::size_t>& dims) const {
    int position = 0;
    for (const std::size_t m : dims) position = position * state_->shape[m] + state_->coords[m];
    return position;
  }

  // The ranks whose coordinates differ from this rank's only along `dims`, ranked row-major by
  // their coordinates along `dims`: the mesh's own communicator when that is every rank in mesh
  // order (each other dimension has extent 1 and `dims` keep the mesh's order of the others),
  // else a new communicator (collective over the mesh).
  comm::Group split(const std::vector<std::size_t>& dims, const std::string& name) const {
    if (in_mesh_order(dims)) return state_->group;
    std::vector<std::size_t> others;
    for (std::size_t m = 0; m < N; ++m)
      if (std::find(dims.begin(), dims.end(), m) == dims.end()) others.push_back(m);
    MPI_Comm sub = MPI_COMM_NULL;
    detail::check_mpi(MPI_Comm_split(comm(), position_along(others), position_along(dims), &sub),
                      "MPI_Comm_split");
    auto communicator = detail::Communicator::adopt(sub);
    communicator.set_name(name);
    return comm::Group(communicator);
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
        return fmt::format("kshard::{}: mesh dimension {} ('{}') has extent {}; it must be >= 1",
                           detail::operation_name(), m, names[m], shape[m]);
      overflow = overflow || __builtin_mul_overflow(product, std::int64_t{shape[m]}, &product);
      for (std::size_t j = 0; j < m; ++j)
        if (names[j] == names[m])
          return fmt::format("kshard::{}: mesh dimension name '{}' is used twice",
                             detail::operation_name(), names[m]);
    }
    if (overflow)
      return fmt::format("kshard::{}: mesh shape ({}) holds more than {} ranks",
                         detail::operation_name(), fmt::join(shape, ", "),
                         std::numeric_limits<std::int64_t>::max());
    if (product != size)
      return fmt::format("kshard::{}: mesh shape ({}) holds {} ranks but the communicator has {}",
                         detail::operation_name(), fmt::join(shape, ", "), product, size);
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
/// Deduces `N` from a `std::array<int, N>` shape, with or without names; any other shape type
/// (a `std::vector`) fails with a message naming the accepted ones.
template <class Shape, class... Names>
Mesh(MPI_Comm, const Shape&, const Names&...) -> Mesh<detail::shape_rank<Shape>::value>;

}  // namespace kshard
