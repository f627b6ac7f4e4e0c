#pragma once

// Generated cases of arguments that differ between ranks, shared by the tables of entry points
// (tests/mpi/entry_points_test.cpp, tests/io/entry_points_mpi_test.cpp): each table lists a
// library's public collective entry points, each row the arguments a rank-dependent `if` can
// change; matrix arguments are changed by one generator (layout type, split factor, mesh shape,
// mesh dimension order, rows, columns, element type). `run` asserts what the row's kind
// promises (expect_collective_refusal: the same error on every rank, inputs and outputs
// unchanged, the next collective working), and `expect_rows_for_every_operation` compares a
// table with the operations the headers name (`detail::Operation`), so that a new entry point
// without a row fails its test.

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <regex>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kshard/distribute.hpp"
#include "kshard/mesh.hpp"
#include "kshard/placement.hpp"
#include "kshard_test.hpp"

namespace kshard::test {

using Mesh2 = kshard::Mesh<2>;

// One change of one argument: `call(here)` runs the entry point with the argument changed where
// `here` is true; the error must name one of `phrases`.
struct Case {
  std::string argument;
  std::vector<std::string> phrases;
  std::function<void(bool)> call;
  std::vector<Watched> watched;
  bool within_tp_group;  // only the ranks of one tp group must share it (other groups may differ)
};

// How an entry point treats arguments that differ between ranks: agreed (a collective
// refusal), checked on the calling rank only (a local operation), or a documented precondition
// that is not agreed (only the same bad value on every rank is refused, alike).
enum class Kind { agreed, local, precondition };

struct EntryPoint {
  std::string name;  // as its detail::Operation names it
  Kind kind;
  std::function<std::vector<Case>()> cases;
};

// The meshes a rank-dependent `if` can pick between, over the same ranks: the usual (dp, tp)
// mesh, one of another shape, and one with its dimensions in the other order.
struct Meshes {
  Mesh2 usual = kshard::test::dp_tp_mesh();
  Mesh2 other_shape{
      MPI_COMM_WORLD,
      usual.extent(1) == 1 ? std::array{1, world_size()} : std::array{world_size(), 1},
      {"dp", "tp"}};
  Mesh2 other_order{MPI_COMM_WORLD, {usual.extent(1), usual.extent(0)}, {"tp", "dp"}};
};

inline const Meshes& meshes() {
  static const Meshes all;  // built on every rank at the first use, inside a test
  return all;
}

template <class T>
using Type = std::type_identity<T>;

// A matrix argument: its usual layout, another layout type the entry point accepts, a layout
// with a StridedShard whose factor `strided(f)` sets, and its shape.
template <class L, class Other, class Strided>
struct MatrixArgument {
  std::string role;  // as the messages name it ("the table")
  L layout;
  Other other_layout;
  Strided strided;
  index_t rows = 11;
  index_t cols = 6;
};
// Clang before 17 deduces no aggregate's template arguments from a braced list.
template <class L, class Other, class Strided>
MatrixArgument(std::string, L, Other, Strided) -> MatrixArgument<L, Other, Strided>;

// Builds a matrix of the reference values on `mesh` (distribute, or the constructor).
struct Distribute {
  template <class T, class L>
  auto operator()(Type<T>, const Mesh2& mesh, const L& layout, index_t rows, index_t cols) const {
    const auto full = kshard::test::reference_matrix<T>(rows, cols, 3);
    return kshard::distribute<ExecSpace, MemSpace>(mesh, layout, kshard::HostMatrix<const T>(full));
  }
};
struct Construct {
  template <class T, class L>
  auto operator()(Type<T>, const Mesh2& mesh, const L& layout, index_t rows, index_t cols) const {
    return kshard::test::Matrix<T, L>(mesh, layout, rows, cols);
  }
};

// Every way a rank-dependent `if` changes a matrix of `T` (U: the other element type):
// `visit(what, phrase, make_usual, make_other)` with two builders of the matrices.
template <class T, class U, class A, class Make, class Visit>
void for_each_matrix_change(const A& arg, const Make& make, Visit&& visit) {
  const Meshes& m = meshes();
  const auto build = [&](auto type, const Mesh2& mesh, auto layout, index_t rows, index_t cols) {
    return [=] { return make(type, mesh, layout, rows, cols); };
  };
  const auto usual = build(Type<T>{}, m.usual, arg.layout, arg.rows, arg.cols);
  const auto of = [&](std::string_view what) { return fmt::format("{} of {}", what, arg.role); };
  visit("layout type", of("the placement"), usual,
        build(Type<T>{}, m.usual, arg.other_layout, arg.rows, arg.cols));
  visit("split factor", of("the split factor"),
        build(Type<T>{}, m.usual, arg.strided(1), arg.rows, arg.cols),
        build(Type<T>{}, m.usual, arg.strided(2), arg.rows, arg.cols));
  visit("mesh shape", of("the mesh"), usual,
        build(Type<T>{}, m.other_shape, arg.layout, arg.rows, arg.cols));
  visit("mesh dimension order", of("the mesh"), usual,
        build(Type<T>{}, m.other_order, arg.layout, arg.rows, arg.cols));
  visit("rows", of("the number of rows"), usual,
        build(Type<T>{}, m.usual, arg.layout, arg.rows + 1, arg.cols));
  visit("columns", of("the number of columns"), usual,
        build(Type<T>{}, m.usual, arg.layout, arg.rows, arg.cols + 1));
  visit("element type", of("the element type"), usual,
        build(Type<U>{}, m.usual, arg.layout, arg.rows, arg.cols));
}

// A case for a plain value: `call(here)` changes it itself.
inline Case value_case(std::string argument, std::string phrase, std::function<void(bool)> call,
                       std::vector<Watched> watched = {}) {
  return {std::move(argument), {std::move(phrase)}, std::move(call), std::move(watched), false};
}

// A case for a value the ranks of one tp group must share.
inline Case tp_group_case(std::string argument, std::string phrase, std::function<void(bool)> call,
                          std::vector<Watched> watched) {
  Case c = value_case(std::move(argument), std::move(phrase), std::move(call), std::move(watched));
  c.within_tp_group = true;
  return c;
}

template <class M>
Watched watch_copy(const M& matrix) {
  return [matrix] { return kshard::test::checksum(matrix); };
}

// The cases of an entry point taking matrix `arg`: both matrices are built on every rank first,
// then `call(matrix)` gets the other one where `here`. `also`: other phrases that name the
// change as well (a rank's own finding about it, which goes first).
template <class T, class U, class A, class Call>
std::vector<Case> matrix_cases(const A& arg, Call call, std::vector<std::string> also = {}) {
  std::vector<Case> cases;
  for_each_matrix_change<T, U>(arg, Distribute{},
                               [&](std::string what, std::string phrase, auto usual, auto other) {
                                 auto phrases = also;
                                 phrases.push_back(std::move(phrase));
                                 const auto a = usual();
                                 const auto b = other();
                                 cases.push_back({fmt::format("{}: {}", arg.role, what),
                                                  phrases,
                                                  [call, a, b](bool here) {
                                                    if (here)
                                                      call(b);
                                                    else
                                                      call(a);
                                                  },
                                                  {watch_copy(a), watch_copy(b)},
                                                  false});
                               });
  return cases;
}

// The cases of an entry point that builds the matrix (`make` is the entry point).
template <class T, class U, class A, class Make>
std::vector<Case> building_cases(const A& arg, const Make& make) {
  std::vector<Case> cases;
  for_each_matrix_change<T, U>(
      arg, make, [&](std::string what, std::string phrase, auto usual, auto other) {
        cases.push_back(
            value_case(fmt::format("{}: {}", arg.role, what), std::move(phrase), [=](bool here) {
              if (here)
                (void)other();
              else
                (void)usual();
            }));
      });
  return cases;
}

template <class... Cases>
std::vector<Case> joined(Cases... parts) {
  std::vector<Case> all;
  (all.insert(all.end(), std::make_move_iterator(parts.begin()),
              std::make_move_iterator(parts.end())),
   ...);
  return all;
}

// The usual matrix argument of an entry point that takes any layout.
inline auto plain_matrix(std::string role = "the matrix") {
  return MatrixArgument{std::move(role), Layout(Replicate{}, Shard<0>{}),
                        Layout(Shard<1>{}, Replicate{}),
                        [](index_t f) { return Layout(Replicate{}, StridedShard<0>{f}); }};
}

// Runs every case of `entry`, as its kind says it must behave.
inline void run(const EntryPoint& entry) {
  const bool single_rank_groups = meshes().usual.extent(1) == 1;  // {2, 1} at 2 ranks
  for (const Case& c : entry.cases()) {
    if (c.within_tp_group && single_rank_groups) continue;
    const std::string name = fmt::format("{}, {}", entry.name, c.argument);
    switch (entry.kind) {
      case Kind::agreed:
        kshard::test::expect_collective_refusal(name, c.phrases, c.call, c.watched, true);
        break;
      case Kind::local:
        kshard::test::expect_local_refusal(name, c.phrases.front(), c.call);
        break;
      case Kind::precondition: {
        SCOPED_TRACE(name);
        const std::string message = kshard::test::collective_error([&] { c.call(true); });
        EXPECT_NE(message.find(c.phrases.front()), std::string::npos) << message;
        break;
      }
    }
  }
}

// The operations the headers under `folder` name (skipping `skipped`, a folder inside it):
// `detail::Operation operation("name")`, and where it names a variable (`who`), the text that
// variable was given last before it.
inline std::set<std::string> operations_in_headers(const std::filesystem::path& folder,
                                                   std::string_view skipped = {}) {
  const std::regex literal(R"re(Operation operation\("([^"]+)"\))re");
  const std::regex named(R"re(Operation operation\((\w+)\))re");
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(folder)) {
    const std::string path = entry.path().generic_string();
    if (entry.path().extension() != ".hpp" ||
        (!skipped.empty() && path.find(skipped) != std::string::npos))
      continue;
    std::ifstream in(entry.path());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (auto it = std::sregex_iterator(text.begin(), text.end(), literal);
         it != std::sregex_iterator(); ++it)
      names.insert((*it)[1]);
    for (auto it = std::sregex_iterator(text.begin(), text.end(), named);
         it != std::sregex_iterator(); ++it) {
      const std::string before = text.substr(0, static_cast<std::size_t>(it->position()));
      const std::regex given("\\b" + (*it)[1].str() + " = \"([^\"]+)\"");
      std::string last = "(" + (*it)[1].str() + ", never given a name)";
      for (auto g = std::sregex_iterator(before.begin(), before.end(), given);
           g != std::sregex_iterator(); ++g)
        last = (*g)[1];
      names.insert(last);
    }
  }
  return names;
}

// Every operation the headers under `folder` name has a row in `table`, and every row names one.
inline void expect_rows_for_every_operation(const std::vector<EntryPoint>& table,
                                            const std::filesystem::path& folder,
                                            std::string_view skipped = {}) {
  std::set<std::string> rows;
  for (const EntryPoint& entry : table) rows.insert(entry.name);
  const std::set<std::string> headers = operations_in_headers(folder, skipped);
  std::vector<std::string> missing;
  std::vector<std::string> extra;
  std::set_difference(headers.begin(), headers.end(), rows.begin(), rows.end(),
                      std::back_inserter(missing));
  std::set_difference(rows.begin(), rows.end(), headers.begin(), headers.end(),
                      std::back_inserter(extra));
  EXPECT_TRUE(missing.empty()) << "entry points without a row: "
                               << fmt::format("{}", fmt::join(missing, ", "));
  EXPECT_TRUE(extra.empty()) << "rows no header names: "
                             << fmt::format("{}", fmt::join(extra, ", "));
}

}  // namespace kshard::test
