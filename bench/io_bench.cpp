// Checkpoint I/O against the plain POSIX alternative, in the same run: reading an embedding's
// shards with kshard::io::read_into against a pread loop over the same page-cached bytes, for
// row and column shards, from a safetensors file and from the PyTorch DCP of a 4-rank job
// holding it (issue 40, item 7); and the bytes an in-place repair writes.

#include <kshard/io/convert.hpp>
#include <kshard/io/read_checkpoint.hpp>
#include <kshard/io/safetensors.hpp>
#include <kshard/kshard.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <type_traits>
#include <vector>

#include "harness.hpp"

namespace {

namespace io = kshard::io;
namespace fs = std::filesystem;
using kshard::index_t;

// Rank 0 writes a checkpoint holding one rows x cols F32 tensor "embed"; every rank waits.
fs::path make_checkpoint(index_t rows, index_t cols) {
  int id = static_cast<int>(::getpid());
  MPI_Bcast(&id, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const fs::path path = fs::temp_directory_path() / fmt::format("kshard_io_bench_{}", id);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    const std::vector<io::TensorSpec> specs{{"embed", io::Dtype::F32, {rows, cols}}};
    const auto header = io::serialize_safetensors_header(io::make_safetensors_header(specs));
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(header.data()),
              static_cast<std::streamsize>(header.size()));
    std::vector<float> row(static_cast<std::size_t>(cols));
    for (index_t r = 0; r < rows; ++r) {
      for (index_t c = 0; c < cols; ++c)
        row[static_cast<std::size_t>(c)] = 0.001f * static_cast<float>((r * 31 + c) % 997);
      out.write(reinterpret_cast<const char*>(row.data()),
                static_cast<std::streamsize>(row.size() * sizeof(float)));
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return path;
}

// Where the bytes of global row `r` lie: the file, the offset, and how many rows from it on
// follow it contiguously there.
struct RowPlace {
  int fd = -1;
  std::uint64_t offset = 0;
  index_t rows_after = 0;
};

// The baseline: this rank's shard read with pread, one call per contiguous run of bytes, into
// a buffer of the shard's size (what a hand-written reader does); `place(r)` says where row r
// lies.
template <class M, class Place>
void pread_shard(const M& matrix, std::vector<float>& buffer, const Place& place) {
  const auto& map = matrix.mapping();
  const index_t cols = map.cols.global_extent();
  float* out = buffer.data();
  const auto read = [&](const RowPlace& at, std::uint64_t skip, std::size_t count) {
    const auto bytes = count * sizeof(float);
    if (::pread(at.fd, out, bytes, static_cast<off_t>(at.offset + skip)) !=
        static_cast<ssize_t>(bytes))
      throw kshard::error("bench: short pread");
    out += count;
  };
  const auto col_runs = map.cols.runs();
  const bool whole_rows = col_runs.size() == 1 && col_runs[0].size == cols;
  for (const kshard::IndexRun& rows : map.rows.runs())
    for (index_t r = rows.global_begin; r < rows.global_end();) {
      const RowPlace at = place(r);
      if (whole_rows) {  // the rows to the end of the run or the piece are one stretch
        const index_t n = std::min(at.rows_after, rows.global_end() - r);
        read(at, 0, static_cast<std::size_t>(n * cols));
        r += n;
        continue;
      }
      for (const kshard::IndexRun& c : col_runs)
        read(at, static_cast<std::uint64_t>(c.global_begin) * 4, static_cast<std::size_t>(c.size));
      ++r;
    }
}

// One read of "embed" into `layout` from `model` by io::read_into against pread_shard, the
// same bytes landing in each. On a GPU build the matrix is in device memory, which kshard
// reaches through a host staging buffer; the baseline is then the pread into host memory plus
// one host-to-device copy.
template <class L, class Place>
void read_case(kshard::bench::Report& report, const kshard::Mesh<1>& mesh, const L& layout,
               const char* name, const io::Checkpoint& model, index_t rows, index_t cols,
               const kshard::bench::Options& options, const Place& place) {
  const auto matrix = io::read_matrix<float>(model, "embed", mesh, layout);
  using Local = std::remove_cvref_t<decltype(matrix.local())>;
  constexpr bool on_host =
      Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Local::memory_space>::accessible;
  const std::size_t local_rows = matrix.local().extent(0), local_cols = matrix.local().extent(1);
  std::vector<float> buffer(local_rows * local_cols);
  const Local landing(std::string("landing"), on_host ? 0 : local_rows, on_host ? 0 : local_cols);
  const auto baseline = [&] {
    pread_shard(matrix, buffer, place);
    if constexpr (!on_host)
      Kokkos::deep_copy(landing,
                        Kokkos::View<const float**, Kokkos::LayoutRight, Kokkos::HostSpace>(
                            buffer.data(), local_rows, local_cols));
  };
  // Both read into memory they already hold (read_matrix adds the allocation of a fresh shard).
  const auto timed = kshard::bench::time_paired(
      mesh.comm(), options.repetitions,
      [&] {
        io::read_into(model, "embed", matrix);
        Kokkos::fence();
      },
      baseline);
  const auto local = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), matrix.local());
  if (std::memcmp(local.data(), buffer.data(), buffer.size() * sizeof(float)) != 0)
    throw kshard::error("bench: read_matrix and pread disagree");
  report.add(name, fmt::format(R"("rows": {}, "cols": {}, "seconds": {:.6g}, "baseline": {:.6g}, )"
                               R"("ratio": {:.4g}, "gbps": {:.4g})",
                               rows, cols, timed.seconds, timed.baseline, timed.ratio,
                               static_cast<double>(rows * cols * 4) / timed.seconds / 1e9));
}

