#pragma once

/// \file
/// Safetensors checkpoints read into and written from `DistMatrix`es with collective MPI-IO:
/// each rank reads or writes only the bytes of the rows and columns it holds.
///
///     kshard::io::SafetensorsFile file(mesh, "model.safetensors");   // rank 0 reads the header
///     auto embed = kshard::io::read_matrix<float>(file, "embed_tokens.weight", mesh, layout);
///     ...repair...
///     kshard::io::write_safetensors(mesh, file, "repaired.safetensors",
///                                   {kshard::io::replace("embed_tokens.weight", embed)});
///
/// Costs. Opening: rank 0 reads the 8-byte prefix and the header (pread), one broadcast of its
/// bytes, and every rank parses them (so every rank throws the same error for a bad file).
/// Reading a matrix: one `MPI_File_read_at_all` in which only the first copy of each block is
/// read (ranks on a Replicate mesh dimension other than coordinate 0 read nothing), then one
/// broadcast per replica group; a layout that splits columns is read as blocks of whole rows
/// (one contiguous read per rank) and redistributed in memory. Writing a new file: the bytes of
/// every untouched tensor (and the header) are copied in equal contiguous parts by all ranks, each
/// replaced matrix is written by the first copies with one `MPI_File_write_at_all`, then fsync,
/// close and a rename: the file appears complete under its name or not at all.
///
/// Files are untrusted input: the header is validated before any size in it is used (see
/// safetensors_header.hpp), and every rank throws the same `kshard::error`, with nothing
/// written, for a file that is missing, truncated or lies about its contents, and for a tensor
/// that is missing or whose dtype or shape does not match the matrix. Elements are read as they
/// are stored: F32 into float, F64 into double, BF16 into kshard::bf16, F16 into kshard::f16;
/// other dtypes are listed in the header but refused as matrices.

#include <Kokkos_Core.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kshard/bfloat16.hpp"
#include "kshard/comm/agreement.hpp"
#include "kshard/kernels/copies.hpp"
#include "kshard/kernels/host_copy.hpp"
#include "kshard/comm/mpi.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/dist_matrix.hpp"
#include "kshard/error.hpp"
#include "kshard/float16.hpp"
#include "kshard/io/detail/mpi_file.hpp"
#include "kshard/io/detail/paths.hpp"
#include "kshard/io/io_stats.hpp"
#include "kshard/io/safetensors_header.hpp"
#include "kshard/mesh.hpp"
#include "kshard/placement.hpp"
#include "kshard/redistribute.hpp"

namespace kshard::io {

static_assert(std::endian::native == std::endian::little,
              "kshard::io reads safetensors (little-endian) elements as they are stored");

/// The safetensors dtype that stores elements of `T`: F32, F64, BF16 or F16.
template <class T>
constexpr Dtype dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return Dtype::F32;
  else if constexpr (std::is_same_v<T, double>)
    return Dtype::F64;
  else if constexpr (std::is_same_v<T, bf16>)
    return Dtype::BF16;
  else if constexpr (std::is_same_v<T, f16>)
    return Dtype::F16;
  else
    static_assert(sizeof(T) == 0,
                  "kshard::io reads and writes float, double, kshard::bf16 and kshard::f16");
}

namespace detail {

using kshard::detail::agree;
using kshard::detail::Agreement;

// What rank 0 found in a file's first bytes, for everyone.
struct HeaderBytes {
  std::optional<std::string> problem;
  std::uint64_t file_size = 0;
  std::vector<std::byte> json;
};

// Reads exactly `size` bytes at `offset` with pread, or says why not.
inline std::optional<std::string> pread_exactly(int fd, void* data, std::uint64_t size,
                                                std::uint64_t offset, const std::string& path) {
  auto* out = static_cast<char*>(data);
  for (std::uint64_t done = 0; done < size;) {
    const ssize_t got = ::pread(fd, out + done, size - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      return fmt::format("kshard::io: reading {} bytes at offset {} of '{}' failed: {}", size,
                         offset, path, got == 0 ? "end of file" : std::strerror(errno));
    done += static_cast<std::uint64_t>(got);
    io_stats().bytes_read += got;
  }
  return std::nullopt;
}

// An error of the header parser about the file at `path`, its "kshard::io: " said once.
inline std::string about_file(std::string_view path, std::string_view what) {
  constexpr std::string_view prefix = "kshard::io: ";
  if (what.starts_with(prefix)) what.remove_prefix(prefix.size());
  return fmt::format("kshard::io: '{}': {}", path, what);
}

// This rank's read of the length prefix and the header JSON (the only bytes a header needs).
inline HeaderBytes read_header_bytes(const std::string& path) {
  HeaderBytes result;
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer; fstat then refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    result.problem = fmt::format("kshard::io: cannot open '{}': {}", path, std::strerror(errno));
    return result;
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    result.problem = fmt::format("kshard::io: '{}' is not a regular file", path);
  } else {
    result.file_size = static_cast<std::uint64_t>(info.st_size);
    std::array<std::byte, 8> prefix{};
    try {
      if (result.file_size < 8)
        throw error(
            fmt::format("kshard::io: '{}' has {} bytes, fewer than the 8 of a safetensors "
                        "header length",
                        path, result.file_size));
      result.problem = pread_exactly(fd, prefix.data(), 8, 0, path);
      if (!result.problem) {
        result.json.resize(header_length_from_prefix(prefix, result.file_size));
        result.problem = pread_exactly(fd, result.json.data(), result.json.size(), 8, path);
      }
    } catch (const error& e) {
      result.problem = about_file(path, e.what());
    }
  }
  ::close(fd);
  return result;
}

// Broadcasts `bytes` from rank 0 in pieces that keep MPI counts below 2^31.
inline void broadcast_bytes(void* data, std::uint64_t size, const kshard::comm::Group& group) {
  constexpr std::uint64_t piece = std::uint64_t{1} << 30;
  auto* bytes = static_cast<char*>(data);
  for (std::uint64_t done = 0; done < size; done += piece)
    group.bcast(bytes + done, static_cast<int>(std::min(piece, size - done)), 0);
}

}  // namespace detail

/// A safetensors file whose validated header every rank holds. Opened collectively; holds no
/// file handle (reads and writes open the file on the mesh they use).
class SafetensorsFile {
 public:
  /// Collective over `mesh`: every rank reads the header and validates it. Every rank throws
  /// the same `kshard::error` for a path that differs between ranks, a file that cannot be
  /// opened, any header parse_safetensors_header refuses, and a file whose size or header
  /// differs between ranks (node-local copies that are not the same checkpoint).
  template <std::size_t N>
  SafetensorsFile(const Mesh<N>& mesh, std::filesystem::path path) : path_(std::move(path)) {
    const kshard::detail::Operation operation("io::SafetensorsFile");
    const kshard::comm::Group& group = mesh.group();
    detail::Agreement same_path(group);
    kshard::detail::same_text(same_path, "the file path", path_.string());
    same_path.settle();
    // Every rank reads the header itself (a small read; the data are read by their owners
    // only): a rank that sees another file under this path is refused here rather than
    // reading rows of another layout later.
    const detail::HeaderBytes bytes = detail::read_header_bytes(path_.string());
    detail::Agreement same_file(group);
    same_file.problem(bytes.problem)
        .same(fmt::format("the size of '{}'", path_.string()),
              static_cast<std::int64_t>(bytes.file_size))
        .same(fmt::format("the header of '{}' (the same path holds another file)", path_.string()),
              kshard::detail::Digest()
                  .add(std::string_view(reinterpret_cast<const char*>(bytes.json.data()),
                                        bytes.json.size()))
                  .value(),
              [](std::int64_t) { return ""; })
        .settle();
    try {
      header_ = parse_safetensors_header(bytes.json, bytes.file_size);
    } catch (const error& e) {  // the same bytes on every rank: the same message
      throw error(detail::about_file(path_.string(), e.what()));
    }
  }

