// The tensor-parallel calls of the consumer (tensor_parallel_new_paths.cpp): it includes no
// kshard header itself, so its includer must bring every name it uses.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

// On a table of rows 10 * r + c split over `mesh`: a scaled lookup with its tp_dim given, a
// column-parallel layer with a distributed bias, and reduce_from_tp.
inline bool tensor_parallel_calls(const kshard::Mesh<1>& mesh) {
  kshard::HostMatrix<double> full("full", 5, 3);
  for (std::size_t r = 0; r < 5; ++r)
    for (std::size_t c = 0; c < 3; ++c) full(r, c) = static_cast<double>(10 * r + c);
  const auto table = kshard::distribute(mesh, kshard::Layout(kshard::Shard<0>{}),
                                        kshard::HostMatrix<const double>(full));
  Kokkos::View<std::int32_t*> ids("ids", 2);
  const auto host_ids = Kokkos::create_mirror_view(ids);
  host_ids(0) = 4;
  host_ids(1) = 0;
  Kokkos::deep_copy(ids, host_ids);
  const auto rows = Kokkos::create_mirror_view_and_copy(
      Kokkos::HostSpace(), kshard::vocab_parallel_lookup(table, ids, kshard::TpDim{0}, 2.0));
  bool ok = rows(0, 2) == 84.0 && rows(1, 1) == 2.0;

  const Kokkos::View<double*, Kokkos::HostSpace> ones("ones", 5);
  Kokkos::deep_copy(ones, 1.0);
  Kokkos::View<double**, Kokkos::LayoutRight> x("x", 1, 3);
  Kokkos::deep_copy(x, 1.0);
  const auto y_local = Kokkos::create_mirror_view_and_copy(
      Kokkos::HostSpace(),
      kshard::column_parallel_linear(table, x, kshard::distribute_bias(table, ones)));
  const auto& out_rows = table.mapping().rows;
  for (kshard::index_t l = 0; l < out_rows.local_extent(); ++l)
    ok = ok && y_local(0, static_cast<std::size_t>(l)) ==
                   static_cast<double>(30 * out_rows.to_global(l) + 4);

  Kokkos::View<double*> count("count", 1);
  Kokkos::deep_copy(count, 1.0);
  kshard::reduce_from_tp(mesh, kshard::TpDim{0}, count);
  const auto counted = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), count);
  return ok && counted(0) == static_cast<double>(mesh.size());
}
