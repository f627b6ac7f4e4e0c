#pragma once

// Agreement on arguments across the ranks of a communicator: the values every rank must pass
// alike and the problems each rank finds on its own, settled together by ONE all-reduce of a
// fixed size. The size never depends on the arguments, so ranks that reach an agreement through
// different template instantiations or code paths (a rank-dependent `if`) still meet in the
// same collective and learn that they differ, instead of truncating, hanging or going on with
// wrong data.

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kshard/bfloat16.hpp"
#include "kshard/comm/group.hpp"
#include "kshard/comm/stats.hpp"
#include "kshard/detail/digest.hpp"
#include "kshard/detail/element.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/error.hpp"
#include "kshard/float16.hpp"
#include "kshard/layout_dispatch.hpp"
#include "kshard/placement.hpp"

namespace kshard::detail {

// Renders an agreed value for an error message ("Shard(0)", "float", "12").
using Render = std::function<std::string(std::int64_t)>;

inline std::string render_number(std::int64_t value) { return fmt::format("{}", value); }

class Agreement {
 public:
  // Values compared per agreement; more are folded into one digest (still compared, named
  // together in the message). The last two slots hold that digest and the value count.
  static constexpr std::size_t capacity = 30;

  // `between` names the ranks in messages ("ranks", "the ranks of a tp group").
  explicit Agreement(const comm::Group& group, std::string_view between = "ranks")
      : group_(group), between_(between) {}

  // `value` must be the same on every rank; `what` names it in the error ("the number of rows"),
  // `render` shows a value there (an empty text: the message shows no values).
  Agreement& same(std::string what, std::int64_t value, Render render = render_number) {
    if (values_.size() + 3 < capacity)  // slots 1 .. capacity - 3
      values_.push_back({std::move(what), value, std::move(render), within_});
    else
      overflow_.add(value);
    ++count_;
    return *this;
  }

  // The values given from now on need only be the same within a smaller group of ranks than
  // this agreement's, which here is that whole group (a tp group of one dp coordinate on a
  // `{1, S}` mesh): their messages name it.
  Agreement& within(std::string_view between) {
    within_ = between;
    return *this;
  }

  // A problem this rank found by itself; the first one given is kept.
  Agreement& problem(std::optional<std::string> problem) {
    if (!problem_) problem_ = std::move(problem);
    return *this;
  }

  [[nodiscard]] bool has_problem() const { return problem_.has_value(); }

  // One all-reduce: every rank returns the same outcome, the problem of the lowest rank that
  // found one, else the message of the first difference between ranks, else nothing.
  [[nodiscard]] std::optional<std::string> outcome() const {
    AgreementScope scope;
    const int size = group_.size();
    const int rank = group_.rank();
    std::array<std::int64_t, 2 * capacity + 1> both = slots();
    // MAX of v and of ~v gives max and ~min at once (~ cannot overflow, unlike negation); the
    // last entry is the lowest rank with a problem, as size - rank (0: none).
    for (std::size_t i = 0; i < capacity; ++i) both[capacity + i] = ~both[i];
    both[2 * capacity] = problem_ ? size - rank : 0;
    group_.allreduce(both.data(), static_cast<std::int64_t>(both.size()), ReduceOp::max);
    // A problem a rank found names the argument most precisely (a target on another
    // communicator also has another shape), so it goes first; then the first difference, which
    // every rank sees: rank 0's wording is everyone's.
    int first = size - static_cast<int>(both[2 * capacity]);
    std::optional<std::string> message = rank == first ? problem_ : std::nullopt;
    for (std::size_t i = 0; i < capacity && first == size; ++i)
      if (both[i] != ~both[capacity + i]) {
        message = difference(i, both[i], ~both[capacity + i]);
        first = 0;
      }
    if (first == size) return std::nullopt;
    return from_rank(first, message.value_or(std::string()));
  }

  // Throws the outcome, the same `kshard::error` on every rank.
  void settle() const {
    if (auto message = outcome()) throw error(*message);
  }

 private:
  struct Item {
    std::string what;
    std::int64_t value;
    Render render;
    std::string_view between;  // empty: the agreement's own
  };

  // Agreements are metadata: counted in comm_stats().agreements, not as data collectives.
  class AgreementScope {
   public:
    AgreementScope() : saved_(comm_stats()) {}
    ~AgreementScope() {
      const std::int64_t agreements = comm_stats().agreements;
      comm_stats() = saved_;
      comm_stats().agreements = agreements + 1;
    }
    AgreementScope(const AgreementScope&) = delete;
    AgreementScope& operator=(const AgreementScope&) = delete;

