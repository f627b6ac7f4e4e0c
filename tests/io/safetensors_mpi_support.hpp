#pragma once

// What the MPI tests of kshard::io share: a scratch folder every rank sees, whole files read
// and written, and a small checkpoint image built serially.

#include <mpi.h>

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kshard/comm/agreement.hpp"
#include "kshard/io/safetensors.hpp"
#include "kshard_test.hpp"

namespace kshard_io_mpi_test {

namespace fs = std::filesystem;
namespace io = kshard::io;
using kshard::index_t;
using kshard::test::ExecSpace;
using kshard::test::MemSpace;

// The marker each temporary file starts with until its length prefix replaces it.
inline constexpr std::int64_t marker_bytes = kshard::detail::temporary_marker.size();

// A folder shared by the ranks (rank 0's name), emptied at the start and removed at the end.
class Scratch {
 public:
  Scratch() {
    int id = static_cast<int>(::getpid());
    MPI_Bcast(&id, 1, MPI_INT, 0, MPI_COMM_WORLD);
    folder_ = fs::temp_directory_path() / ("kshard_io_mpi_" + std::to_string(id));
    if (kshard::test::world_rank() == 0) {
      fs::remove_all(folder_);
      fs::create_directories(folder_);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  ~Scratch() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (kshard::test::world_rank() == 0) fs::remove_all(folder_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  [[nodiscard]] fs::path operator/(const std::string& name) const { return folder_ / name; }

 private:
  fs::path folder_;
};

inline std::vector<std::byte> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(text.size());
  if (!text.empty()) std::memcpy(bytes.data(), text.data(), text.size());
  return bytes;
}

// Rank 0 writes `bytes` to `path`; everyone waits for it.
inline void write_file(const fs::path& path, const std::vector<std::byte>& bytes) {
  if (kshard::test::world_rank() == 0) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// FNV-1a of every regular file (not links) under `folder`, by path: any byte changed, file
// added or removed shows. Rank 0 looks; every rank gets its digest of the map.
inline std::int64_t folder_digest(const fs::path& folder) {
  std::int64_t digest = 0;
  if (kshard::test::world_rank() == 0) {
    std::map<std::string, std::vector<std::byte>> files;
    for (const auto& entry : fs::recursive_directory_iterator(folder))
      if (entry.is_regular_file() && !entry.is_symlink())
        files[entry.path().string()] = read_file(entry.path());
    kshard::detail::Digest d;
    for (const auto& [path, bytes] : files)
      d.add(path).add(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
    digest = d.value();
  }
  MPI_Bcast(&digest, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  return digest;
}

// True on this rank when the rows of `matrix` that `chosen(id)` picks hold those of the
// row-major tensor `full` of `cols` columns and every other element is still zero bits.
template <class M, class Chosen>
bool holds_rows(const M& matrix, const std::vector<std::byte>& full, std::int64_t cols,
                Chosen&& chosen) {
  using T = typename M::value_type;
  const auto local = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), matrix.local());
  const auto& map = matrix.mapping();
  const std::vector<std::byte> zero(sizeof(T));
  bool same = true;
  for (index_t i = 0; i < map.rows.local_extent(); ++i) {
    const index_t id = map.rows.to_global(i);
    const bool picked = chosen(id);
    for (index_t j = 0; j < map.cols.local_extent(); ++j) {
      const auto at = static_cast<std::size_t>(id * cols + map.cols.to_global(j)) * sizeof(T);
      same = same &&
             std::memcmp(&local(i, j), picked ? full.data() + at : zero.data(), sizeof(T)) == 0;
    }
  }
  return same;
}

// True on this rank when `matrix` holds the row-major tensor `full` of `cols` columns where its
// mapping says.
template <class M>
bool holds_all(const M& matrix, const std::vector<std::byte>& full, std::int64_t cols) {
  return holds_rows(matrix, full, cols, [](index_t) { return true; });
}

// True on this rank when rows `ids` of `matrix` hold those of `full` (as `holds_rows`) and
// every other element is still zero bits.
template <class M>
bool holds_only_rows(const M& matrix, const std::vector<std::byte>& full, std::int64_t cols,
                     const std::vector<index_t>& ids) {
  return holds_rows(matrix, full, cols, [&ids](index_t id) {
    return std::find(ids.begin(), ids.end(), id) != ids.end();
  });
}

template <class T>
std::vector<std::byte> bytes_of(const kshard::HostMatrix<T>& m) {
  std::vector<std::byte> bytes(m.span() * sizeof(T));
  if (!bytes.empty()) std::memcpy(bytes.data(), m.data(), bytes.size());
  return bytes;
}

// A file image: a 3-byte U8 tensor first (so "weight" starts at an odd offset: the data
// section is never assumed aligned), then `weight`, a 1-D F64 tensor "after" and a 2 x 2
// "twin" of weight's dtype.
template <class T>
std::vector<std::byte> checkpoint_image(const kshard::HostMatrix<T>& weight) {
  const std::vector<io::TensorSpec> specs{
      {"odd", io::Dtype::U8, {3}},
      {"weight",
       io::dtype_of<T>(),
       {static_cast<std::int64_t>(weight.extent(0)), static_cast<std::int64_t>(weight.extent(1))}},
      {"after", io::Dtype::F64, {4}},
      {"twin", io::dtype_of<T>(), {2, 2}}};
  const auto header = io::make_safetensors_header(specs, {{"format", "pt"}});
  std::vector<std::byte> file = io::serialize_safetensors_header(header);
  for (int i = 0; i < 3; ++i) file.push_back(static_cast<std::byte>(0xa0 + i));
  const auto weight_bytes = bytes_of(weight);
  file.insert(file.end(), weight_bytes.begin(), weight_bytes.end());
  for (std::size_t i = 0; i < 32 + 4 * sizeof(T); ++i)
    file.push_back(static_cast<std::byte>(i * 7));
  return file;
}

}  // namespace kshard_io_mpi_test
