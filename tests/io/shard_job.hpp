#pragma once

// A training job's checkpoint built serially for the MPI tests: whole tensors of several ranks
// and dtypes with distinct bytes, the per-rank shard files a 4-rank job writes of them (pieces
// cut by torch.chunk's arithmetic, written out here rather than taken from kshard's mapping, and
// DCP_SHARDING_INFO as torch writes it), and the consolidated file they make.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "safetensors_mpi_support.hpp"

namespace kshard_io_mpi_test {

using Offsets = std::vector<std::int64_t>;

// torch.chunk's piece `r` of `n` items over `k` ranks: (start, size), start = n for an empty
// piece (torch records it so).
inline std::pair<std::int64_t, std::int64_t> chunk(std::int64_t n, std::int64_t k, std::int64_t r) {
  const std::int64_t c = (n + k - 1) / k;
  const std::int64_t start = std::min(n, c * r);
  return {start, std::max<std::int64_t>(0, std::min(n, start + c) - start)};
}

// A whole tensor: dtype, shape, row-major bytes.
struct Tensor {
  io::Dtype dtype;
  Offsets shape;
  std::vector<std::byte> bytes;
};

// One piece of one tensor in a shard file.
struct Piece {
  std::string name;
  io::Dtype dtype;
  Offsets offsets;
  Offsets shape;
  std::vector<std::byte> bytes;
};

inline std::int64_t volume(const Offsets& shape) {
  std::int64_t v = 1;
  for (const auto s : shape) v *= s;
  return v;
}

// The box [offsets, offsets + shape) of `whole`, as a piece (an odometer over the box).
inline Piece slice(const std::string& name, const Tensor& whole, const Offsets& offsets,
                   const Offsets& shape) {
  Piece piece{name, whole.dtype, offsets, shape, {}};
  const std::size_t element = kshard::detail::dtype_info(whole.dtype).size;
  if (volume(shape) == 0) return piece;
  Offsets index(shape.size(), 0);
  while (true) {
    std::int64_t linear = 0;
    for (std::size_t d = 0; d < shape.size(); ++d)
      linear = linear * whole.shape[d] + offsets[d] + index[d];
    const auto* at = whole.bytes.data() + linear * static_cast<std::int64_t>(element);
    piece.bytes.insert(piece.bytes.end(), at, at + element);
    std::size_t d = shape.size();
    while (d > 0 && ++index[d - 1] == shape[d - 1]) index[--d] = 0;
    if (d == 0) return piece;
  }
}

// A tensor of `shape` and `dtype` whose bytes are distinct and rank-independent.
inline Tensor make_tensor(io::Dtype dtype, Offsets shape, std::uint8_t salt) {
  Tensor t{dtype, std::move(shape), {}};
  const auto n =
      volume(t.shape) * static_cast<std::int64_t>(kshard::detail::dtype_info(dtype).size);
  for (std::int64_t i = 0; i < n; ++i)
    t.bytes.push_back(static_cast<std::byte>(
        dtype == io::Dtype::BOOL ? (i * 7 + salt) % 3 == 0 : (i * 31 + salt * 17) % 251));
  return t;
}

// A shard file holding `pieces`, its DCP_SHARDING_INFO `info` (by default the pieces' offsets,
// as torch writes it).
inline std::vector<std::byte> shard_file(const std::vector<Piece>& pieces,
                                         std::optional<std::string> info = std::nullopt) {
  std::vector<io::TensorSpec> specs;
  std::vector<std::string> entries;
  for (const Piece& p : pieces) {
    specs.push_back({p.name, p.dtype, p.shape});
    entries.push_back(
        fmt::format("\"{}\": {{\"saved_offsets\": [{}]}}", p.name, fmt::join(p.offsets, ", ")));
  }
  if (!info) info = fmt::format("{{{}}}", fmt::join(entries, ", "));
  const auto header = io::make_safetensors_header(
      specs, {{"DCP_SHARDING_INFO", *info}, {"DCP_VERSION", "1.0"}, {"format", "pt"}});
  std::vector<std::byte> file = io::serialize_safetensors_header(header);
  for (const Piece& p : pieces) file.insert(file.end(), p.bytes.begin(), p.bytes.end());
  return file;
}

inline std::string shard_name(int r) {
  return fmt::format("shard-{:05}-model-00001-of-00001.safetensors", r + 1);
}

// The consolidated file of `tensors`: whole tensors in name order, {"format": "pt"}.
inline std::vector<std::byte> consolidated_file(const std::map<std::string, Tensor>& tensors) {
  std::vector<io::TensorSpec> specs;
  for (const auto& [name, t] : tensors) specs.push_back({name, t.dtype, t.shape});
  auto file =
      io::serialize_safetensors_header(io::make_safetensors_header(specs, {{"format", "pt"}}));
  for (const auto& [name, t] : tensors) file.insert(file.end(), t.bytes.begin(), t.bytes.end());
  return file;
}

// What a 4-rank job writes: "embed" (37 x 8 F32) by rows (FSDP: 10, 10, 10, 7), "proj" (9 x 10
// F32) by columns (TP: 3, 3, 3, 1), "grid" (7 x 6 F64) on a (2, 2) mesh by rows then columns,
// "norm" (5 F32, replicated: in file 1 only), "experts" (3 x 2 x 2 BF16 by dimension 0: file 3's
// piece is empty, at offset 3), "steps" (10 I64 by rows), "mask" (6 x 2 BOOL, replicated: file
// 2), "scale" (a 0-d F16, file 0), "codes" (4 x 3 F8_E4M3 by columns: 1, 1, 1, 0).
struct JobCheckpoint {
  std::map<std::string, Tensor> tensors{{"embed", make_tensor(io::Dtype::F32, {37, 8}, 1)},
                                        {"proj", make_tensor(io::Dtype::F32, {9, 10}, 2)},
                                        {"grid", make_tensor(io::Dtype::F64, {7, 6}, 3)},
                                        {"norm", make_tensor(io::Dtype::F32, {5}, 4)},
                                        {"experts", make_tensor(io::Dtype::BF16, {3, 2, 2}, 5)},
                                        {"steps", make_tensor(io::Dtype::I64, {10}, 6)},
                                        {"mask", make_tensor(io::Dtype::BOOL, {6, 2}, 7)},
                                        {"scale", make_tensor(io::Dtype::F16, {}, 8)},
                                        {"codes", make_tensor(io::Dtype::F8_E4M3, {4, 3}, 9)}};