  /// The file's path.
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  /// The validated header.
  [[nodiscard]] const SafetensorsHeader& header() const { return header_; }
  /// The file's size in bytes.
  [[nodiscard]] std::uint64_t file_size() const { return header_.data_offset + header_.data_size; }
  /// Byte offset of tensor `entry`'s first element in the file.
  [[nodiscard]] std::uint64_t file_offset(const TensorEntry& entry) const {
    return header_.data_offset + entry.begin;
  }

 private:
  std::filesystem::path path_;
  SafetensorsHeader header_;
};

namespace detail {

// Why tensor `name` of `file` cannot be a rows x cols matrix of T (rows, cols < 0: any shape).
template <class T>
std::optional<std::string> matrix_problem(const SafetensorsFile& file, std::string_view name,
                                          index_t rows = -1, index_t cols = -1) {
  const TensorEntry* entry = file.header().find(name);
  const std::string where = fmt::format("'{}'", file.path().string());
  if (entry == nullptr)
    return fmt::format("kshard::io: {} has no tensor {}", where, in_quotes(name));
  if (entry->dtype != dtype_of<T>())
    return fmt::format("kshard::io: tensor {} of {} is {}, but the matrix holds {} ({})",
                       in_quotes(name), where, to_string(entry->dtype),
                       kshard::detail::render_type(kshard::detail::type_code<T>()),
                       to_string(dtype_of<T>()));
  if (entry->shape.size() != 2)
    return fmt::format("kshard::io: tensor {} of {} has shape {}; a matrix needs 2 dimensions",
                       in_quotes(name), where, shape_text(entry->shape));
  if (rows >= 0 && (entry->shape[0] != rows || entry->shape[1] != cols))
    return fmt::format("kshard::io: tensor {} of {} has shape {}, but the matrix is {} x {}",
                       in_quotes(name), where, shape_text(entry->shape), rows, cols);
  return std::nullopt;
}

// The ranks that hold the same block (a Replicate mesh dimension's coordinates) as one
// communicator whose rank 0 holds the first copy; empty when no dimension replicates.
template <class L, std::size_t N>
std::optional<kshard::comm::Group> replica_group(const Mesh<N>& mesh) {
  std::vector<std::size_t> replicated;
  for (std::size_t m = 0; m < N; ++m)
    if (L::kinds[m] == PlacementKind::replicate) replicated.push_back(m);
  if (replicated.empty()) return std::nullopt;
  if (replicated.size() == 1)  // that dimension's communicator already is the group
    return mesh.dim_group(replicated[0]);
  int color = 0;  // the coordinates on the sharding dimensions, as one number
  for (std::size_t m = 0; m < N; ++m)
    if (L::kinds[m] != PlacementKind::replicate) color = color * mesh.shape()[m] + mesh.coords()[m];
  MPI_Comm split = MPI_COMM_NULL;
  kshard::detail::check_mpi(MPI_Comm_split(mesh.comm(), color, mesh.my_rank(), &split),
                            "MPI_Comm_split");
  return kshard::comm::Group(kshard::detail::Communicator::adopt(split));
}

// Runs `step`; an error it throws becomes this rank's problem for the agreement that follows.
template <class Step>
std::optional<std::string> attempt(Step&& step) {
  try {
    step();
  } catch (const std::exception& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

// True where this rank holds the first copy of its block: the ranks that read or write it.
template <class M>
bool transfers(const M& matrix) {
  return M::layout_type::is_first_copy(matrix.mesh().coords(), {0, 1});
}

// This rank's part of a whole-matrix transfer: its shard's datatypes, or none.
template <class M>
ShardTypes transfer_types(const M& matrix) {
  if (!transfers(matrix)) return {};
  return shard_types(matrix.mapping(), matrix.mapping().rows.runs(),
                     static_cast<int>(sizeof(typename M::value_type)));
}

// One collective transfer of a shard through the view at `offset`: `io(data, count, type,
// bytes)` is File::read_all or File::write_all.
template <class IO>
void transfer(File& file, MPI_Offset offset, const ShardTypes& types, void* data, IO&& io) {
  file.set_view(offset, types.count > 0 ? types.file.get() : MPI_BYTE);
  io(data, types.count, types.count > 0 ? types.memory.get() : MPI_BYTE, types.bytes);
  file.reset_view();
}

}  // namespace detail

namespace detail {

// The collective read of `entry` into `matrix` through file views of its blocks: the first
// copies read their blocks, the replicas receive them by broadcast.
template <class ExecSpace, class M>
void read_blocks(const ExecSpace& space, const SafetensorsFile& file, const TensorEntry& entry,
                 const M& matrix) {
  using L = typename M::layout_type;
  const auto& mesh = matrix.mesh();
  const auto host = kshard::detail::host_mirror(matrix.local());
  // The host may be the shard itself: work `space` queued on it must end before MPI writes it.
  kshard::detail::fence(space, "kshard::io: before reading into a shard");
  ShardTypes types;
  std::optional<File> handle;
  agree(mesh.group(), attempt([&] {
          types = transfer_types(matrix);
          handle.emplace(mesh.comm(), file.path().string(), MPI_MODE_RDONLY);
        }));
  agree(mesh.group(), attempt([&] {
          transfer(*handle, static_cast<MPI_Offset>(file.file_offset(entry)), types, host.data(),
                   [&](void* data, int count, MPI_Datatype type, index_t bytes) {
                     handle->read_all(data, count, type, bytes);
                   });
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
  if (auto group = replica_group<L>(mesh))
    broadcast_bytes(host.data(), host.size() * sizeof(typename M::value_type), *group);
  if (host.data() != matrix.local().data()) {
    Kokkos::deep_copy(space, matrix.local(), host);
    kshard::detail::fence(space, "kshard::io: the shard is read (its host copy is freed)");
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
void read_shard(const ExecSpace& space, const SafetensorsFile& file, const TensorEntry& entry,
                const M& matrix) {
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
  if constexpr (std::is_same_v<typename M::memory_space, Kokkos::HostSpace>)
    kshard::detail::advise_huge_pages(local.data(), local.span() * sizeof(typename M::value_type));
  const BlockMatrix blocks(mesh, Blocks{}, matrix.rows(), matrix.cols(), local);
  read_blocks(space, file, entry, blocks);
  redistribute_into(space, blocks, matrix);
}

}  // namespace detail

/// Reads tensor `name` of `file` as a `DistMatrix<T, L, ExecSpace, MemSpace>` over `mesh`:
/// each rank that holds the first copy of a block reads exactly that block's bytes (one
/// `MPI_File_read_at_all` through a datatype built from the mapping's runs), or, for a layout
/// that splits columns over more than one rank, its block of whole rows, which one
/// `redistribute_into` then moves to the layout (memory: that block and the move's buffers);
/// the replicas receive it by broadcast. Collective over the mesh. Every rank throws the same
/// `kshard::error`, with nothing allocated, for a missing tensor, a dtype other than T's, a
/// shape that is not 2-D, layouts, names or element types that differ between ranks, and a
/// file that is shorter than its header says. Copies to device memory run on `space`.
template <class T, class ExecSpace, class MemSpace = typename ExecSpace::memory_space,
          std::size_t N, class L>
requires Kokkos::is_execution_space<ExecSpace>::value DistMatrix<T, L, ExecSpace, MemSpace>
read_matrix(const ExecSpace& space, const SafetensorsFile& file, std::string_view name,
            const Mesh<N>& mesh, const L& layout) {
  static_assert(!L::has_partial,
                "kshard::io::read_matrix: a Partial layout holds addends, not values; read "
                "into Replicate or Shard and redistribute");
  const kshard::detail::Operation operation("io::read_matrix");
  detail::Agreement agreement(mesh.group());
  kshard::detail::same_text(agreement, "the tensor name", std::string(name));
  kshard::detail::same_text(agreement, "the file path", file.path().string());
  agreement.same("the element type", kshard::detail::type_code<T>(), kshard::detail::render_type);
  kshard::detail::same_layout(agreement, layout, "the matrix");
  kshard::detail::same_mesh(agreement, "the mesh of the matrix", mesh);
  agreement.problem(detail::matrix_problem<T>(file, name)).settle();

  const TensorEntry& entry = *file.header().find(name);
  DistMatrix<T, L, ExecSpace, MemSpace> matrix(mesh, layout, entry.shape[0], entry.shape[1],
                                               std::string(name));
  detail::read_shard(space, file, entry, matrix);
  return matrix;
}

/// `read_matrix(space, file, name, mesh, layout)` on a default instance of `ExecSpace`.
template <class T, class ExecSpace = Kokkos::DefaultExecutionSpace,
          class MemSpace = typename ExecSpace::memory_space, std::size_t N, class L>
DistMatrix<T, L, ExecSpace, MemSpace> read_matrix(const SafetensorsFile& file,
                                                  std::string_view name, const Mesh<N>& mesh,
                                                  const L& layout) {
  return read_matrix<T, ExecSpace, MemSpace>(ExecSpace{}, file, name, mesh, layout);
}

/// Reads tensor `name` of `file` into the existing `matrix` (a training loop's buffers,
/// reloaded without allocating), as `read_matrix` reads. Collective over its mesh; every rank
/// throws the same `kshard::error`, with `matrix` unchanged, for the refusals of `read_matrix`
/// and a tensor whose shape is not the matrix's. Copies to device memory run on `space`, which
/// is also fenced before MPI writes into host memory the matrix shares.
template <class ExecSpace, ValuedMatrix M>
requires kshard::detail::ExecutionSpaceFor<ExecSpace, M>
void read_into(const ExecSpace& space, const SafetensorsFile& file, std::string_view name,
               const M& matrix) {
  using T = typename M::value_type;
  const kshard::detail::Operation operation("io::read_into");
  detail::Agreement agreement(matrix.mesh().group());
  kshard::detail::same_text(agreement, "the tensor name", std::string(name));
  kshard::detail::same_text(agreement, "the file path", file.path().string());
  kshard::detail::same_matrix(agreement, matrix, "the matrix");
  agreement.problem(detail::matrix_problem<T>(file, name, matrix.rows(), matrix.cols()));
  agreement.settle();
  detail::read_shard(space, file, *file.header().find(name), matrix);
}

/// `read_into(space, file, name, matrix)` on a default instance of the matrix's execution
/// space.
template <ValuedMatrix M>
void read_into(const SafetensorsFile& file, std::string_view name, const M& matrix) {
  read_into(typename M::execution_space{}, file, name, matrix);
}

namespace detail {

// This rank's part of an update: the datatypes and the packed bytes it writes (empty on ranks
// that hold no first copy).
struct UpdatePart {
  ShardTypes types;
  std::vector<std::byte> bytes;
};

// The part of `matrix` this rank writes: its whole shard, or with `rows`, the rows of them it
// holds, packed in increasing id order.
template <class ExecSpace, class M>
UpdatePart update_part(const ExecSpace& space, const M& matrix,
                       const std::optional<std::vector<index_t>>& rows) {
  using T = typename M::value_type;
  UpdatePart part;
  if (!transfers(matrix)) return part;
  const auto& map = matrix.mapping();
  std::vector<IndexRun> runs;
  if (rows) {
    for (const index_t id : *rows)
      if (const index_t local = map.rows.to_local(id); local == invalid_index)
        continue;
      else if (!runs.empty() && runs.back().global_end() == id &&
               runs.back().local_begin + runs.back().size == local)
        ++runs.back().size;  // consecutive in the file and in the shard: one run
      else
        runs.push_back({id, local, 1});
  } else {
    runs = map.rows.runs();
  }
  part.types = shard_types(map, runs, static_cast<int>(sizeof(T)));
  const auto host =
      kshard::detail::to_host(space, matrix.local(), "kshard::io: the shard, for the write");
  const auto row_bytes = static_cast<std::size_t>(map.cols.local_extent()) * sizeof(T);
  part.bytes.resize(static_cast<std::size_t>(part.types.bytes));
  std::size_t at = 0;
  for (const IndexRun& run : runs) {
    const std::size_t n = static_cast<std::size_t>(run.size) * row_bytes;
    if (n > 0) std::memcpy(part.bytes.data() + at, &host(run.local_begin, 0), n);
    at += n;
  }
  return part;
}

struct UpdateAccess;

}  // namespace detail

/// A matrix to write over the tensor of the same name (`replace`), or over some of its rows
/// (`replace_rows`): its element type, shape and communicator, and how it packs its part.
/// Holds the matrix (a shared view).
class TensorUpdate {
 public:
  /// The tensor it replaces.
  [[nodiscard]] const std::string& name() const { return name_; }
  /// The rows it replaces (sorted, unique), or nothing for the whole tensor.
  [[nodiscard]] const std::optional<std::vector<index_t>>& rows() const { return row_ids_; }

 private:
  template <class ExecSpace, ValuedMatrix M>
  requires kshard::detail::ExecutionSpaceFor<ExecSpace, M>
  friend TensorUpdate replace(const ExecSpace& space, std::string name, const M& matrix);
  template <class ExecSpace, ValuedMatrix M>
  requires kshard::detail::ExecutionSpaceFor<ExecSpace, M>
  friend TensorUpdate replace_rows(const ExecSpace& space, std::string name, const M& matrix,
                                   std::vector<index_t> ids);
  friend struct detail::UpdateAccess;

  std::string name_;
  Dtype dtype_ = Dtype::F32;
  index_t rows_ = 0;
  index_t cols_ = 0;
  // Adds the matrix (element type, shape, layout, mesh) to an agreement, named as `role`: a
  // matrix laid out otherwise on one rank would have it write its part by its own layout.
  std::function<void(detail::Agreement&, std::string_view role)> same_matrix_;
  kshard::comm::Group group_;
  std::optional<std::vector<index_t>> row_ids_;
  std::function<detail::UpdatePart(const std::optional<std::vector<index_t>>&)> part_;
};

/// `matrix` as the new value of tensor `name`; its dtype and shape must be the tensor's. The
/// write copies the matrix to host memory on `space` (fenced there) when it writes.
template <class ExecSpace, ValuedMatrix M>
requires kshard::detail::ExecutionSpaceFor<ExecSpace, M> TensorUpdate
replace(const ExecSpace& space, std::string name, const M& matrix) {
  TensorUpdate update;
  update.name_ = std::move(name);
  update.dtype_ = dtype_of<typename M::value_type>();
  update.rows_ = matrix.rows();
  update.cols_ = matrix.cols();
  update.same_matrix_ = [matrix](detail::Agreement& agreement, std::string_view role) {
    kshard::detail::same_matrix(agreement, matrix, role);
  };
  update.group_ = matrix.mesh().group();
  update.part_ = [space, matrix](const std::optional<std::vector<index_t>>& rows) {
    return detail::update_part(space, matrix, rows);
  };
  return update;
}

/// `replace(space, name, matrix)` on a default instance of the matrix's execution space.
template <ValuedMatrix M>
TensorUpdate replace(std::string name, const M& matrix) {
  return replace(typename M::execution_space{}, std::move(name), matrix);
}

/// Rows `ids` (global row ids in [0, rows), any order, repeats ignored) of `matrix` as the new
/// value of the same rows of tensor `name`; for `write_rows_in_place`.
template <class ExecSpace, ValuedMatrix M>
requires kshard::detail::ExecutionSpaceFor<ExecSpace, M> TensorUpdate
replace_rows(const ExecSpace& space, std::string name, const M& matrix, std::vector<index_t> ids) {
  TensorUpdate update = replace(space, std::move(name), matrix);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  update.row_ids_ = std::move(ids);
  return update;
}

/// `replace_rows(space, name, matrix, ids)` on a default instance of the matrix's execution
/// space.
template <ValuedMatrix M>
TensorUpdate replace_rows(std::string name, const M& matrix, std::vector<index_t> ids) {
  return replace_rows(typename M::execution_space{}, std::move(name), matrix, std::move(ids));
}

namespace detail {

struct UpdateAccess {
  static UpdatePart part(const TensorUpdate& u) { return u.part_(u.row_ids_); }
  static index_t row_bytes(const TensorUpdate& u) {
    return u.cols_ * static_cast<index_t>(dtype_size(u.dtype_));
  }
  static Dtype dtype(const TensorUpdate& u) { return u.dtype_; }
  static index_t cols(const TensorUpdate& u) { return u.cols_; }

  // Why `update` cannot replace a tensor of `file` (over `group`), or nothing.
  static std::optional<std::string> problem(const TensorUpdate& u, const SafetensorsFile& file,
                                            const kshard::comm::Group& group) {
    if (!u.group_.same_ranks_as(group))
      return fmt::format(
          "kshard::io: the matrix for tensor {} lives on another mesh than the "
          "one writing the file",
          in_quotes(u.name_));
    const TensorEntry* entry = file.header().find(u.name_);
    if (entry == nullptr)
      return fmt::format("kshard::io: '{}' has no tensor {} to replace", file.path().string(),
                         in_quotes(u.name_));
    if (entry->dtype != u.dtype_ || entry->shape != std::vector<std::int64_t>{u.rows_, u.cols_})
      return fmt::format(
          "kshard::io: tensor {} of '{}' is {} {}, but the matrix replacing it is "
          "{} [{}, {}]",
          in_quotes(u.name_), file.path().string(), to_string(entry->dtype),
          shape_text(entry->shape), to_string(u.dtype_), u.rows_, u.cols_);
    if (u.row_ids_ && !u.row_ids_->empty() &&
        (u.row_ids_->front() < 0 || u.row_ids_->back() >= u.rows_))
      return fmt::format("kshard::io: row id {} of tensor {} is outside [0, {})",
                         u.row_ids_->front() < 0 ? u.row_ids_->front() : u.row_ids_->back(),
                         in_quotes(u.name_), u.rows_);
    return std::nullopt;
  }

  static void agree_on(Agreement& agreement, const TensorUpdate& u) {
    kshard::detail::same_text(agreement, "the name of a tensor to replace", u.name_);
    u.same_matrix_(agreement, in_quotes(u.name_));
    kshard::detail::Digest ids;
    for (const index_t id : u.row_ids_.value_or(std::vector<index_t>{-1})) ids.add(id);
    agreement.same(fmt::format("the rows of {} to replace", in_quotes(u.name_)), ids.value(),
                   [](std::int64_t) { return std::string(); });
  }
};

// The checks every write makes before touching a file: the same updates on every rank, each
// valid for `file`, none twice. Settled by the caller (with its own checks added).
inline void check_updates(Agreement& agreement, const SafetensorsFile& file,
                          const std::vector<TensorUpdate>& updates,
                          const kshard::comm::Group& group) {
  kshard::detail::same_text(agreement, "the input file", file.path().string());
  agreement.same("the number of tensors to replace", static_cast<std::int64_t>(updates.size()));
  for (const TensorUpdate& u : updates) {
    UpdateAccess::agree_on(agreement, u);
    agreement.problem(UpdateAccess::problem(u, file, group));
    if (std::count_if(updates.begin(), updates.end(),
                      [&](const TensorUpdate& v) { return v.name() == u.name(); }) > 1)
      agreement.problem(
          fmt::format("kshard::io: tensor {} is replaced twice", in_quotes(u.name())));
  }
}

// Writes every update's part through `out`, each at its tensor's offset in `file`'s layout.
inline void write_updates(File& out, const SafetensorsFile& file,
                          const std::vector<TensorUpdate>& updates) {
  for (const TensorUpdate& u : updates) {
    UpdatePart part = UpdateAccess::part(u);
    transfer(out, static_cast<MPI_Offset>(file.file_offset(*file.header().find(u.name()))),
             part.types, part.bytes.data(),
             [&](void* data, int count, MPI_Datatype type, index_t bytes) {
               out.write_all(data, count, type, bytes);
             });
  }
}

// Reads every update's part back through `in` and names the first that differs from what was
// written.
inline std::optional<std::string> verify_updates(File& in, const SafetensorsFile& file,
                                                 const std::vector<TensorUpdate>& updates) {
  std::optional<std::string> problem;
  for (const TensorUpdate& u : updates) {
    const UpdatePart part = UpdateAccess::part(u);
    std::vector<std::byte> back(part.bytes.size());
    transfer(in, static_cast<MPI_Offset>(file.file_offset(*file.header().find(u.name()))),
             part.types, back.data(), [&](void* data, int count, MPI_Datatype type, index_t bytes) {
               in.read_all(data, count, type, bytes);
             });
    if (!problem && back != part.bytes)
      problem = fmt::format(
          "kshard::io: tensor {} of '{}' reads back other bytes than were "
          "written",
          in_quotes(u.name()), file.path().string());
  }
  return problem;
}

// The file's bytes outside the tensors replaced whole, as [begin, end) ranges in file order,
// from byte 8: the length prefix is written last, over the temporary's marker.
inline std::vector<std::pair<std::uint64_t, std::uint64_t>> kept_ranges(
    const SafetensorsFile& file, const std::vector<TensorUpdate>& updates) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> replaced;
  for (const TensorUpdate& u : updates) {
    if (u.rows()) continue;  // a rows update writes over its tensor's kept bytes
    const TensorEntry& entry = *file.header().find(u.name());
    replaced.emplace_back(file.file_offset(entry), file.file_offset(entry) + entry.bytes());
  }
  std::sort(replaced.begin(), replaced.end());
  std::vector<std::pair<std::uint64_t, std::uint64_t>> kept;
  std::uint64_t at = temporary_marker.size();
  for (const auto& [begin, end] : replaced) {
    if (begin > at) kept.emplace_back(at, begin);
    at = std::max(at, end);
  }
  if (file.file_size() > at) kept.emplace_back(at, file.file_size());
  return kept;
}

// Copies this rank's equal share of the `kept` bytes from `source` to `target` (independent
// I/O through a bounded buffer: the same offsets in both files).
inline void copy_share(File& source, File& target,
                       const std::vector<std::pair<std::uint64_t, std::uint64_t>>& kept, int rank,
                       int size) {
  std::uint64_t total = 0;
  for (const auto& [begin, end] : kept) total += end - begin;
  // total * rank / size without forming total * rank, which may pass 64 bits.
  const auto share = [&](int r) {
    const auto ranks = static_cast<std::uint64_t>(size);
    return total / ranks * static_cast<std::uint64_t>(r) +
           total % ranks * static_cast<std::uint64_t>(r) / ranks;
  };
  const std::uint64_t share_begin = share(rank);
  const std::uint64_t share_end = share(rank + 1);
  constexpr std::uint64_t buffer_bytes = std::uint64_t{64} << 20;
  std::vector<char> buffer(
      static_cast<std::size_t>(std::min(buffer_bytes, share_end - share_begin)));
  std::uint64_t position = 0;  // of the current range's start among the kept bytes
  for (const auto& [begin, end] : kept) {
    const std::uint64_t from = std::max(share_begin, position);
    const std::uint64_t to = std::min(share_end, position + (end - begin));
    for (std::uint64_t at = from; at < to;) {
      const auto n = static_cast<int>(std::min(buffer_bytes, to - at));
      const auto offset = static_cast<MPI_Offset>(begin + (at - position));
      source.read_at(offset, buffer.data(), n);
      target.write_at(offset, buffer.data(), n);
      at += static_cast<std::uint64_t>(n);
    }
    position += end - begin;
  }
}

// Where a new file is written until it is complete: the same folder, so the rename is atomic.
inline std::filesystem::path partial_path(const std::filesystem::path& target) {
  return target.string() + ".kshard-partial";
}

// Rank 0's checks of the output paths, before anything is touched: neither the output nor its
// temporary is the source (by identity), the folder exists, the temporary name is free or
// kshard's leftover.
inline std::optional<std::string> output_problem(const SafetensorsFile& source,
                                                 const std::filesystem::path& target) {
  if (auto clash = first_clash({{"output", target}, {"output's temporary", partial_path(target)}},
                               {{"input", source.path()}}))
    return fmt::format(
        "kshard::io: {}; nothing was written: write to another path or update "
        "the rows in place",
        *clash);
  std::error_code ec;
  const std::filesystem::path folder = std::filesystem::absolute(target).parent_path();
  if (!std::filesystem::is_directory(folder, ec))
    return fmt::format("kshard::io: the output folder '{}' does not exist", folder.string());
  return temporary_problem(partial_path(target));
}

// The 8-byte length prefix of a file with `header`.
inline std::array<std::byte, 8> length_prefix(const SafetensorsHeader& header) {
  std::array<std::byte, 8> prefix{};
  for (std::size_t i = 0; i < 8; ++i)
    prefix[i] = static_cast<std::byte>(header.header_length >> (8 * i) & 0xff);
  return prefix;
}

// Rank 0: the complete file takes its name, durably (the folder is synced too).
inline void publish(const std::filesystem::path& partial, const std::filesystem::path& target) {
  if (std::rename(partial.c_str(), target.c_str()) != 0)
    throw error(fmt::format("kshard::io: renaming '{}' to '{}' failed: {}", partial.string(),
                            target.string(), std::strerror(errno)));
  const std::filesystem::path folder = std::filesystem::absolute(target).parent_path();
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// Writes the new file under `partial`: kept bytes copied, then the updates written over them
// (so that a rows update lands on its tensor's copied bytes), synced and closed.
inline void write_partial(const kshard::comm::Group& group, const SafetensorsFile& source,
                          const std::filesystem::path& partial,
                          const std::vector<TensorUpdate>& updates) {
  std::optional<File> in;
  std::optional<File> out;
  agree(group, attempt([&] {
          in.emplace(group.native(), source.path().string(), MPI_MODE_RDONLY);
          out.emplace(group.native(), partial.string(), MPI_MODE_WRONLY);  // rank 0 made it
        }));
  const int rank = group.rank();
  agree(group,
        attempt([&] { copy_share(*in, *out, kept_ranges(source, updates), rank, group.size()); }));
  agree(group, attempt([&] {
          write_updates(*out, source, updates);
          out->sync();
          out->close();
          in->close();
        }));
}

}  // namespace detail

/// Writes a new checkpoint at `target`: the file `source` with the tensors (or rows) named by
/// `updates` replaced by their matrices (same dtype and shape, so the header is kept byte for
/// byte). The bytes outside the tensors replaced whole are copied in equal parts by all ranks;
/// each matrix is written by the first copies of its blocks (one `MPI_File_write_at_all`); the
/// file is written as `target` + ".kshard-partial" (starting with kshard's temporary marker
/// until its length prefix is written last), synced, then renamed, so `target` is complete or
/// untouched, and `source` is only read. Collective over `mesh`, which every matrix must live
/// on. Every rank throws the same `kshard::error`, with no file touched, for a missing tensor, a
/// dtype or shape that differs from the tensor's, a tensor given twice, row ids out of range,
/// arguments that differ between ranks, a target or temporary name that names the source file
/// (by device and inode: through links and `..` too), a temporary name that holds a file kshard
/// did not write, a folder that does not exist; and for any failed read or write, with `target`
/// untouched.
template <std::size_t N>
void write_safetensors(const Mesh<N>& mesh, const SafetensorsFile& source,
                       const std::filesystem::path& target,
                       const std::vector<TensorUpdate>& updates) {
  const kshard::detail::Operation operation("io::write_safetensors");
  const kshard::comm::Group& group = mesh.group();
  const std::filesystem::path partial = detail::partial_path(target);
  detail::Agreement agreement(group);
  kshard::detail::same_text(agreement, "the output file", target.string());
  detail::check_updates(agreement, source, updates, group);
  if (mesh.my_rank() == 0) agreement.problem(detail::output_problem(source, target));
  agreement.settle();
  bool created = false;  // rank 0 made the temporary: its to remove after a failure
  try {
    detail::agree(group, detail::attempt([&] {
                    if (mesh.my_rank() != 0) return;
                    ::close(detail::create_temporary(partial));
                    created = true;
                  }));
    detail::write_partial(group, source, partial, updates);
    detail::agree(group, detail::attempt([&] {
                    if (mesh.my_rank() != 0) return;
                    const detail::ScopedFd fd(::open(partial.c_str(), O_WRONLY | O_CLOEXEC));
                    detail::seal_temporary(fd.get(), partial,
                                           detail::length_prefix(source.header()));
                    detail::publish(partial, target);
                  }));
  } catch (const error&) {
    if (created) ::unlink(partial.c_str());
    throw;
  }
}

namespace detail {

// An undo file is a safetensors file: tensor "<i>.rows" holds the row ids of update i,
// "<i>.bytes" their bytes before the write, metadata "<i>.name" its tensor. It records what
// the in-place write left behind, so that undo restores into that file only: the file's path,
// device, inode and size, and, once the rows are written and verified (state "written"), a
// hash of each tensor's written rows ("<i>.written_hash").
inline constexpr std::string_view undo_format = "kshard.undo";
inline constexpr std::string_view undo_version = "2";
inline constexpr std::string_view undo_target = "kshard.target";
inline constexpr std::string_view undo_target_size = "kshard.target_size";
inline constexpr std::string_view undo_target_device = "kshard.target_device";
inline constexpr std::string_view undo_target_inode = "kshard.target_inode";
inline constexpr std::string_view undo_state = "kshard.state";
// The states and the hash are of fixed length: the header keeps its length when they change.
inline constexpr std::string_view undo_writing = "writing";
inline constexpr std::string_view undo_written = "written";
inline constexpr std::string_view undo_no_hash = "0000000000000000";

// The key of metadata `field` of update `i`.
inline std::string undo_key(std::size_t i, std::string_view field) {
  return fmt::format("{}.{}", i, field);
}

// FNV-1a of row bytes as 16 hex digits.
inline std::string rows_hash(const std::vector<std::byte>& bytes) {
  const std::int64_t value =
      kshard::detail::Digest()
          .add(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()))
          .value();
  return fmt::format("{:016x}", std::bit_cast<std::uint64_t>(value));
}

// `path` opened with `flags`, or an error naming it.
inline int open_or_throw(const std::filesystem::path& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0)
    throw error(
        fmt::format("kshard::io: cannot open '{}': {}", path.string(), std::strerror(errno)));
  return fd;
}

// Rows `ids`, each `row_bytes` long, of the tensor at byte `offset` of the file open as `fd`,
// packed in that order.
inline std::vector<std::byte> read_rows(int fd, const std::string& path, std::uint64_t offset,
                                        const std::vector<index_t>& ids, std::uint64_t row_bytes) {
  std::vector<std::byte> bytes(ids.size() * row_bytes);
  for (std::size_t r = 0; r < ids.size(); ++r)
    kshard::detail::throw_if(pread_exactly(fd, bytes.data() + r * row_bytes, row_bytes,
                                           offset + static_cast<std::uint64_t>(ids[r]) * row_bytes,
                                           path));
  return bytes;
}

// Why `file` may not be written in place (rank 0's check): read-only by its mode (respected
// even by root, who may write anyway) or by access().
inline std::optional<std::string> writable_problem(const SafetensorsFile& file) {
  struct stat info {};
  if (::stat(file.path().c_str(), &info) != 0 ||
      (info.st_mode & (S_IWUSR | S_IWGRP | S_IWOTH)) == 0 ||
      ::access(file.path().c_str(), W_OK) != 0)
    return fmt::format("kshard::io: '{}' is read-only; nothing was written", file.path().string());
  return std::nullopt;
}

// Rank 0's checks before an in-place write touches anything: neither the undo file nor its
// temporary is the checkpoint (by identity), the checkpoint is writable, no undo file is there
// yet, and the temporary name is free or kshard's leftover.
inline std::optional<std::string> in_place_problem(const SafetensorsFile& file,
                                                   const std::filesystem::path& undo) {
  if (auto clash = first_clash({{"undo file", undo}, {"undo file's temporary", partial_path(undo)}},
                               {{"checkpoint", file.path()}}))
    return fmt::format("kshard::io: {}; nothing was written: name another undo file", *clash);
  if (auto problem = writable_problem(file)) return problem;
  std::error_code ec;  // rank 0 alone looks: it must not throw
  if (std::filesystem::exists(undo, ec) || ec)
    return fmt::format(
        "kshard::io: the undo file '{}' exists already; undo that write or remove the file first",
        undo.string());
  return temporary_problem(partial_path(undo));
}

// Writes `bytes` (a safetensors file) to `path` durably and atomically: a marked temporary,
// its length prefix written last, fsync, rename.
inline void write_durably(const std::filesystem::path& path, const std::vector<std::byte>& bytes) {
  const std::filesystem::path partial = partial_path(path);
  const ScopedFd fd(create_temporary(partial));
  try {
    for (std::size_t done = temporary_marker.size(); done < bytes.size();) {
      const ssize_t n =
          ::pwrite(fd.get(), bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        throw error(fmt::format("kshard::io: writing '{}' failed: {}", partial.string(),
                                std::strerror(errno)));
      done += static_cast<std::size_t>(n);
      io_stats().bytes_written += n;
    }
    std::array<std::byte, 8> prefix{};
    std::copy_n(bytes.begin(), prefix.size(), prefix.begin());
    seal_temporary(fd.get(), partial, prefix);
    publish(partial, path);
  } catch (const error&) {
    ::unlink(partial.c_str());
    throw;
  }
}

// Rank 0's undo file while the in-place write runs: its tensors and metadata.
struct UndoImage {
  std::vector<TensorSpec> specs;
  std::map<std::string, std::string> metadata;

  [[nodiscard]] std::vector<std::byte> header() const {
    return serialize_safetensors_header(make_safetensors_header(specs, metadata));
  }
};

// Rank 0: the undo file of `updates` (the current bytes of every row they replace), recording
// the file's identity and size, in state "writing".
inline UndoImage write_undo(const SafetensorsFile& file, const std::vector<TensorUpdate>& updates,
                            const std::filesystem::path& undo) {
  const ScopedFd fd(open_or_throw(file.path(), O_RDONLY));
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0)
    throw error(fmt::format("kshard::io: cannot stat '{}': {}", file.path().string(),
                            std::strerror(errno)));
  UndoImage image;
  image.metadata = {{std::string(undo_format), std::string(undo_version)},
                    {std::string(undo_target), std::filesystem::absolute(file.path()).string()},
                    {std::string(undo_target_size), std::to_string(file.file_size())},
                    {std::string(undo_target_device), std::to_string(info.st_dev)},
                    {std::string(undo_target_inode), std::to_string(info.st_ino)},
                    {std::string(undo_state), std::string(undo_writing)}};
  std::vector<std::byte> data;
  for (std::size_t i = 0; i < updates.size(); ++i) {
    const TensorUpdate& u = updates[i];
    const std::vector<index_t>& ids = *u.rows();
    const auto count = static_cast<std::int64_t>(ids.size());
    image.metadata[undo_key(i, "name")] = u.name();
    image.metadata[undo_key(i, "written_hash")] = undo_no_hash;
    image.specs.push_back({undo_key(i, "rows"), Dtype::I64, {count}});
    image.specs.push_back(
        {undo_key(i, "bytes"), UpdateAccess::dtype(u), {count, UpdateAccess::cols(u)}});
    const auto* id_bytes = reinterpret_cast<const std::byte*>(ids.data());
    data.insert(data.end(), id_bytes, id_bytes + ids.size() * sizeof(index_t));
    const std::vector<std::byte> rows =
        read_rows(fd.get(), file.path().string(), file.file_offset(*file.header().find(u.name())),
                  ids, static_cast<std::uint64_t>(UpdateAccess::row_bytes(u)));
    data.insert(data.end(), rows.begin(), rows.end());
  }
  std::vector<std::byte> bytes = image.header();
  bytes.insert(bytes.end(), data.begin(), data.end());
  write_durably(undo, bytes);
  return image;
}

// Rank 0, after the rows were written and verified: the undo file records the hash of each
// tensor's rows as the file now holds them, and state "written". The values keep their length,
// so only the header bytes that differ are rewritten (tens of bytes) and synced; a torn write
// there leaves a hash or state that undo refuses, never one it accepts wrongly.
inline void mark_undo_written(const SafetensorsFile& file, const std::vector<TensorUpdate>& updates,
                              UndoImage& image, const std::filesystem::path& undo) {
  const std::vector<std::byte> before = image.header();
  {
    const ScopedFd in(open_or_throw(file.path(), O_RDONLY));
    for (std::size_t i = 0; i < updates.size(); ++i)
      image.metadata[undo_key(i, "written_hash")] = rows_hash(read_rows(
          in.get(), file.path().string(), file.file_offset(*file.header().find(updates[i].name())),
          *updates[i].rows(), static_cast<std::uint64_t>(UpdateAccess::row_bytes(updates[i]))));
  }
  image.metadata[std::string(undo_state)] = undo_written;
  const std::vector<std::byte> after = image.header();
  if (after.size() != before.size())
    throw error("kshard::io: the undo file's header changed its length (a kshard bug)");
  const auto first = static_cast<std::size_t>(
      std::mismatch(before.begin(), before.end(), after.begin()).first - before.begin());
  const auto end =
      after.size() -
      static_cast<std::size_t>(std::mismatch(before.rbegin(), before.rend(), after.rbegin()).first -
                               before.rbegin());
  const ScopedFd out(open_or_throw(undo, O_WRONLY));
  if (::pwrite(out.get(), after.data() + first, end - first, static_cast<off_t>(first)) !=
          static_cast<ssize_t>(end - first) ||
      ::fsync(out.get()) != 0)
    throw error(
        fmt::format("kshard::io: writing '{}' failed: {}", undo.string(), std::strerror(errno)));
  io_stats().bytes_written += static_cast<std::int64_t>(end - first);
}

// Writes the updates' rows into `file` itself, fsyncs, and reads them back.
inline void write_rows(const kshard::comm::Group& group, const SafetensorsFile& file,
                       const std::vector<TensorUpdate>& updates) {
  {
    std::optional<File> out;
    agree(group,
          attempt([&] { out.emplace(group.native(), file.path().string(), MPI_MODE_WRONLY); }));
    agree(group, attempt([&] {
            write_updates(*out, file, updates);
            out->sync();
            out->close();
          }));
  }
  std::optional<File> in;
  agree(group, attempt([&] { in.emplace(group.native(), file.path().string(), MPI_MODE_RDONLY); }));
  std::optional<std::string> problem;
  problem = attempt([&] {
    const auto differs = verify_updates(*in, file, updates);
    in->close();  // collective: before a throw on some ranks only
    if (differs) throw error(*differs);
  });
  agree(group, problem);
}

// The value of metadata `key` of an undo file, or an error naming the file.
inline const std::string& undo_field(const SafetensorsFile& undo, std::string_view key) {
  const auto it = undo.header().metadata.find(std::string(key));
  if (it == undo.header().metadata.end())
    throw error(fmt::format("kshard::io: '{}' is not a kshard undo file (no {} in its metadata)",
                            undo.path().string(), key));
  return it->second;
}

// One tensor of an undo file: the rows it restores and where they go in the checkpoint.
struct UndoPart {
  std::string name;
  std::vector<index_t> ids;
  std::vector<std::byte> saved;  // the rows' bytes before the in-place write
  std::uint64_t offset = 0;      // of the tensor in the checkpoint
  std::uint64_t row_bytes = 0;
  std::string written_hash;
};

// Rank 0: the tensors of `undo`, each checked against the tensor of `target` it restores.
inline std::vector<UndoPart> undo_parts(const SafetensorsFile& undo,
                                        const SafetensorsFile& target) {
  const ScopedFd fd(open_or_throw(undo.path(), O_RDONLY));
  const std::string from = undo.path().string();
  std::vector<UndoPart> parts;
  for (std::size_t i = 0;; ++i) {
    const auto name = undo.header().metadata.find(undo_key(i, "name"));
    if (name == undo.header().metadata.end()) return parts;
    const TensorEntry* rows = undo.header().find(undo_key(i, "rows"));
    const TensorEntry* saved = undo.header().find(undo_key(i, "bytes"));
    const TensorEntry* entry = target.header().find(name->second);
    if (rows == nullptr || saved == nullptr || rows->dtype != Dtype::I64 ||
        rows->shape.size() != 1 || entry == nullptr || saved->dtype != entry->dtype ||
        entry->shape.size() != 2 ||
        saved->shape != std::vector<std::int64_t>{rows->shape[0], entry->shape[1]})
      throw error(fmt::format("kshard::io: the undo file does not match tensor {} of '{}'",
                              in_quotes(name->second), target.path().string()));
    UndoPart part{name->second,
                  std::vector<index_t>(static_cast<std::size_t>(rows->shape[0])),
                  std::vector<std::byte>(saved->bytes()),
                  target.file_offset(*entry),
                  static_cast<std::uint64_t>(entry->shape[1]) * dtype_size(entry->dtype),
                  undo_field(undo, undo_key(i, "written_hash"))};
    kshard::detail::throw_if(
        pread_exactly(fd.get(), part.ids.data(), rows->bytes(), undo.file_offset(*rows), from));
    kshard::detail::throw_if(pread_exactly(fd.get(), part.saved.data(), part.saved.size(),
                                           undo.file_offset(*saved), from));
    for (const index_t id : part.ids)
      if (id < 0 || id >= entry->shape[0])
        throw error(fmt::format("kshard::io: the undo file names row {} of tensor {}, which has {}",
                                id, in_quotes(name->second), entry->shape[0]));
    parts.push_back(std::move(part));
  }
}

// Rank 0: `target` is the file `undo` was made for: a format that records it, not the undo
// file itself, the device, inode and size recorded.
inline void check_undo_identity(const SafetensorsFile& undo, const SafetensorsFile& target) {
  const std::string where = target.path().string();
  if (const std::string& format = undo_field(undo, undo_format); format != undo_version)
    throw error(fmt::format(
        "kshard::io: the undo file '{}' has format {}, which does not record what the in-place "
        "write left in the checkpoint (its identity and a hash of the rows); kshard restores "
        "only from format {}",
        undo.path().string(), in_quotes(format), undo_version));
  if (auto clash = first_clash({{"undo file", undo.path()}}, {{"checkpoint it restores", where}}))
    throw error(fmt::format("kshard::io: {}", *clash));
  struct stat info {};
  if (::stat(where.c_str(), &info) != 0)
    throw error(fmt::format("kshard::io: cannot stat '{}': {}", where, std::strerror(errno)));
  const std::string now = fmt::format("device {} inode {}", info.st_dev, info.st_ino);
  const std::string recorded =
      fmt::format("device {} inode {}", undo_field(undo, undo_target_device),
                  undo_field(undo, undo_target_inode));
  if (now != recorded)
    throw error(fmt::format(
        "kshard::io: '{}' is not the file the undo file '{}' was made for: it is {}, the undo "
        "file records {} (replaced since the in-place write?)",
        where, undo.path().string(), now, recorded));
  if (undo_field(undo, undo_target_size) != std::to_string(target.file_size()))
    throw error(fmt::format("kshard::io: '{}' has {} bytes, but the undo file was made for {}",
                            where, target.file_size(), undo_field(undo, undo_target_size)));
}

// Rank 0: the parts `undo` restores into `target`, after checking that the rows there are
// those the in-place write left (its state "written"; a write that never finished, state
// "writing", left old and new rows that no hash tells apart, and is checked by identity only).
inline std::vector<UndoPart> check_undo(const SafetensorsFile& undo,
                                        const SafetensorsFile& target) {
  check_undo_identity(undo, target);
  std::vector<UndoPart> parts = undo_parts(undo, target);
  const std::string& state = undo_field(undo, undo_state);
  if (state == undo_writing) return parts;
  if (state != undo_written)
    throw error(fmt::format("kshard::io: the undo file '{}' is in state {}, not one kshard writes",
                            undo.path().string(), in_quotes(state)));
  const ScopedFd fd(open_or_throw(target.path(), O_RDONLY));
  for (const UndoPart& part : parts) {
    const std::string now = rows_hash(
        read_rows(fd.get(), target.path().string(), part.offset, part.ids, part.row_bytes));
    if (now != part.written_hash)
      throw error(fmt::format(
          "kshard::io: the rows of tensor {} in '{}' are not those the in-place write left there "
          "(their hash is {}, the undo file '{}' records {}): the file was written, replaced or "
          "undone since",
          in_quotes(part.name), target.path().string(), now, undo.path().string(),
          part.written_hash));
  }
  return parts;
}

// Rank 0: writes the saved rows back into `target`, fsyncs, and reads them back.
inline void restore_rows(const std::vector<UndoPart>& parts, const SafetensorsFile& target) {
  const std::string where = target.path().string();
  const ScopedFd out(open_or_throw(target.path(), O_RDWR));
  for (const UndoPart& part : parts)
    for (std::size_t r = 0; r < part.ids.size(); ++r) {
      const auto at = part.offset + static_cast<std::uint64_t>(part.ids[r]) * part.row_bytes;
      if (::pwrite(out.get(), part.saved.data() + r * part.row_bytes, part.row_bytes,
                   static_cast<off_t>(at)) != static_cast<ssize_t>(part.row_bytes))
        throw error(
            fmt::format("kshard::io: writing '{}' failed: {}", where, std::strerror(errno)));
      io_stats().bytes_written += static_cast<std::int64_t>(part.row_bytes);
    }
  if (::fsync(out.get()) != 0)
    throw error(fmt::format("kshard::io: syncing '{}' failed: {}", where, std::strerror(errno)));
  for (const UndoPart& part : parts)
    if (read_rows(out.get(), where, part.offset, part.ids, part.row_bytes) != part.saved)
      throw error(fmt::format(
          "kshard::io: tensor {} of '{}' reads back other bytes than the undo file holds",
          in_quotes(part.name), where));
}

}  // namespace detail

/// Restores the rows that `write_rows_in_place` replaced, from its undo file `undo`, into the
/// checkpoint the undo file names, fsyncs, verifies, and removes `undo`. Collective over
/// `mesh`; rank 0 checks and writes. Every rank throws the same `kshard::error`, with the
/// checkpoint untouched, for an undo file that is missing, not kshard's, of an older format,
/// the checkpoint itself, or made for another file: one whose device and inode, size, tensors,
/// dtypes or widths differ from those recorded, or, after a write that finished, whose rows
/// are not those the write left (hashed; so a second undo from a copy of the file is refused).
template <std::size_t N>
void undo_in_place(const Mesh<N>& mesh, const std::filesystem::path& undo) {
  const kshard::detail::Operation operation("io::undo_in_place");
  const SafetensorsFile saved(mesh, undo);
  std::string target_path;
  detail::agree(mesh.group(), detail::attempt([&] {
                  static_cast<void>(detail::undo_field(saved, detail::undo_format));
                  target_path = detail::undo_field(saved, detail::undo_target);
                }));
  const SafetensorsFile target(mesh, target_path);
  std::vector<detail::UndoPart> parts;
  detail::agree(mesh.group(), detail::attempt([&] {
                  if (mesh.my_rank() == 0) parts = detail::check_undo(saved, target);
                }));
  detail::agree(mesh.group(), detail::attempt([&] {
                  if (mesh.my_rank() != 0) return;
                  detail::restore_rows(parts, target);
                  std::filesystem::remove(undo);
                }));
}

/// Writes the rows of `updates` (made with `replace_rows`) into `file` itself, and nothing
/// else: first rank 0 saves the rows' current bytes to the undo file `undo` (written under a
/// marked temporary name, fsynced, renamed) with the file's device, inode and size; then the
/// ranks holding first copies write their parts of the rows (one `MPI_File_write_at_all` per
/// tensor), fsync, and read them back to verify; then rank 0 records the hash of the rows as
/// written in the undo file. A failed write or verification restores the rows from `undo`;
/// after success `undo` stays, for `undo_in_place`. Collective over `mesh`. Every rank throws
/// the same `kshard::error`, nothing written, for the refusals of `write_safetensors`, an
/// update without rows, a file whose mode is read-only, an `undo` (or its temporary name) that
/// is the checkpoint, by identity, an `undo` that already exists (an earlier write not undone
/// or removed), and a file at its temporary name that kshard did not write. Rank 0 holds all
/// replaced rows in memory while it writes the undo file.
template <std::size_t N>
void write_rows_in_place(const Mesh<N>& mesh, const SafetensorsFile& file,
                         const std::vector<TensorUpdate>& updates,
                         const std::filesystem::path& undo) {
  const kshard::detail::Operation operation("io::write_rows_in_place");
  const kshard::comm::Group& group = mesh.group();
  detail::Agreement agreement(group);
  kshard::detail::same_text(agreement, "the undo file", undo.string());
  detail::check_updates(agreement, file, updates, group);
  for (const TensorUpdate& u : updates)
    if (!u.rows())
      agreement.problem(
          fmt::format("kshard::io: the update of tensor {} has no rows; in-place "
                      "writes take replace_rows(name, matrix, ids)",
                      detail::in_quotes(u.name())));
  if (mesh.my_rank() == 0) agreement.problem(detail::in_place_problem(file, undo));
  agreement.settle();
  std::optional<detail::UndoImage> image;  // rank 0's
  detail::agree(group, detail::attempt([&] {
                  if (mesh.my_rank() == 0) image = detail::write_undo(file, updates, undo);
                }));
  try {
    detail::write_rows(group, file, updates);
    detail::agree(group, detail::attempt([&] {
                    if (mesh.my_rank() == 0) detail::mark_undo_written(file, updates, *image, undo);
                  }));
  } catch (const error& e) {
    undo_in_place(mesh, undo);
    throw error(fmt::format("{} (the rows were restored from '{}')", e.what(), undo.string()));
  }
}

}  // namespace kshard::io
