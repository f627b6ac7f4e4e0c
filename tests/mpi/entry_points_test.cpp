// Generated, not listed: one table of kshard's public collective entry points (outside
// kshard::io, whose table is tests/io/entry_points_mpi_test.cpp), and for each the arguments a
// rank-dependent `if` can change, changed on the last rank only (the MPI suite runs at 1-4, 6
// and 8 ranks; tests/support/entry_points.hpp generates and runs the cases). Every rank must
// throw the same kshard::error naming the argument, every input and output must be unchanged
// and the next collective must run. EntryPoints.TableCoversTheHeaders checks the table against
// the operations the headers name: a new entry point without a row fails.

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "entry_points.hpp"
#include "kshard/comm/program_agreement.hpp"
#include "kshard/kshard.hpp"
#include "kshard_test.hpp"

namespace {

using kshard::index_t;
using kshard::Layout;
using kshard::Replicate;
using kshard::Shard;
using kshard::StridedShard;
using namespace kshard::test;  // the generator's vocabulary (entry_points.hpp)

using Ids = Kokkos::View<std::int64_t*, MemSpace>;
Ids ids_of(std::vector<std::int64_t> values) {
  Kokkos::View<std::int64_t*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> host(values.data(),
                                                                               values.size());
  Ids ids("ids", values.size());
  Kokkos::deep_copy(ids, host);
  return ids;
}

template <class M>
using ViewOf = Kokkos::View<typename M::value_type**, Kokkos::LayoutRight, MemSpace>;

// The one mesh dimension that splits the matrix `M` (its tp dimension).
template <class M>
constexpr std::size_t tp_dim_of() {
  return kshard::detail::splitting_dim<typename M::layout_type>();
}

// ----- The arguments of the rows ------------------------------------------------------------

// Split by rows over one mesh dimension (a table, a column-parallel weight): the other layout
// type splits it over the other dimension.
auto rows_split(std::string role) {
  return MatrixArgument{std::move(role), Layout(Replicate{}, Shard<0>{}),
                        Layout(Shard<0>{}, Replicate{}),
                        [](index_t f) { return Layout(Replicate{}, StridedShard<0>{f}); }};
}

// Split by columns (a matrix whose row norms sum over ranks): the other layout type splits
// rows, which sum nothing.
auto columns_split(std::string role) {
  return MatrixArgument{std::move(role), Layout(Replicate{}, Shard<1>{}),
                        Layout(Shard<0>{}, Replicate{}),
                        [](index_t f) { return Layout(Replicate{}, StridedShard<1>{f}); }};
}

// A row-parallel weight: its columns split over the tp dimension, or over the other one.
auto row_parallel_weight() {
  return MatrixArgument{std::string("the weight"), Layout(Replicate{}, Shard<1>{}),
                        Layout(Shard<1>{}, Replicate{}),
                        [](index_t f) { return Layout(Replicate{}, StridedShard<1>{f}); }};
}

// ----- The rows -----------------------------------------------------------------------------

std::vector<Case> mesh_cases() {
  const int size = world_size();
  return {
      value_case("shape", "differs between ranks",
                 [=](bool here) {
                   Mesh2 mesh(MPI_COMM_WORLD, here ? std::array{size, 1} : std::array{1, size});
                 }),
      value_case(
          "names", "the mesh dimension names differs",
          [](bool here) {
            Mesh2 mesh(MPI_COMM_WORLD, {1, world_size()}, {here ? "tp" : "dp", here ? "dp" : "tp"});
          }),
      value_case("rank", "the mesh rank (number of dimensions) differs", [=](bool here) {
        if (here)
          kshard::Mesh<1> mesh(MPI_COMM_WORLD, {size});
        else
          Mesh2 mesh(MPI_COMM_WORLD, {1, size});
      })};
}

std::vector<Case> sub_mesh_cases() {
  return {value_case("dimension", "differs between ranks",
                     [](bool here) { (void)meshes().usual.sub(here ? "dp" : "tp"); }),
          value_case("number of dimensions", "the number of sub-mesh dimensions differs",
                     [](bool here) {
                       if (here)
                         (void)meshes().usual.sub("dp", "tp");
                       else
                         (void)meshes().usual.sub("tp");
                     })};
}

std::vector<Case> distribute_cases() {
  const auto root = [](bool here) {
    const auto full = kshard::test::reference_matrix<float>(5, 3, 1);
    (void)kshard::distribute<ExecSpace, MemSpace>(meshes().usual, Layout(Replicate{}, Shard<0>{}),
                                                  kshard::HostMatrix<const float>(full),
                                                  kshard::Root{here ? world_size() - 1 : 0});
  };
  return joined(building_cases<float, double>(plain_matrix(), Distribute{}),
                std::vector{value_case("root", "the root rank differs", root)});
}

std::vector<Case> gather_cases() {
  const auto m = Distribute{}(Type<float>{}, meshes().usual, Layout(Replicate{}, Shard<0>{}), 5, 3);
  return joined(
      matrix_cases<float, double>(plain_matrix(), [](const auto& x) { (void)kshard::gather(x); }),
      std::vector{value_case(
          "root", "the root rank differs",
          [m](bool here) { (void)kshard::gather(m, kshard::Root{here ? world_size() - 1 : 0}); },
          {watch_copy(m)})});
}

// The target arguments of a redistribution (`move(matrix, mesh, layout)`).
template <class Move>
std::vector<Case> target_cases(Move move) {
  const Meshes& ms = meshes();
  const auto m = Distribute{}(Type<float>{}, ms.usual, Layout(Replicate{}, Shard<0>{}), 7, 3);
  return {value_case("target layout type", "the placement of the target",
                     [=](bool here) {
                       if (here)
                         move(m, ms.usual, Layout(Shard<0>{}, Replicate{}));
                       else
                         move(m, ms.usual, Layout(Replicate{}, Replicate{}));
                     },
                     {watch_copy(m)}),
          value_case("target split factor", "the split factor of the target",
                     [=](bool here) {
                       move(m, ms.usual, Layout(StridedShard<0>{here ? 2 : 1}, Replicate{}));
                     },
                     {watch_copy(m)}),
          value_case("target mesh shape", "the target mesh",
                     [=](bool here) {
                       move(m, here ? ms.other_shape : ms.usual, Layout(Replicate{}, Shard<0>{}));
                     },
                     {watch_copy(m)}),
          value_case("target mesh dimension order", "the target mesh",
                     [=](bool here) {
                       move(m, here ? ms.other_order : ms.usual, Layout(Replicate{}, Shard<0>{}));
                     },
                     {watch_copy(m)})};
}

std::vector<Case> redistribute_cases() {
  return joined(
      matrix_cases<float, double>(
          plain_matrix(),
          [](const auto& x) { (void)kshard::redistribute(x, Layout(Replicate{}, Replicate{})); }),
      target_cases([](const auto& x, const Mesh2& mesh, const auto& layout) {
        (void)kshard::redistribute(x, mesh, layout);
      }));
}

std::vector<Case> plan_cases() {
  return joined(matrix_cases<float, double>(plain_matrix(),
                                            [](const auto& x) {
                                              (void)kshard::plan_redistribute(
                                                  x, Layout(Replicate{}, Replicate{}));
                                            }),
                target_cases([](const auto& x, const Mesh2& mesh, const auto& layout) {
                  (void)kshard::plan_redistribute(x, mesh, layout);
                }));
}

// redistribute_into: the source changed (into a target of its element type), then the target.
std::vector<Case> redistribute_into_cases() {
  const Mesh2& mesh = meshes().usual;
  using Target = Layout<Replicate, Replicate>;
  const kshard::test::Matrix<float, Target> floats(mesh, {}, 11, 6);
  const kshard::test::Matrix<double, Target> doubles(mesh, {}, 11, 6);
  auto into = [floats, doubles](const auto& x) {
    if constexpr (std::is_same_v<typename std::remove_cvref_t<decltype(x)>::value_type, float>)
      kshard::redistribute_into(x, floats);
    else
      kshard::redistribute_into(x, doubles);
  };
  auto cases = matrix_cases<float, double>(plain_matrix(), into, {"the target is"});
  const auto source = Distribute{}(Type<float>{}, mesh, Layout(Replicate{}, Shard<0>{}), 11, 6);
  auto targets = matrix_cases<float, float>(
      plain_matrix("the target"),
      [source](const auto& t) {
        if constexpr (std::is_same_v<typename std::remove_cvref_t<decltype(t)>::value_type, float>)
          kshard::redistribute_into(source, t);
      },
      {"the target is", "the target mesh"});
  for (Case& c : targets)
    if (c.argument != "the target: element type") cases.push_back(std::move(c));
  return cases;
}

std::vector<Case> row_norms_cases() {
  return matrix_cases<float, double>(columns_split("the matrix"),
                                     [](const auto& x) { (void)kshard::row_squared_norms(x); });
}

// The RepairConfig fields and names, each changed on one rank (`repair(config, names)`).
template <class Repair>
std::vector<Case> repair_config_cases(Repair repair, std::vector<Watched> watched) {
  const kshard::RepairConfig config(true, 1e-4, 4);
  const auto field = [&](std::string name, std::string phrase, kshard::RepairConfig other) {
    return value_case(
        std::move(name), std::move(phrase),
        [=](bool here) { repair(here ? other : config, kshard::RepairNames{}); }, watched);
  };
  return {
      field("enabled", "RepairConfig::enabled() differs", kshard::RepairConfig(false, 1e-4, 4)),
      field("min_norm", "RepairConfig::min_norm() differs", kshard::RepairConfig(true, 1e-3, 4)),
      field("max_rows", "RepairConfig::max_rows() differs", kshard::RepairConfig(true, 1e-4, 5)),
      field("strategy", "differs",
            kshard::RepairConfig(true, 1e-4, 4, kshard::RepairStrategy::mean_direction)),
      field("kept rows", "kept row", config.keep_rows({2})),
      field("relative threshold", "differs", config.relative_threshold(0.5)),
      value_case(
          "names", "the name of the input embedding differs",
          [=](bool here) {
            repair(config, kshard::RepairNames{here ? "wte" : "embed_tokens", "lm_head"});
          },
          watched)};
}

std::vector<Case> find_damaged_rows_cases() {
  const auto m = Distribute{}(Type<float>{}, meshes().usual, Layout(Replicate{}, Shard<0>{}), 9, 4);
  return joined(
      matrix_cases<float, double>(plain_matrix("'embed_tokens'"),
                                  [](const auto& x) { (void)kshard::find_damaged_rows(x); }),
      repair_config_cases(
          [m](const kshard::RepairConfig& config, const kshard::RepairNames& names) {
            (void)kshard::find_damaged_rows(m, config, names);
          },
          {watch_copy(m)}));
}

std::vector<Case> repair_cases() {
  const Mesh2& mesh = meshes().usual;
  const auto arg = plain_matrix("'embed_tokens'");
  const auto input = Distribute{}(Type<float>{}, mesh, arg.layout, arg.rows, arg.cols);
  const auto output = Distribute{}(Type<float>{}, mesh, arg.layout, arg.rows, arg.cols);
  const kshard::RepairConfig mean(true, 1e-4, 4, kshard::RepairStrategy::mean_direction);
  auto inputs = matrix_cases<float, double>(
      arg, [mean](const auto& x) { (void)kshard::repair_embedding_rows(x, mean); });
  auto outputs = matrix_cases<float, double>(
      plain_matrix("'lm_head'"),
      [input](const auto& y) { (void)kshard::repair_embedding_rows(input, y); },
      {"'lm_head' is", "not the same mesh", "layouts differ"});
  auto given = value_case("output given", "whether an output embedding is given differs",
                          [=](bool here) {
                            if (here)
                              (void)kshard::repair_embedding_rows(input, mean);
                            else
                              (void)kshard::repair_embedding_rows(input, output, mean);
                          },
                          {watch_copy(input), watch_copy(output)});
  return joined(std::move(inputs), std::move(outputs), std::vector{std::move(given)},
                repair_config_cases(
                    [=](const kshard::RepairConfig& config, const kshard::RepairNames& names) {
                      (void)kshard::repair_embedding_rows(input, output, config, names);
                    },
                    {watch_copy(input), watch_copy(output)}));
}

std::vector<Case> lookup_cases() {
  const auto arg = rows_split("the table");
  const auto table = Distribute{}(Type<float>{}, meshes().usual, arg.layout, arg.rows, arg.cols);
  const std::vector<Watched> watched{watch_copy(table)};
  const auto lookup = [table](std::vector<std::int64_t> ids, std::size_t tp_dim, double scale) {
    (void)kshard::vocab_parallel_lookup(table, ids_of(std::move(ids)), kshard::TpDim{tp_dim},
                                        scale);
  };
  const std::size_t tp = tp_dim_of<decltype(table)>();
  return joined(
      matrix_cases<float, double>(arg,
                                  [](const auto& t) {
                                    (void)kshard::vocab_parallel_lookup(t, ids_of({1, 2}));
                                  }),
      std::vector{tp_group_case(
                      "number of ids", "the number of token ids differs",
                      [=](bool here) {
                        lookup(here ? std::vector<std::int64_t>{1, 2, 3}
                                    : std::vector<std::int64_t>{1, 2},
                               tp, 1.0);
                      },
                      watched),
                  tp_group_case(
                      "ids", "the list of token ids differs",
                      [=](bool here) {
                        lookup({1, here ? 3 : 2}, tp, 1.0);
                      },
                      watched),
                  value_case(
                      "tp_dim", "does not shard tensor dimension",
                      [=](bool here) {
                        lookup({1, 2}, here ? 1 - tp : tp, 1.0);
                      },
                      watched),
                  tp_group_case(
                      "scale", "the scale differs",
                      [=](bool here) {
                        lookup({1, 2}, tp, here ? 2.0 : 1.0);
                      },
                      watched),
                  value_case(
                      "out", "out is",
                      [=](bool here) {
                        kshard::vocab_parallel_lookup(
                            table, ids_of({1, 2}), ViewOf<decltype(table)>("out", here ? 3 : 2, 6));
                      },
                      watched)});
}

std::vector<Case> row_parallel_cases() {
  const auto arg = row_parallel_weight();
  const auto forward = [](const auto& w, std::size_t tokens) {
    using W = std::remove_cvref_t<decltype(w)>;
    const auto in_local = static_cast<std::size_t>(w.mapping().cols.local_extent());
    (void)kshard::row_parallel_linear(w, ViewOf<W>("x", tokens, in_local), kshard::no_bias,
                                      kshard::TpDim{tp_dim_of<W>()});
  };
  const auto weight = Distribute{}(Type<float>{}, meshes().usual, arg.layout, arg.rows, arg.cols);
  using W = decltype(weight);
  const std::vector<Watched> watched{watch_copy(weight)};
  const auto in_local = static_cast<std::size_t>(weight.mapping().cols.local_extent());
  const Kokkos::View<float*, MemSpace> bias("bias", static_cast<std::size_t>(arg.rows));
  return joined(matrix_cases<float, double>(arg, [forward](const auto& w) { forward(w, 3); }),
                std::vector{tp_group_case(
                                "tokens", "the number of rows of x_local (tokens) differs",
                                [=](bool here) { forward(weight, here ? 4 : 3); }, watched),
                            value_case(
                                "bias given", "whether a bias is given differs",
                                [=](bool here) {
                                  const ViewOf<W> x("x", 3, in_local);
                                  if (here)
                                    (void)kshard::row_parallel_linear(
                                        weight, x, kshard::no_bias, kshard::TpDim{tp_dim_of<W>()});
                                  else
                                    (void)kshard::row_parallel_linear(
                                        weight, x, bias, kshard::TpDim{tp_dim_of<W>()});
                                },
                                watched),
                            value_case(
                                "tp_dim", "does not shard tensor dimension",
                                [=](bool here) {
                                  (void)kshard::row_parallel_linear(
                                      weight, ViewOf<W>("x", 3, in_local), kshard::no_bias,
                                      kshard::TpDim{here ? 1 - tp_dim_of<W>() : tp_dim_of<W>()});
                                },
                                watched)});
}

// The weight is its own gradient here: every case is refused before anything is written (the
// checksums say so), and the gradient then matches its weight on every rank by construction.
std::vector<Case> column_parallel_backward_cases() {
  const auto arg = rows_split("the weight");
  const auto backward = [](const auto& w, std::size_t tokens, std::size_t tp_dim) {
    using W = std::remove_cvref_t<decltype(w)>;
    const auto out_local = static_cast<std::size_t>(w.mapping().rows.local_extent());
    (void)kshard::column_parallel_linear_backward(
        w, ViewOf<W>("x", tokens, static_cast<std::size_t>(w.cols())),
        ViewOf<W>("grad_y", tokens, out_local), w, kshard::no_bias, kshard::TpDim{tp_dim});
  };
  const auto weight = Distribute{}(Type<float>{}, meshes().usual, arg.layout, arg.rows, arg.cols);
  using W = decltype(weight);
  const std::vector<Watched> watched{watch_copy(weight)};
  const std::size_t tp = tp_dim_of<W>();
  const auto out_local = static_cast<std::size_t>(weight.mapping().rows.local_extent());
  const Kokkos::View<float*, MemSpace> grad_bias("grad_bias", out_local);
  return joined(
      matrix_cases<float, double>(arg,
                                  [backward](const auto& w) {
                                    backward(w, 3, tp_dim_of<std::remove_cvref_t<decltype(w)>>());
                                  }),
      std::vector{tp_group_case(
                      "tokens", "the number of rows of x (tokens) differs",
                      [=](bool here) { backward(weight, here ? 4 : 3, tp); }, watched),
                  value_case(
                      "tp_dim", "does not shard tensor dimension",
                      [=](bool here) { backward(weight, 3, here ? 1 - tp : tp); }, watched),
                  value_case(
                      "grad_bias given", "whether grad_bias_local is given differs",
                      [=](bool here) {
                        const ViewOf<W> x("x", 3, static_cast<std::size_t>(weight.cols()));
                        const ViewOf<W> grad_y("grad_y", 3, out_local);
                        if (here)
                          (void)kshard::column_parallel_linear_backward(
                              weight, x, grad_y, weight, kshard::no_bias, kshard::TpDim{tp});
                        else
                          (void)kshard::column_parallel_linear_backward(
                              weight, x, grad_y, weight, grad_bias, kshard::TpDim{tp});
                      },
                      watched)});
}

std::vector<Case> reduce_from_tp_cases() {
  const Meshes& ms = meshes();
  using Doubles = Kokkos::View<double**, Kokkos::LayoutRight, MemSpace>;
  const Doubles kept("kept", 3, 2);
  Kokkos::deep_copy(kept, 1.5);
  const Watched unchanged = [kept] {
    const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), kept);
    return static_cast<std::uint64_t>(host(0, 0) == 1.5 && host(2, 1) == 1.5);
  };
  const auto reduce = [](const Mesh2& mesh, std::size_t tp_dim, const auto& values) {
    kshard::reduce_from_tp(mesh, kshard::TpDim{tp_dim}, values);
  };
  return {value_case("tp_dim", "tp_dim differs",
                     [=](bool here) { reduce(ms.usual, here ? 0 : 1, kept); }, {unchanged}),
          value_case("mesh shape", "the mesh differs",
                     [=](bool here) { reduce(here ? ms.other_shape : ms.usual, 1, kept); },
                     {unchanged}),
          value_case("mesh dimension order", "the mesh differs",
                     [=](bool here) { reduce(here ? ms.other_order : ms.usual, 1, kept); },
                     {unchanged}),
          tp_group_case("element type", "the element type of values differs",
                        [=](bool here) {
                          if (here)
                            reduce(ms.usual, 1,
                                   Kokkos::View<float**, Kokkos::LayoutRight, MemSpace>("v", 3, 2));
                          else
                            reduce(ms.usual, 1, kept);
                        },
                        {unchanged}),
          tp_group_case("extent", "extent 0 of values differs",
                        [=](bool here) { reduce(ms.usual, 1, here ? Doubles("v", 4, 2) : kept); },
                        {unchanged}),
          tp_group_case("view rank", "the rank of values differs",
                        [=](bool here) {
                          if (here)
                            reduce(ms.usual, 1, Kokkos::View<double*, MemSpace>("v", 6));
                          else
                            reduce(ms.usual, 1, kept);
                        },
                        {unchanged})};
}