   private:
    CommStats saved_;
  };

  // Slot 0: the operation; then the values; the last two: the overflow digest and the count.
  [[nodiscard]] std::array<std::int64_t, 2 * capacity + 1> slots() const {
    std::array<std::int64_t, 2 * capacity + 1> s{};
    s[0] = Digest().add(operation_name()).value();
    for (std::size_t i = 0; i < values_.size(); ++i) s[i + 1] = values_[i].value;
    s[capacity - 2] = overflow_.value();
    s[capacity - 1] = count_;
    return s;
  }

  [[nodiscard]] std::string difference(std::size_t slot, std::int64_t max, std::int64_t min) const {
    const std::string who = fmt::format("kshard::{}", operation_name());
    const int rank = world_rank();  // the rank users know
    if (slot == 0)
      return fmt::format(
          "{}: the {} are in different kshard operations ({} on rank {}); every rank must call "
          "the same collective operations in the same order",
          who, between_, operation_name(), rank);
    if (slot >= capacity - 2 || slot > values_.size())
      return fmt::format(
          "{}: the {} passed different arguments (other types, or more of them, on some); every "
          "rank must pass the same",
          who, between_);
    const Item& item = values_[slot - 1];
    const std::string_view between = item.between.empty() ? between_ : item.between;
    const std::string mine = item.render(item.value);
    if (mine.empty())
      return fmt::format("{}: {} differs between {}; every rank must pass the same", who, item.what,
                         between);
    const std::int64_t other = item.value == max ? min : max;
    return fmt::format(
        "{}: {} differs between {}: {} on rank {}, {} on another; every rank must "
        "pass the same",
        who, item.what, between, mine, rank, item.render(other));
  }

  // Everyone gets the message of rank `first`.
  [[nodiscard]] std::string from_rank(int first, std::string message) const {
    int length = static_cast<int>(message.size());
    group_.bcast(&length, 1, first);
    message.resize(static_cast<std::size_t>(length));
    group_.bcast(message.data(), length, first);
    return message;
  }