  // The box file `r` holds of tensor `name`, or nothing.
  std::optional<std::pair<Offsets, Offsets>> box(const std::string& name, int r) const {
    const Offsets& s = tensors.at(name).shape;
    const auto rows = [&](std::int64_t k, std::int64_t c) {
      const auto [start, size] = chunk(s[0], k, c);
      Offsets offsets(s.size(), 0), shape = s;
      offsets[0] = start;
      shape[0] = size;
      return std::pair(offsets, shape);
    };
    const auto cols = [&](std::int64_t k, std::int64_t c) {
      const auto [start, size] = chunk(s[1], k, c);
      return std::pair(Offsets{0, start}, Offsets{s[0], size});
    };
    if (name == "embed" || name == "experts" || name == "steps") return rows(4, r);
    if (name == "proj" || name == "codes") return cols(4, r);
    if (name == "grid") {
      const auto [g0, gn] = chunk(s[0], 2, r / 2);
      const auto [h0, hn] = chunk(s[1], 2, r % 2);
      return std::pair(Offsets{g0, h0}, Offsets{gn, hn});
    }
    const int holder = name == "norm" ? 1 : name == "mask" ? 2 : 0;
    if (r != holder) return std::nullopt;
    return std::pair(Offsets(s.size(), 0), s);
  }

  std::vector<std::vector<Piece>> files() const {
    std::vector<std::vector<Piece>> files(4);
    for (int r = 0; r < 4; ++r)
      for (const auto& [name, whole] : tensors)
        if (const auto b = box(name, r))
          files[r].push_back(slice(name, whole, b->first, b->second));
    return files;
  }

  void write(const fs::path& folder) const {
    if (kshard::test::world_rank() == 0) fs::create_directories(folder);
    const auto all = files();
    for (int r = 0; r < 4; ++r) write_file(folder / shard_name(r), shard_file(all[r]));
  }
};

}  // namespace kshard_io_mpi_test