std::vector<Case> distribute_bias_cases() {
  const auto arg = rows_split("the weight");
  const auto bias_of = [](const auto& w, index_t elements) {
    using T = typename std::remove_cvref_t<decltype(w)>::value_type;
    Kokkos::View<T*, Kokkos::HostSpace> full("full", static_cast<std::size_t>(elements));
    (void)kshard::distribute_bias(w, full);
  };
  const auto weight = Distribute{}(Type<float>{}, meshes().usual, arg.layout, arg.rows, arg.cols);
  return joined(
      matrix_cases<float, double>(arg, [bias_of](const auto& w) { bias_of(w, w.rows()); },
                                  {"the bias has"}),
      std::vector{value_case("bias length", "the bias has",
                             [=](bool here) { bias_of(weight, here ? arg.rows + 1 : arg.rows); },
                             {watch_copy(weight)})});
}

// RedistributePlan::apply checks its matrices on each rank without agreeing (a documented
// precondition on the hot path): the same wrong matrix on every rank is refused alike.
std::vector<Case> apply_cases() {
  const Mesh2& mesh = meshes().usual;
  const auto m = Distribute{}(Type<float>{}, mesh, Layout(Replicate{}, Shard<0>{}), 7, 3);
  const auto other = Distribute{}(Type<float>{}, mesh, Layout(Replicate{}, Shard<0>{}), 8, 3);
  const kshard::test::Matrix<float, Layout<Replicate, Replicate>> target(mesh, {}, 7, 3);
  auto plan = std::make_shared<decltype(kshard::plan_redistribute(m, target))>(
      kshard::plan_redistribute(m, target));
  return {value_case("source matrix", "is 8 x 3 but the plan was made for 7 x 3",
                     [=](bool here) { plan->apply(here ? other : m, target); },
                     {watch_copy(m), watch_copy(other), watch_copy(target)})};
}