// The rows and columns cases on `model`, whose rows `place` finds.
template <class Place>
void read_cases(kshard::bench::Report& report, const kshard::Mesh<1>& mesh,
                const io::Checkpoint& model, const std::string& prefix, index_t rows, index_t cols,
                const kshard::bench::Options& options, const Place& place) {
  read_case(report, mesh, kshard::Layout(kshard::Shard<0>{}), (prefix + "rows_vs_pread").c_str(),
            model, rows, cols, options, place);
  read_case(report, mesh, kshard::Layout(kshard::Shard<1>{}), (prefix + "cols_vs_pread").c_str(),
            model, rows, cols, options, place);
}

// The safetensors file at `path` read both ways.
void file_cases(kshard::bench::Report& report, const kshard::Mesh<1>& mesh, const fs::path& path,
                index_t rows, index_t cols, const kshard::bench::Options& options) {
  const io::Checkpoint model(mesh, path);
  const io::SafetensorsFile& file = model.file_of("embed");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  read_cases(report, mesh, model, "read_", rows, cols, options, [&](index_t r) {
    return RowPlace{fd, file.header().data_offset + static_cast<std::uint64_t>(r * cols) * 4,
                    rows - r};
  });
  ::close(fd);
}

// The file at `path` written as the PyTorch DCP of a 4-rank Shard(0) job, read both ways: the
// baseline preads from each piece's storage in its .distcp file.
void dcp_cases(kshard::bench::Report& report, const kshard::Mesh<1>& mesh, const fs::path& path,
               index_t rows, index_t cols, const kshard::bench::Options& options) {
  const fs::path folder = path.string() + ".dcp";
  io::ConvertOptions dcp;
  dcp.form = io::OutputForm::dcp;
  dcp.sharding.mesh = {4};
  dcp.sharding.layout = kshard::parse_layout("Shard(0)");
  io::convert_checkpoint(mesh, io::Checkpoint(mesh, path), folder, dcp);
  const io::Checkpoint model(mesh, folder);
  std::vector<int> fds;
  for (const auto& file : model.data_files())
    fds.push_back(::open(file.path.c_str(), O_RDONLY | O_CLOEXEC));
  const auto& pieces = model.tensor("embed").pieces;  // sorted by their first row
  read_cases(report, mesh, model, "read_dcp_", rows, cols, options, [&](index_t r) {
    const auto piece = std::find_if(pieces.rbegin(), pieces.rend(),
                                    [&](const io::StoredPiece& p) { return p.offsets[0] <= r; });
    const index_t into = r - piece->offsets[0];
    return RowPlace{fds[piece->file],
                    piece->file_offset + static_cast<std::uint64_t>(into * cols) * 4,
                    piece->shape[0] - into};
  });
  for (const int fd : fds) ::close(fd);
  MPI_Barrier(MPI_COMM_WORLD);
  if (mesh.my_rank() == 0) fs::remove_all(folder);
}

// An in-place write of `count` rows: the bytes every rank writes, summed, must be those rows
// plus the undo file.
void in_place_case(kshard::bench::Report& report, const kshard::Mesh<1>& mesh, const fs::path& path,
                   index_t rows, index_t cols, index_t count) {
  const io::SafetensorsFile file(mesh, path);
  const kshard::Layout layout(kshard::Shard<0>{});
  const auto matrix = io::read_matrix<float>(file, "embed", mesh, layout);
  std::vector<index_t> ids;
  for (index_t k = 0; k < count; ++k) ids.push_back(k * (rows / count));
  const fs::path undo = path.string() + ".undo";
  io::reset_io_stats();
  io::write_rows_in_place(mesh, file, {io::replace_rows("embed", matrix, ids)}, undo);
  std::int64_t written = io::io_stats().bytes_written;
  MPI_Allreduce(MPI_IN_PLACE, &written, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  std::int64_t undo_bytes =
      mesh.my_rank() == 0 ? static_cast<std::int64_t>(fs::file_size(undo)) : 0;
  MPI_Bcast(&undo_bytes, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  const std::int64_t rows_bytes = count * cols * 4;
  // Besides the rows and the undo file: its temporary's marker and the header bytes its state
  // change rewrites once the rows are written (undo format 2), a few dozen bytes.
  const std::int64_t bookkeeping = written - rows_bytes - undo_bytes;
  if (bookkeeping < 0 || bookkeeping > 4096)
    throw kshard::error(
        fmt::format("bench: the in-place write wrote {} bytes, not {} + {} and at most 4096 more",
                    written, rows_bytes, undo_bytes));
  io::undo_in_place(mesh, undo);
  report.add("in_place_write_bytes",
             fmt::format(R"("rows": {}, "cols": {}, "repaired_rows": {}, "bytes_written": {}, )"
                         R"("row_bytes": {}, "undo_bytes": {}, "file_bytes": {})",
                         rows, cols, count, written, rows_bytes, undo_bytes, file.file_size()));
}

}  // namespace

int main(int argc, char** argv) {
  return kshard::bench::run_main(
      argc, argv, "io", [](kshard::bench::Report& report, const kshard::bench::Options& options) {
        int size = 0;
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        const kshard::Mesh<1> mesh(MPI_COMM_WORLD, {size});
        // all-MiniLM-L6-v2's embedding: 30522 x 384 F32 (46.9 MB).
        const index_t rows = options.quick ? 4096 : 30522;
        const index_t cols = 384;
        const fs::path path = make_checkpoint(rows, cols);
        file_cases(report, mesh, path, rows, cols, options);
        dcp_cases(report, mesh, path, rows, cols, options);
        in_place_case(report, mesh, path, rows, cols, 256);
        MPI_Barrier(MPI_COMM_WORLD);
        if (mesh.my_rank() == 0) fs::remove(path);
      });
}
