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
#include "kshard/comm/reduce_op.hpp"
#include "kshard/comm/stats.hpp"
#include "kshard/detail/digest.hpp"
#include "kshard/detail/element.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/error.hpp"
#include "kshard/float16.hpp"

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

}  // namespace kshard::detail