std::vector<Case> dim_cases() {
  return {value_case("name", "kshard::Mesh::dim: mesh has no dimension named 'pp'",
                     [](bool here) { (void)meshes().usual.dim(here ? "pp" : "tp"); })};
}

std::vector<Case> arguments_cases() {
  return {value_case("argument text", "--out differs between ranks", [](bool here) {
    kshard::comm::agree_on_arguments(meshes().usual.group(), {{"--out", here ? "b" : "a"}});
  })};
}

std::vector<EntryPoint> entry_points() {
  return {
      {"Mesh", Kind::agreed, mesh_cases},
      {"Mesh::sub", Kind::agreed, sub_mesh_cases},
      {"Mesh::dim", Kind::local, dim_cases},
      {"DistMatrix", Kind::agreed,
       [] { return building_cases<float, double>(plain_matrix(), Construct{}); }},
      {"distribute", Kind::agreed, distribute_cases},
      {"distribute_bias", Kind::agreed, distribute_bias_cases},
      {"gather", Kind::agreed, gather_cases},
      {"redistribute", Kind::agreed, redistribute_cases},
      {"plan_redistribute", Kind::agreed, plan_cases},
      {"redistribute_into", Kind::agreed, redistribute_into_cases},
      {"RedistributePlan::apply", Kind::precondition, apply_cases},
      {"row_squared_norms", Kind::agreed, row_norms_cases},
      {"find_damaged_rows", Kind::agreed, find_damaged_rows_cases},
      {"repair_embedding_rows", Kind::agreed, repair_cases},
      {"vocab_parallel_lookup", Kind::agreed, lookup_cases},
      {"row_parallel_linear", Kind::agreed, row_parallel_cases},
      {"column_parallel_linear_backward", Kind::agreed, column_parallel_backward_cases},
      {"reduce_from_tp", Kind::agreed, reduce_from_tp_cases},
      {"comm::agree_on_arguments", Kind::agreed, arguments_cases},
  };
}

TEST(EntryPoints, TableCoversTheHeaders) {
  expect_rows_for_every_operation(entry_points(), KSHARD_INCLUDE_DIR "/kshard", "/kshard/io/");
}

TEST(EntryPoints, EveryArgumentDifferingOnOneRank) {
  for (const EntryPoint& entry : entry_points()) run(entry);
}

}  // namespace
