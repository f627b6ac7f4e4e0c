// Checkpoint I/O against the plain POSIX alternative, in the same run: reading an embedding's
// shards with kshard::io::read_matrix (collective MPI-IO) against a pread loop over the same
// page-cached bytes, for row and column shards; and the bytes an in-place repair writes.

#include <kshard/io/safetensors.hpp>
#include <kshard/kshard.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <string>
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

// The baseline: this rank's shard read with pread, one call per contiguous run of bytes, into
// a buffer of the shard's size (what a hand-written reader does).
template <class M>
void pread_shard(const fs::path& path, std::uint64_t data_offset, const M& matrix,
                 std::vector<float>& buffer) {
  const auto& map = matrix.mapping();
  const index_t cols = map.cols.global_extent();
  const int fd = ::open(path.c_str(), O_RDONLY);
  float* out = buffer.data();
  const auto col_runs = map.cols.runs();
  for (const kshard::IndexRun& rows : map.rows.runs()) {
    const bool whole_rows = col_runs.size() == 1 && col_runs[0].size == cols;
    if (whole_rows) {  // the rows are one contiguous stretch of the file
      const auto bytes = static_cast<std::size_t>(rows.size * cols) * sizeof(float);
      if (::pread(fd, out, bytes, static_cast<off_t>(data_offset + rows.global_begin * cols * 4)) !=
          static_cast<ssize_t>(bytes))
        throw kshard::error("bench: short pread");
      out += rows.size * cols;
      continue;
    }
    for (index_t r = rows.global_begin; r < rows.global_end(); ++r)
      for (const kshard::IndexRun& c : col_runs) {
        const auto bytes = static_cast<std::size_t>(c.size) * sizeof(float);
        if (::pread(fd, out, bytes,
                    static_cast<off_t>(data_offset + (r * cols + c.global_begin) * 4)) !=
            static_cast<ssize_t>(bytes))
          throw kshard::error("bench: short pread");
        out += c.size;
      }
  }
  ::close(fd);
}

template <class L>
void read_case(kshard::bench::Report& report, const kshard::Mesh<1>& mesh, const L& layout,
               const char* name, const fs::path& path, index_t rows, index_t cols,
               const kshard::bench::Options& options) {
  const io::SafetensorsFile file(mesh, path);
  const auto matrix = io::read_matrix<float>(file, "embed", mesh, layout);
  std::vector<float> buffer(static_cast<std::size_t>(matrix.local().span()));
  // Both read into memory they already hold (read_matrix adds the allocation of a fresh shard).
  const auto timed = kshard::bench::time_paired(
      mesh.comm(), options.repetitions, [&] { io::read_into(file, "embed", matrix); },
      [&] { pread_shard(path, file.header().data_offset, matrix, buffer); });
  const auto local = matrix.local();
  if (std::memcmp(local.data(), buffer.data(), buffer.size() * sizeof(float)) != 0)
    throw kshard::error("bench: read_matrix and pread disagree");
  report.add(name, fmt::format(R"("rows": {}, "cols": {}, "seconds": {:.6g}, "baseline": {:.6g}, )"
                               R"("ratio": {:.4g}, "gbps": {:.4g})",
                               rows, cols, timed.seconds, timed.baseline, timed.ratio,
                               static_cast<double>(rows * cols * 4) / timed.seconds / 1e9));
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
        read_case(report, mesh, kshard::Layout(kshard::Shard<0>{}), "read_rows_vs_pread", path,
                  rows, cols, options);
        read_case(report, mesh, kshard::Layout(kshard::Shard<1>{}), "read_cols_vs_pread", path,
                  rows, cols, options);
        in_place_case(report, mesh, path, rows, cols, 256);
        MPI_Barrier(MPI_COMM_WORLD);
        if (mesh.my_rank() == 0) fs::remove(path);
      });
}
