#pragma once

// The collective read of a tensor into a DistMatrix (io::read_matrix, io::read_into), from the
// agreement every such read starts with (agree_on_new_matrix, same_read_into): the first
// copies read their blocks through file views of their shards, the replicas receive them by
// broadcast; a layout that splits columns is read as blocks of whole rows and redistributed.

#include <Kokkos_Core.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kshard/comm/agreement.hpp"
#include "kshard/dist_matrix.hpp"
#include "kshard/error.hpp"
#include "kshard/io/engine/collective.hpp"
#include "kshard/io/engine/mpi_file.hpp"
#include "kshard/io/safetensors/file.hpp"
#include "kshard/kernels/host_copy.hpp"
#include "kshard/matrix_agreement.hpp"
#include "kshard/mesh.hpp"
#include "kshard/placement.hpp"
#include "kshard/redistribute.hpp"

namespace kshard::detail {

// Why tensor `name` of `where` (a file or checkpoint, quoted), of `dtype` and `shape`, cannot be
// a rows x cols matrix of T (rows, cols < 0: any shape).
template <class T>
std::optional<std::string> shape_problem(std::string_view name, const std::string& where,
                                         io::Dtype dtype, const std::vector<std::int64_t>& shape,
                                         index_t rows, index_t cols) {
  if (dtype != io::dtype_of<T>())
    return fmt::format("kshard::io: tensor {} of {} is {}, but the matrix holds {} ({})",
                       in_quotes(name), where, io::to_string(dtype), render_type(type_code<T>()),
                       io::to_string(io::dtype_of<T>()));
  if (shape.size() != 2)
    return fmt::format("kshard::io: tensor {} of {} has shape {}; a matrix needs 2 dimensions",
                       in_quotes(name), where, io::shape_text(shape));
  if (rows >= 0 && (shape[0] != rows || shape[1] != cols))
    return fmt::format("kshard::io: tensor {} of {} has shape {}, but the matrix is {} x {}",
                       in_quotes(name), where, io::shape_text(shape), rows, cols);
  return std::nullopt;
}

// Why tensor `name` of `file` cannot be a rows x cols matrix of T (rows, cols < 0: any shape).
template <class T>
std::optional<std::string> matrix_problem(const io::SafetensorsFile& file, std::string_view name,
                                          index_t rows = -1, index_t cols = -1) {
  const io::TensorEntry* entry = file.header().find(name);
  const std::string where = fmt::format("'{}'", file.path().string());
  if (entry == nullptr)
    return fmt::format("kshard::io: {} has no tensor {}", where, in_quotes(name));
  return shape_problem<T>(name, where, entry->dtype, entry->shape, rows, cols);
}

// Settles the agreement of a read of tensor `name` from the file or checkpoint at `path` (`what`
// names it: "the file path") into a new matrix of T in `layout` on `mesh`, with this rank's
// `problem` with the stored tensor.
template <class T, std::size_t N, class L>
void agree_on_new_matrix(const Mesh<N>& mesh, const L& layout, std::string_view name,
                         std::string what, const std::string& path,
                         std::optional<std::string> problem) {
  Agreement agreement(mesh.group());
  same_text(agreement, "the tensor name", std::string(name));
  same_text(agreement, std::move(what), path);
  agreement.same("the element type", type_code<T>(), render_type);
  same_layout(agreement, layout, "the matrix");
  same_mesh(agreement, "the mesh of the matrix", mesh);
  agreement.problem(std::move(problem)).settle();
}

// The agreement of a read of tensor `name` from the file or checkpoint at `path` into the
// existing `matrix`: the name, the path and the matrix the same on every rank (the caller adds
// its own values and settles it).
template <class M>
void same_read_into(Agreement& agreement, const M& matrix, std::string_view name, std::string what,
                    const std::string& path) {
  same_text(agreement, "the tensor name", std::string(name));
  same_text(agreement, std::move(what), path);
  same_matrix(agreement, matrix, "the matrix");
}

// The mesh dimensions layout L replicates over, in increasing order.
template <class L>
constexpr auto replicated_dims() {
  constexpr std::size_t count = [] {
    std::size_t n = 0;
    for (const PlacementKind kind : L::kinds) n += kind == PlacementKind::replicate ? 1 : 0;
    return n;
  }();
  std::array<std::size_t, count> dims{};
  std::size_t k = 0;
  for (std::size_t m = 0; m < L::rank; ++m)
    if (L::kinds[m] == PlacementKind::replicate) dims[k++] = m;
  return dims;
}

// The ranks that hold the same block (the coordinates along the Replicate mesh dimensions) as
// one group whose rank 0 holds the first copy; empty when no dimension replicates. One
// dimension's group exists already; several are the sub-mesh over them (a split).
template <class L, std::size_t N>
std::optional<comm::Group> replica_group(const Mesh<N>& mesh) {
  static constexpr auto dims = replicated_dims<L>();
  if constexpr (dims.empty())
    return std::nullopt;
  else if constexpr (dims.size() == 1)
    return mesh.dim_group(dims[0]);
  else
    return [&]<std::size_t... K>(std::index_sequence<K...>) {
      return comm::Group(mesh.sub(dims[K]...).group());
    }
  (std::make_index_sequence<dims.size()>{});
}

// The collective read of `entry` into `matrix` through file views of its blocks: the first
// copies read their blocks, the replicas receive them by broadcast.
template <class ExecSpace, class M>
void read_blocks(const ExecSpace& space, const io::SafetensorsFile& file,
                 const io::TensorEntry& entry, const M& matrix) {
  const auto& mesh = matrix.mesh();
  const auto host = host_mirror(matrix.local());
  // The host may be the shard itself: work `space` queued on it must end before MPI writes it.
  fence(space, "kshard::io: before reading into a shard");
  ShardTypes types;
  std::optional<MpiFile> handle;
  agree(mesh.group(), attempt([&] {
          types = transfer_types(matrix);
          handle.emplace(mesh.group(), file.path().string(), FileAccess::read);
        }));
  agree(mesh.group(), attempt([&] {
          handle->read_shard(file.file_offset(entry), types, host.data());
          // A collective read past the end may fill zeros and report every byte read (ROMIO's
          // and OMPIO's aggregators do): the size, as every rank sees it, tells.
          const std::uint64_t size = handle->size();
          handle->close();
          if (size < file.file_size())
            throw error(fmt::format(
                "kshard::io: '{}' is {} bytes, shorter than the {} its header says (it changed "
                "after it was opened); tensor {} was not read",
                file.path().string(), size, file.file_size(), in_quotes(entry.name)));
        }));
  if (auto group = replica_group<typename M::layout_type>(mesh))
    broadcast_bytes(host.data(), host.size() * sizeof(typename M::value_type), *group);
  if (host.data() != matrix.local().data()) {
    Kokkos::deep_copy(space, matrix.local(), host);
    fence(space, "kshard::io: the shard is read (its host copy is freed)");
  }
}

// The layout of N mesh dimensions that splits rows over all of them: whole-row blocks, one
// contiguous stretch of a row-major tensor per rank.
// (A class template, not an alias that ignores its parameter: nvcc 13 loses such an alias in a
// pack expansion.)
template <std::size_t Dim>
struct row_block_placement {
  using type = Shard<0>;
};
template <std::size_t... M>
Layout<typename row_block_placement<M>::type...> row_blocks_layout(std::index_sequence<M...>);
template <std::size_t N>
using row_blocks_t = decltype(row_blocks_layout(std::make_index_sequence<N>{}));

// Whether a shard of `matrix` holds pieces of the tensor's rows on disk: a mesh dimension of
// more than one rank splits its columns (the same answer on every rank).
template <class M>
bool holds_pieces_of_rows(const M& matrix) {
  using L = typename M::layout_type;
  for (std::size_t m = 0; m < L::rank; ++m)
    if (L::tensor_dims[m] == 1 && matrix.mesh().shape()[m] > 1) return true;
  return false;
}

// Memory a read is about to fill whole, untouched so far: on a host, in huge pages where Linux
// grants them (advise_huge_pages). An embedding's 1 GiB read into fresh memory here took
// 0.56-1.4 s and 0.18-0.29 s so: page faults, not the copy, were most of a checkpoint read.
template <class View>
void advise_filled_whole(const View& local) {
  if constexpr (std::is_same_v<typename View::memory_space, Kokkos::HostSpace>)
    advise_huge_pages(local.data(), local.span() * sizeof(typename View::value_type));
}

// The collective read of `entry` into `matrix`, whose shape and dtype were agreed on. A layout
// that splits columns would have every rank read a piece of every row, which MPI-IO serves
// slower than a loop of preads (30522 x 384 F32 on 2 ranks, page-cached: 39 ms through Open
// MPI's OMPIO, 23 ms through ROMIO and for the preads) and a parallel file system slower still.
// It reads whole-row blocks instead, one contiguous read per rank, and redistributes them in
// memory (there: 1.35-1.48x the preads through OMPIO, from 1.54x, and 1.05x through ROMIO, from
// 1.35x; most of the rest was the page faults of the fresh block, hence huge pages for it:
// 0.88x through OMPIO), holding one row block per rank and the move's buffers meanwhile. Other
// layouts read their blocks directly.
template <class ExecSpace, class M>
void read_shard(const ExecSpace& space, const io::SafetensorsFile& file,
                const io::TensorEntry& entry, const M& matrix) {
  if (!holds_pieces_of_rows(matrix)) {
    read_blocks(space, file, entry, matrix);
    return;
  }
  using Blocks = row_blocks_t<M::layout_type::rank>;
  using BlockMatrix = DistMatrix<typename M::value_type, Blocks, typename M::execution_space,
                                 typename M::memory_space>;
  const auto& mesh = matrix.mesh();
  // Left unfilled (the read overwrites it); an allocation that fails anywhere fails everywhere.
  typename BlockMatrix::view_type local;
  agree(mesh.group(), attempt([&] {
          const auto map = map_layout(Blocks{}.actions(), mesh.shape(), mesh.coords(),
                                      matrix.rows(), matrix.cols());
          local = typename BlockMatrix::view_type(
              Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "kshard::io::row_blocks"),
              static_cast<std::size_t>(map.rows.local_extent()),
              static_cast<std::size_t>(map.cols.local_extent()));
        }));
  advise_filled_whole(local);
  const BlockMatrix blocks(mesh, Blocks{}, matrix.rows(), matrix.cols(), local);
  read_blocks(space, file, entry, blocks);
  redistribute_into(space, blocks, matrix);
}

}  // namespace kshard::detail