  comm::Group group_;
  std::string_view between_;
  std::string_view within_;
  std::vector<Item> values_;
  Digest overflow_;
  std::int64_t count_ = 0;
  std::optional<std::string> problem_;
};

// Every rank learns whether any rank found a problem; all throw the message of the lowest
// failing rank. Call it before mutating anything.
inline void agree(const comm::Group& group, std::optional<std::string> local_problem) {
  Agreement(group).problem(std::move(local_problem)).settle();
}

// Throws a problem found where no other rank needs to learn of it (a local operation, or a
// check every rank makes alike from agreed values).
inline void throw_if(const std::optional<std::string>& problem) {
  if (problem) throw error(*problem);
}

// ----- How arguments are described for agreement -------------------------------------------

// `text` must be the same on every rank; compared as a digest, quoted in the message.
inline void same_text(Agreement& agreement, std::string what, const std::string& text) {
  const std::int64_t mine = Digest().add(text).value();
  agreement.same(std::move(what), mine, [mine, text](std::int64_t v) {
    return v == mine ? fmt::format("'{}'", text) : std::string("another");
  });
}

// A code per element type, so that float and int32 (both 4 bytes) differ: the table's, else
// 1000 + the size of a type outside it.
template <class T>
constexpr std::int64_t type_code() {
  if constexpr (TableElement<T>)
    return static_cast<std::int64_t>(element_info<T>().code);
  else
    return 1000 + static_cast<std::int64_t>(sizeof(T));
}

inline std::string render_type(std::int64_t code) {
  if (const ElementInfo* info = find_element(code)) return std::string(info->name);
  return fmt::format("a {}-byte element type", code - 1000);
}

// One placement as a number: kind, tensor dimension, and the reduction of a Partial or the
// name of a custom placement (the split factor is agreed on as a value of its own).
inline std::int64_t placement_code(const MeshDimAction& action, ReduceOp op) {
  std::int64_t extra = 0;
  if (action.kind == PlacementKind::partial) extra = static_cast<int>(op);
  if (action.kind == PlacementKind::custom) extra = fnv1a32(action.name);
  return static_cast<std::int64_t>(action.kind) + 8 * (action.tensor_dim + 1) + 8192 * extra;
}

inline std::string render_placement(std::int64_t code) {
  const auto kind = static_cast<PlacementKind>(code % 8);
  const std::int64_t dim = (code % 8192) / 8 - 1;
  const std::string text = placement_text(
      kind, static_cast<int>(dim), std::nullopt,
      kind == PlacementKind::partial ? static_cast<ReduceOp>(code / 8192) : ReduceOp::sum);
  if (kind != PlacementKind::custom) return text;
  return fmt::format("{} (name code {:#x})", text, code / 8192);
}

// The placements of layout `L` (kind, dimension, reduction and split factor per mesh dimension).
template <class L>
void same_layout(Agreement& agreement, const L& layout, std::string_view role) {
  const auto actions = layout.actions();
  for (std::size_t m = 0; m < L::rank; ++m) {
    agreement.same(fmt::format("the placement of {} on mesh dimension {}", role, m),
                   placement_code(actions[m], L::partial_op(m)), render_placement);
    agreement.same(fmt::format("the split factor of {} on mesh dimension {}", role, m),
                   actions[m].split_factor);
  }
}

// Everything about a matrix of `T` that its ranks must share: element type, global shape,
// layout.
template <class T, class L>
void same_shape_and_layout(Agreement& agreement, index_t rows, index_t cols, const L& layout,
                           std::string_view role) {
  agreement.same(fmt::format("the element type of {}", role), type_code<T>(), render_type);
  agreement.same(fmt::format("the number of rows of {}", role), rows);
  agreement.same(fmt::format("the number of columns of {}", role), cols);
  same_layout(agreement, layout, role);
}

// A mesh as kshard writes it everywhere (its {fmt} formatter too): its names and extents in
// dimension order, "Mesh(dp=2, tp=2)".
template <class Mesh>
std::string mesh_text(const Mesh& mesh) {
  std::string text = "Mesh(";
  for (std::size_t m = 0; m < mesh.shape().size(); ++m)
    text += fmt::format("{}{}={}", m > 0 ? ", " : "", mesh.names()[m], mesh.shape()[m]);
  return text + ")";
}

// A mesh by its shape and names in dimension order: meshes of other shapes over one
// communicator share its duplicate, and the same layout on a `{4, 1}` and a `{2, 2}` mesh gives
// the ranks other coordinates, so other rows.
template <class Mesh>
void same_mesh(Agreement& agreement, std::string what, const Mesh& mesh) {
  same_text(agreement, std::move(what), mesh_text(mesh));
}

// Everything about a matrix that its ranks must share: element type, global shape, layout, mesh.
template <class M>
void same_matrix(Agreement& agreement, const M& matrix, std::string_view role) {
  same_shape_and_layout<typename M::value_type>(agreement, matrix.rows(), matrix.cols(),
                                                matrix.layout(), role);
  same_mesh(agreement, fmt::format("the mesh of {}", role), matrix.mesh());
}

// The agreement of a call that communicates within the groups along mesh dimension `split` of
// `mesh` (the tp groups). What decides the group (`mesh_wide` adds it: the mesh and `tp_dim`, or
// a matrix whose layout names `split`) is agreed over the whole mesh first, with every
// rank's own `problem`: a rank that chose another group would otherwise wait in one the others
// never join. Then the values only the ranks of one group must share (`in_group` adds them;
// other groups may differ): in that same agreement where the group is the whole mesh, else
// within the group, whose outcome one more agreement over the mesh gives every rank, so every
// rank throws the same error. Agreements: 1, or 3 where the groups are proper subgroups of more
// than one rank.
template <class Mesh, class MeshWide, class InGroup>
void agree_in_groups(const Mesh& mesh, std::size_t split, const std::optional<std::string>& problem,
                     MeshWide&& mesh_wide, InGroup&& in_group) {
  const int group_size = split < mesh.shape().size() ? mesh.extent(split) : 1;
  const bool whole = group_size == mesh.size();
  Agreement agreement(mesh.group());
  mesh_wide(agreement);
  agreement.problem(problem);
  // Ranks that disagree on `whole` disagree on what `mesh_wide` adds (which decides `split`):
  // those slots come first and name the difference.
  if (whole) in_group(agreement.within("the ranks of a tp group"));
  agreement.settle();
  if (whole || group_size == 1) return;
  Agreement group(mesh.dim_group(split), "the ranks of a tp group");
  in_group(group);
  agree(mesh.group(), group.outcome());
}

}  // namespace kshard::detail
