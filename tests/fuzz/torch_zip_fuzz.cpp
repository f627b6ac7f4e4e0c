// libFuzzer target for the stored ZIP archives (torch.save) inside PyTorch DCP `.distcp` files
// (kshard/io/torch/zip.hpp). The input is an archive. It is read as a caller reads it: the
// tail, then the directory (from the tail, or read on its own when a short tail misses it), then
// each entry's local header. Any failure must be a kshard::error; an accepted archive's entries
// must lie inside it without overlapping each other or the directory, and writing them again
// with zip_layout must read back the same.
//
// Build with clang (see CMakeLists.txt) and run, e.g.:
//   torch_zip_fuzz -max_total_time=90 -max_len=65536 -dict=torch_zip.dict DIR torch_zip_corpus

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "kshard/error.hpp"
#include "kshard/io/torch/zip.hpp"

namespace {

namespace kd = kshard::detail;
using Bytes = std::span<const std::byte>;

void require(bool condition) {
  if (!condition) std::abort();
}

// The archive read with the last `tail_size` bytes first, as the caller of zip.hpp reads it.
kd::ZipListing read_as_caller(Bytes archive, std::size_t tail_size) {
  const Bytes tail = archive.last(tail_size);
  const kd::ZipDirectory directory = kd::find_zip_directory(tail, archive.size(), "fuzz");
  require(directory.offset <= archive.size() &&
          directory.size <= archive.size() - directory.offset);
  const auto in_tail = kd::zip_directory_in_tail(tail, archive.size(), directory);
  kd::ZipListing listing = kd::parse_zip_directory(
      in_tail ? *in_tail : archive.subspan(directory.offset, directory.size), directory, "fuzz");
  for (kd::ZipEntry& entry : listing.entries) {
    require(entry.header_offset + kd::zip_local_header_bytes(entry) <= directory.offset);
    entry.data_offset = kd::zip_data_offset(
        entry, archive.subspan(entry.header_offset, kd::zip_local_header_bytes(entry)), "fuzz");
  }
  // Every entry, from its local header to its data's end, before the next one and the directory.
  std::vector<kd::ZipEntry> sorted = listing.entries;
  std::sort(sorted.begin(), sorted.end(), [](const kd::ZipEntry& a, const kd::ZipEntry& b) {
    return a.header_offset < b.header_offset;
  });
  std::uint64_t free_from = 0;
  for (const kd::ZipEntry& entry : sorted) {
    require(entry.header_offset >= free_from && entry.data_offset >= entry.header_offset);
    require(entry.data_offset + entry.size <= directory.offset);
    free_from = entry.data_offset + entry.size;
  }
  require(kd::zip_entry(listing, listing.entries.front().name.substr(listing.prefix.size()), "fuzz")
              .name == listing.entries.front().name);
  return listing;
}

// The entries of `listing` written again by zip_layout, with their data copied from `archive`.
std::vector<std::byte> rewritten(Bytes archive, const kd::ZipListing& listing) {
  std::vector<kd::ZipEntrySpec> specs;
  for (const kd::ZipEntry& entry : listing.entries)
    specs.push_back({entry.name, entry.size, entry.crc32});
  const kd::ZipLayout layout = kd::zip_layout(specs);
  std::vector<std::byte> out(layout.length);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const kd::ZipPlacement& placement = layout.entries[i];
    std::copy(placement.header.begin(), placement.header.end(),
              out.begin() + placement.header_offset);
    const Bytes data = archive.subspan(listing.entries[i].data_offset, specs[i].size);
    std::copy(data.begin(), data.end(), out.begin() + placement.data_offset);
  }
  std::copy(layout.trailer.begin(), layout.trailer.end(), out.begin() + layout.trailer_offset);
  return out;
}

void check(Bytes archive) {
  const kd::ZipListing listing = read_as_caller(archive, kd::zip_tail_bytes(archive.size()));
  // A tail of only the end records, which misses the directory, must read the same.
  const kd::ZipDirectory directory = kd::find_zip_directory(archive, archive.size(), "fuzz");
  const kd::ZipListing again =
      read_as_caller(archive, archive.size() - directory.offset - directory.size);
  require(again.entries.size() == listing.entries.size() && again.prefix == listing.prefix);
  for (const kd::ZipEntry& entry : listing.entries) {
    const Bytes data = archive.subspan(entry.data_offset, entry.size);
    try {
      kd::check_zip_crc(entry, kd::zip_crc32(data), "fuzz");
    } catch (const kshard::error&) {
    }
  }
  const std::vector<std::byte> copy = rewritten(archive, listing);
  const kd::ZipListing read_back = kd::parse_zip(copy, "rewritten");
  require(read_back.entries.size() == listing.entries.size());
  for (std::size_t i = 0; i < listing.entries.size(); ++i) {
    const kd::ZipEntry &a = listing.entries[i], &b = read_back.entries[i];
    require(a.name == b.name && a.size == b.size && a.crc32 == b.crc32);
    require(b.data_offset % kd::zip_data_alignment == 0);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    check(std::as_bytes(std::span(data, size)));
  } catch (const kshard::error&) {
    // A refusal: fine. Any other exception escapes and libFuzzer reports it.
  }
  return 0;
}
