#pragma once

/// \file
/// `io::verify_checksums`: reads every byte range whose checksum a checkpoint records (a PyTorch
/// DCP folder records the CRC-32 of each piece's torch.save entry) and compares, the ranks
/// sharing the ranges. Opening a checkpoint checks its structure, not its bytes; this is the
/// `--verify` of the commands.

#include <fcntl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kshard/comm/agreement.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/io/checkpoint.hpp"
#include "kshard/io/engine/collective.hpp"
#include "kshard/io/engine/posix.hpp"
#include "kshard/io/torch/zip.hpp"
#include "kshard/mesh.hpp"

namespace kshard::detail {

// The checksums of `all` rank `rank` of `ranks` checks: a contiguous run of them, cut so that
// each rank reads about as many bytes.
inline std::span<const io::StoredChecksum> checksum_share(std::span<const io::StoredChecksum> all,
                                                          int rank, int ranks) {
  std::uint64_t total = 0;
  for (const io::StoredChecksum& c : all) total += c.bytes;
  const auto owner = [&](std::uint64_t before) {  // the rank whose share holds byte `before`
    if (total == 0) return 0;
    const long double place = static_cast<long double>(before) / static_cast<long double>(total);
    return std::min(ranks - 1, static_cast<int>(place * ranks));
  };
  std::size_t begin = all.size(), end = all.size();
  std::uint64_t before = 0;
  for (std::size_t i = 0; i < all.size(); before += all[i].bytes, ++i) {
    const int r = owner(before);
    if (r == rank && begin == all.size()) begin = i;
    if (r > rank) {
      end = i;
      break;
    }
  }
  return begin >= end ? std::span<const io::StoredChecksum>{} : all.subspan(begin, end - begin);
}

// Why the range `checksum` of `file` does not have its recorded CRC-32, or nothing.
inline std::optional<std::string> checksum_problem(const io::DataFile& file,
                                                   const io::StoredChecksum& checksum,
                                                   std::vector<char>& buffer) {
  const ScopedFd fd(open_or_throw(file.path, O_RDONLY | O_CLOEXEC));
  std::uint32_t crc = 0;
  for (std::uint64_t done = 0; done < checksum.bytes;) {
    const std::uint64_t n = std::min<std::uint64_t>(buffer.size(), checksum.bytes - done);
    throw_if(pread_exactly(fd.get(), buffer.data(), n, checksum.offset + done, file.path.string()));
    crc = zip_crc32(std::as_bytes(std::span(buffer.data(), static_cast<std::size_t>(n))), crc);
    done += n;
  }
  if (crc == checksum.crc32) return std::nullopt;
  return fmt::format(
      "kshard::io: {} (bytes {}..{} of '{}') has CRC-32 {}, but its archive records {}: the file "
      "is damaged",
      checksum.name, checksum.offset, checksum.offset + checksum.bytes, file.path.string(),
      zip_hex(crc), zip_hex(checksum.crc32));
}

}  // namespace kshard::detail

namespace kshard::io {

/// Reads every byte range whose checksum `model` records (`Checkpoint::checksums()`: a PyTorch
/// DCP folder's piece entries) and compares its CRC-32, each rank an equal share of the bytes;
/// returns how many ranges were checked (the same on every rank; 0 for safetensors, which
/// records none). Collective over `mesh`. Every rank throws the same `kshard::error`, naming
/// the range, the file and both CRCs, for a range that differs (the first one found), a file
/// that cannot be read, or a checkpoint path that differs between ranks. Cost: one read of the
/// checksummed bytes in all (1/P per rank, through a 4 MiB buffer), one agreement.
template <std::size_t N>
std::size_t verify_checksums(const Mesh<N>& mesh, const Checkpoint& model) {
  const detail::Operation operation("io::verify_checksums");
  detail::Agreement agreement(mesh.group());
  detail::same_text(agreement, "the checkpoint path", model.path().string());
  agreement.settle();
  std::optional<std::string> mismatch;
  const auto share = detail::checksum_share(model.checksums(), mesh.my_rank(), mesh.size());
  const std::optional<std::string> failure = detail::attempt([&] {
    std::vector<char> buffer(std::size_t{4} << 20);
    for (const StoredChecksum& checksum : share)
      if (!mismatch)
        mismatch = detail::checksum_problem(model.data_files()[checksum.file], checksum, buffer);
  });
  detail::agree(mesh.group(), failure ? failure : mismatch);
  return model.checksums().size();
}

}  // namespace kshard::io
