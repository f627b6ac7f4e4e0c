#pragma once

/// \file
/// Agreement for programs built on kshard, in the library's collective error discipline: the
/// same `kshard::error` on every rank, before anything goes on. `throw_if_any` spreads the
/// problem one rank found (rank 0 looked at a file); `agree_on_arguments` checks that every
/// rank was given the same command line. Both are one fixed-size agreement
/// (comm/agreement.hpp), whatever their arguments, so ranks that differ still meet in it.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kshard/comm/agreement.hpp"
#include "kshard/comm/group.hpp"
#include "kshard/detail/operation.hpp"

namespace kshard::comm {

/// An argument a program was given: its name as the user writes it ("--out") and its text.
struct NamedText {
  std::string name;  ///< names the argument in the message
  std::string text;  ///< compared between ranks
};

/// Collective over `group`: every rank learns whether any rank found a problem. Throws the
/// same `kshard::error` on every rank, the `problem` of the lowest rank that has one, or
/// returns on every rank when none has. Cost: one all-reduce of 61 int64 values, and two
/// broadcasts of the message when there is one.
inline void throw_if_any(const Group& group, std::optional<std::string> problem) {
  detail::agree(group, std::move(problem));
}

/// Collective over `group`: every rank was given the same `arguments` (their texts, in order;
/// the names are the program's and only name them). Throws the same `kshard::error` on every
/// rank otherwise, naming the first argument that differs ("kshard::comm::agree_on_arguments:
/// --out differs between ranks: 'a' on rank 0, another on another; ...") or saying that some
/// ranks were given more of them. Call it before any collective the arguments decide: ranks
/// that go on with different ones would wait for each other forever. Cost: one all-reduce of
/// 61 int64 values whatever the number of arguments (past 27 they are compared as one digest,
/// named together), and two broadcasts of the message when they differ.
inline void agree_on_arguments(const Group& group, const std::vector<NamedText>& arguments) {
  const detail::Operation operation("comm::agree_on_arguments");
  detail::Agreement agreement(group);
  for (const NamedText& argument : arguments)
    detail::same_text(agreement, argument.name, argument.text);
  agreement.settle();
}

}  // namespace kshard::comm
