#pragma once

// The ZIP archives torch.save writes, as PyTorch DCP embeds them in `.distcp` files: entries
// stored uncompressed, data 64-byte aligned from the archive's start by an "FB" local extra field,
// ZIP64 end records. Pure parsing and layout, no file I/O: the caller reads and writes the bytes
// (MPI-IO or pread), and the fuzzer runs it as it is.
//
// Reading an archive of `length` bytes (offsets are from the archive's first byte):
//   1. read the last zip_tail_bytes(length) bytes; find_zip_directory(tail, length, ...);
//   2. zip_directory_in_tail(...) or, when it lies before the tail, read exactly the directory's
//      bytes; parse_zip_directory(...);
//   3. for each entry needed (zip_entry(listing, "data.pkl"), "data/0"), read
//      zip_local_header_bytes(entry) bytes at entry.header_offset;
//      entry.data_offset = zip_data_offset(entry, local, ...);
//   4. read entry.size bytes at entry.data_offset; check_zip_crc(...) for --verify.
// Writing: zip_layout() places each entry's header and data and the trailer; torch_archive()
// gives the whole of a torch.save archive but one tensor's bytes.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "kshard/io/engine/crc32.hpp"
#include "kshard/io/model/dtype.hpp"
#include "kshard/io/model/messages.hpp"

namespace kshard::detail {

// Record sizes and signatures (APPNOTE.TXT 4.3).
inline constexpr std::uint32_t zip_local_signature = 0x04034b50;
inline constexpr std::uint32_t zip_central_signature = 0x02014b50;
inline constexpr std::uint32_t zip_end_signature = 0x06054b50;
inline constexpr std::uint32_t zip64_end_signature = 0x06064b50;
inline constexpr std::uint32_t zip64_locator_signature = 0x07064b50;
inline constexpr std::size_t zip_local_size = 30;
inline constexpr std::size_t zip_central_size = 46;
inline constexpr std::size_t zip_end_size = 22;
inline constexpr std::size_t zip64_end_size = 56;
inline constexpr std::size_t zip64_locator_size = 20;
inline constexpr std::size_t zip_max_comment = 0xffff;
// A 32-bit field that holds this (16-bit: 0xffff) has its value in the ZIP64 records.
inline constexpr std::uint64_t zip32_escape = 0xffffffff;
inline constexpr std::uint64_t zip16_escape = 0xffff;
inline constexpr std::uint16_t zip64_extra_id = 0x0001;
// torch's alignment of every entry's data, and the id of the extra field that pads to it.
inline constexpr std::uint64_t zip_data_alignment = 64;
inline constexpr std::uint16_t zip_padding_extra_id = 0x4246;  // "FB"

// Bounds on hostile archives: torch writes 7 entries (~600 directory bytes) per archive.
inline constexpr std::uint64_t zip_max_entries = 4096;
inline constexpr std::uint64_t zip_max_directory_bytes = std::uint64_t{1} << 20;

// Where the central directory lies, from the end records.
struct ZipDirectory {
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  std::uint64_t entries = 0;
};

// One entry as the central directory gives it (size: stored, so compressed == uncompressed).
struct ZipEntry {
  std::string name;  // with the archive's prefix, as stored
  std::uint64_t header_offset = 0;
  std::uint64_t size = 0;
  std::uint32_t crc32 = 0;
  // Where the next entry's local header or the central directory begins: the data's limit.
  std::uint64_t room_end = 0;
  // Where the data begins: what zip_data_offset() finds in the local header, set by the caller
  // (or parse_zip); 0 until then.
  std::uint64_t data_offset = 0;
};

// The entries in central-directory order, and the folder torch puts them in ("archive/" for a
// stream, the file's stem for a file): the first entry's name up to its first '/'.
struct ZipListing {
  std::string prefix;
  std::vector<ZipEntry> entries;
};

// The little-endian integer of `width` bytes at `at` (the caller has checked the bounds).
inline std::uint64_t zip_le(std::span<const std::byte> bytes, std::size_t at, std::size_t width) {
  std::uint64_t value = 0;
  for (std::size_t i = width; i-- > 0;)
    value = value << 8 | std::to_integer<std::uint64_t>(bytes[at + i]);
  return value;
}

// "0x1234abcd", for CRCs in messages.
inline std::string zip_hex(std::uint32_t value) { return fmt::format("{:#010x}", value); }

// How many bytes at the archive's end to read first: the end record with the longest comment
// and the ZIP64 records before it, and with them the whole of any archive torch writes for a
// small tensor or a non-tensor value.
inline std::uint64_t zip_tail_bytes(std::uint64_t length) {
  constexpr std::uint64_t cap = 68 * 1024;
  static_assert(cap >= zip_end_size + zip_max_comment + zip64_locator_size + zip64_end_size);
  return std::min(length, cap);
}

// The offset in `tail` of the end of central directory record: the last signature whose
// comment reaches exactly to the archive's end.
inline std::size_t zip_end_record_at(std::span<const std::byte> tail, std::string_view archive) {
  if (tail.size() >= zip_end_size) {
    const std::size_t last = tail.size() - zip_end_size;
    const std::size_t first = last > zip_max_comment ? last - zip_max_comment : 0;
    for (std::size_t at = last + 1; at-- > first;)
      if (zip_le(tail, at, 4) == zip_end_signature && zip_le(tail, at + 20, 2) == last - at)
        return at;
  }
  throw_io_error(archive, " has no ZIP end of central directory record in its last ", tail.size(),
                 " bytes: it is not a ZIP archive, or it is truncated");
}

// Refuses an archive spread over several disks (torch writes one).
inline void refuse_zip_disks(std::uint64_t disk, std::uint64_t directory_disk,
                             std::uint64_t disk_entries, std::uint64_t entries,
                             std::string_view record, std::string_view archive) {
  if (disk != 0 || directory_disk != 0 || disk_entries != entries)
    throw_io_error(archive, " is a multi-disk ZIP archive (its ", record, " names disk ", disk,
                   ", directory disk ", directory_disk, ", ", disk_entries, " of ", entries,
                   " entries on this disk); only single-file archives are read");
}

// The directory from the ZIP64 end record that the locator at `locator` (in `tail`) points to,
// checked against the plain end record's fields where those are not escaped.
inline ZipDirectory zip64_directory(std::span<const std::byte> tail, std::uint64_t tail_start,
                                    std::size_t locator, const ZipDirectory& plain,
                                    std::string_view archive) {
  const std::uint64_t record = zip_le(tail, locator + 8, 8);
  if (zip_le(tail, locator + 4, 4) != 0 || zip_le(tail, locator + 16, 4) > 1)
    throw_io_error(archive, " is a multi-disk ZIP archive (its ZIP64 locator names disk ",
                   zip_le(tail, locator + 4, 4), " of ", zip_le(tail, locator + 16, 4), ")");
  if (record != tail_start + locator - zip64_end_size)
    throw_io_error(archive, " has its ZIP64 end record at byte ", record, ", but the ",
                   zip64_end_size, "-byte record must end where its locator begins, at byte ",
                   tail_start + locator);
  const std::size_t at = locator - zip64_end_size;
  if (zip_le(tail, at, 4) != zip64_end_signature || zip_le(tail, at + 4, 8) != zip64_end_size - 12)
    throw_io_error(archive, " has no ZIP64 end record of ", zip64_end_size, " bytes at byte ",
                   record, " where its locator points");
  const ZipDirectory directory{zip_le(tail, at + 48, 8), zip_le(tail, at + 40, 8),
                               zip_le(tail, at + 32, 8)};
  refuse_zip_disks(zip_le(tail, at + 16, 4), zip_le(tail, at + 20, 4), zip_le(tail, at + 24, 8),
                   directory.entries, "ZIP64 end record", archive);
  const auto agrees = [](std::uint64_t narrow, std::uint64_t wide, std::uint64_t escape) {
    return narrow == escape || narrow == wide;
  };
  if (!agrees(plain.entries, directory.entries, zip16_escape) ||
      !agrees(plain.size, directory.size, zip32_escape) ||
      !agrees(plain.offset, directory.offset, zip32_escape))
    throw_io_error(archive, " has inconsistent ZIP64 fields: its end record gives ", plain.entries,
                   " entries, ", plain.size, " directory bytes at byte ", plain.offset,
                   ", its ZIP64 end record ", directory.entries, " entries, ", directory.size,
                   " bytes at byte ", directory.offset);
  return directory;
}

// Refuses a directory past the bounds, or one that does not end where the end records begin.
inline void check_zip_directory(const ZipDirectory& directory, std::uint64_t records_start,
                                std::string_view archive) {
  if (directory.entries > zip_max_entries)
    throw_io_error(archive, " has ", directory.entries, " ZIP entries; at most ", zip_max_entries,
                   " are read");
  if (directory.size > zip_max_directory_bytes)
    throw_io_error(archive, " has a ZIP central directory of ", directory.size, " bytes; at most ",
                   zip_max_directory_bytes, " are read");
  if (directory.size < directory.entries * zip_central_size)
    throw_io_error(archive, " has a ZIP central directory of ", directory.size, " bytes for ",
                   directory.entries, " entries of at least ", zip_central_size, " bytes each");
  if (directory.offset > records_start || records_start - directory.offset != directory.size)
    throw_io_error(archive, " has its ZIP central directory at byte ", directory.offset, ", ",
                   directory.size, " bytes long, but its end records begin at byte ",
                   records_start);
}

// Where the central directory of the archive of `length` bytes lies, from `tail`, the archive's
// last bytes (zip_tail_bytes(length) of them, or more). `archive` names the archive in messages
// ("the item at bytes 0..1641 of '__0_0.distcp'").
inline ZipDirectory find_zip_directory(std::span<const std::byte> tail, std::uint64_t length,
                                       std::string_view archive) {
  if (tail.size() > length)
    throw_io_error(archive, ": ", tail.size(), " tail bytes of an archive of ", length);
  const std::uint64_t tail_start = length - tail.size();
  const std::size_t end = zip_end_record_at(tail, archive);
  const ZipDirectory plain{zip_le(tail, end + 16, 4), zip_le(tail, end + 12, 4),
                           zip_le(tail, end + 10, 2)};
  refuse_zip_disks(zip_le(tail, end + 4, 2), zip_le(tail, end + 6, 2), zip_le(tail, end + 8, 2),
                   plain.entries, "end record", archive);
  const bool has_locator = end >= zip64_locator_size + zip64_end_size &&
                           zip_le(tail, end - zip64_locator_size, 4) == zip64_locator_signature;
  if (!has_locator) {
    if (plain.entries == zip16_escape || plain.size == zip32_escape || plain.offset == zip32_escape)
      throw_io_error(archive,
                     " escapes its end record's fields to ZIP64 but has no ZIP64 "
                     "locator (or no room for one) before it");
    check_zip_directory(plain, tail_start + end, archive);
    return plain;
  }
  const ZipDirectory directory =
      zip64_directory(tail, tail_start, end - zip64_locator_size, plain, archive);
  check_zip_directory(directory, tail_start + end - zip64_locator_size - zip64_end_size, archive);
  return directory;
}

// The directory's bytes when `tail` (the last bytes of the archive of `length` bytes) holds
// them; nullopt when the caller must read them.
inline std::optional<std::span<const std::byte>> zip_directory_in_tail(
    std::span<const std::byte> tail, std::uint64_t length, const ZipDirectory& directory) {
  const std::uint64_t tail_start = length - tail.size();
  if (directory.offset < tail_start) return std::nullopt;
  return tail.subspan(directory.offset - tail_start, directory.size);
}

// Sets `escaped`, the fields of a central header that hold the escape, from the 64-bit values of
// its ZIP64 extra field (among the fields of `extra`), in APPNOTE 4.5.3's order: size,
// compressed size, local header offset.
inline void read_zip64_extra(std::span<const std::byte> extra, std::span<std::uint64_t*> escaped,
                             std::string_view name, std::string_view archive) {
  for (std::size_t at = 0; at + 4 <= extra.size();) {
    const std::uint64_t id = zip_le(extra, at, 2), size = zip_le(extra, at + 2, 2);
    if (size > extra.size() - at - 4) break;
    if (id == zip64_extra_id) {
      if (size < 8 * escaped.size())
        throw_io_error(archive, " has ZIP entry ", in_quotes(name), " with ", escaped.size(),
                       " escaped fields but a ZIP64 extra field of only ", size, " bytes");
      for (std::size_t i = 0; i < escaped.size(); ++i)
        *escaped[i] = zip_le(extra, at + 4 + 8 * i, 8);
      return;
    }
    at += 4 + size;
  }
  if (!escaped.empty())
    throw_io_error(archive, " has ZIP entry ", in_quotes(name), " with ", escaped.size(),
                   " fields escaped to ZIP64 but no ZIP64 extra field");
}

// Refuses what is not a plain stored entry: encryption, compression, another disk.
inline void check_zip_stored(std::uint64_t flags, std::uint64_t method, std::uint64_t disk,
                             std::string_view name, std::string_view archive) {
  if ((flags & 0x41) != 0)
    throw_io_error(archive, " has encrypted ZIP entry ", in_quotes(name), " (flags ",
                   zip_hex(static_cast<std::uint32_t>(flags)), "); only plain entries are read");
  if (method != 0)
    throw_io_error(archive, " has ZIP entry ", in_quotes(name), " compressed with method ", method,
                   " (8 is deflate); torch stores its entries (method 0)");
  if (disk != 0)
    throw_io_error(archive, " is a multi-disk ZIP archive: entry ", in_quotes(name),
                   " starts on disk ", disk);
}

// The central header at `at` of `directory_bytes` as an entry; `at` moves past it.
inline ZipEntry read_zip_central(std::span<const std::byte> bytes, std::size_t& at,
                                 std::string_view archive) {
  if (bytes.size() - at < zip_central_size || zip_le(bytes, at, 4) != zip_central_signature)
    throw_io_error(archive, " has no ZIP central header at byte ", at, " of its directory");
  const std::size_t name_size = zip_le(bytes, at + 28, 2), extra_size = zip_le(bytes, at + 30, 2),
                    comment_size = zip_le(bytes, at + 32, 2);
  if (bytes.size() - at - zip_central_size < name_size + extra_size + comment_size)
    throw_io_error(archive, " has a ZIP central header at byte ", at,
                   " that runs past the end of its directory");
  ZipEntry entry;
  const auto* text = reinterpret_cast<const char*>(bytes.data() + at + zip_central_size);
  entry.name.assign(text, name_size);
  entry.crc32 = static_cast<std::uint32_t>(zip_le(bytes, at + 16, 4));
  std::uint64_t compressed = zip_le(bytes, at + 20, 4);
  entry.size = zip_le(bytes, at + 24, 4);
  entry.header_offset = zip_le(bytes, at + 42, 4);
  std::vector<std::uint64_t*> escaped;
  if (entry.size == zip32_escape) escaped.push_back(&entry.size);
  if (compressed == zip32_escape) escaped.push_back(&compressed);
  if (entry.header_offset == zip32_escape) escaped.push_back(&entry.header_offset);
  read_zip64_extra(bytes.subspan(at + zip_central_size + name_size, extra_size), escaped,
                   entry.name, archive);
  check_zip_stored(zip_le(bytes, at + 8, 2), zip_le(bytes, at + 10, 2), zip_le(bytes, at + 34, 2),
                   entry.name, archive);
  if (compressed != entry.size)
    throw_io_error(archive, " has stored ZIP entry ", in_quotes(entry.name), " of ", entry.size,
                   " bytes that says it has ", compressed, " compressed bytes");
  at += zip_central_size + name_size + extra_size + comment_size;
  return entry;
}

// Sets each entry's room_end, refusing entries that overlap each other or the directory (from
// what the directory alone says: a local header of at least 30 + name bytes, then the data).
inline void place_zip_entries(std::vector<ZipEntry>& entries, std::uint64_t directory_offset,
                              std::string_view archive) {
  std::vector<std::size_t> order(entries.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return entries[a].header_offset < entries[b].header_offset;
  });
  for (std::size_t i = 0; i < order.size(); ++i) {
    ZipEntry& entry = entries[order[i]];
    entry.room_end = i + 1 < order.size() ? entries[order[i + 1]].header_offset : directory_offset;
    const std::uint64_t least = zip_local_size + entry.name.size();
    if (entry.header_offset > entry.room_end || entry.room_end - entry.header_offset < least ||
        entry.room_end - entry.header_offset - least < entry.size)
      throw_io_error(archive, " has ZIP entry ", in_quotes(entry.name), " (local header at byte ",
                     entry.header_offset, ", ", entry.size, " data bytes) that overlaps ",
                     i + 1 < order.size() ? "entry " + in_quotes(entries[order[i + 1]].name)
                                          : std::string("the central directory"),
                     " at byte ", entry.room_end);
  }
}

// The entries of the central directory `directory`, whose bytes are `bytes`. Refuses a
// directory that lies, duplicate names, and entries that are not stored or overlap.
inline ZipListing parse_zip_directory(std::span<const std::byte> bytes,
                                      const ZipDirectory& directory, std::string_view archive) {
  if (bytes.size() != directory.size)
    throw_io_error(archive, ": ", bytes.size(), " bytes given for a ZIP central directory of ",
                   directory.size);
  ZipListing listing;
  std::set<std::string_view> names;
  std::size_t at = 0;
  for (std::uint64_t i = 0; i < directory.entries; ++i)
    listing.entries.push_back(read_zip_central(bytes, at, archive));
  if (at != bytes.size())
    throw_io_error(archive, " has ", bytes.size() - at, " bytes after its ", directory.entries,
                   " ZIP central headers in a directory of ", bytes.size());
  for (const ZipEntry& entry : listing.entries)
    if (!names.insert(entry.name).second)
      throw_io_error(archive, " has ZIP entry ", in_quotes(entry.name), " twice");
  if (listing.entries.empty()) throw_io_error(archive, " is a ZIP archive without entries");
  const std::string& first = listing.entries.front().name;
  const std::size_t slash = first.find('/');
  if (slash == std::string::npos || slash == 0)
    throw_io_error(archive, " has first ZIP entry ", in_quotes(first),
                   ", which is not in a folder as torch.save's entries are");
  listing.prefix = first.substr(0, slash + 1);
  place_zip_entries(listing.entries, directory.offset, archive);
  return listing;
}

// The entry torch calls `record` ("data.pkl", "data/0"): the prefix's folder + record.
inline const ZipEntry& zip_entry(const ZipListing& listing, std::string_view record,
                                 std::string_view archive) {
  const std::string name = listing.prefix + std::string(record);
  for (const ZipEntry& entry : listing.entries)
    if (entry.name == name) return entry;
  throw_io_error(archive, " has no ZIP entry ", in_quotes(name));
}

// How many bytes at entry.header_offset zip_data_offset() needs.
inline std::size_t zip_local_header_bytes(const ZipEntry& entry) {
  return zip_local_size + entry.name.size();
}

// Where `entry`'s data begins, from its local header's first zip_local_header_bytes(entry)
// bytes `local`: after the header, the name and the local extra field (whose length differs
// from the central one). Refuses a header that disagrees with the central one, and data that
// would run into the next entry or the directory.
inline std::uint64_t zip_data_offset(const ZipEntry& entry, std::span<const std::byte> local,
                                     std::string_view archive) {
  const auto name = [&] {
    return std::string_view(reinterpret_cast<const char*>(local.data()) + zip_local_size,
                            entry.name.size());
  };
  if (local.size() != zip_local_header_bytes(entry) || zip_le(local, 0, 4) != zip_local_signature ||
      zip_le(local, 26, 2) != entry.name.size() || name() != entry.name)
    throw_io_error(archive, " has no local header for ZIP entry ", in_quotes(entry.name),
                   " at byte ", entry.header_offset, " (signature and name must match)");
  const std::uint64_t flags = zip_le(local, 6, 2);
  check_zip_stored(flags, zip_le(local, 8, 2), 0, entry.name, archive);
  // Without a data descriptor (flag 8) the local header carries the CRC and sizes itself.
  if ((flags & 8) == 0 && zip_le(local, 14, 4) != entry.crc32)
    throw_io_error(archive, " has ZIP entry ", in_quotes(entry.name), " with CRC-32 ",
                   zip_hex(static_cast<std::uint32_t>(zip_le(local, 14, 4))),
                   " in its local header but ", zip_hex(entry.crc32), " in the directory");
  const std::uint64_t data = entry.header_offset + local.size() + zip_le(local, 28, 2);
  if (data > entry.room_end || entry.room_end - data < entry.size)
    throw_io_error(archive, " has ZIP entry ", in_quotes(entry.name), " whose ", entry.size,
                   " data bytes at byte ", data, " run past byte ", entry.room_end,
                   ", where the next entry or the central directory begins");
  return data;
}

// Refuses `entry` when `computed`, the CRC-32 of its data, is not the directory's.
inline void check_zip_crc(const ZipEntry& entry, std::uint32_t computed, std::string_view archive) {
  if (computed != entry.crc32)
    throw_io_error(archive, " has ZIP entry ", in_quotes(entry.name), " with CRC-32 ",
                   zip_hex(computed), " where its central directory says ", zip_hex(entry.crc32),
                   ": the data is damaged");
}

// Every entry of the whole archive `bytes`, data offsets included (small items, tests, fuzzer).
inline ZipListing parse_zip(std::span<const std::byte> bytes, std::string_view archive) {
  const auto tail = bytes.last(zip_tail_bytes(bytes.size()));
  const ZipDirectory directory = find_zip_directory(tail, bytes.size(), archive);
  ZipListing listing =
      parse_zip_directory(bytes.subspan(directory.offset, directory.size), directory, archive);
  for (ZipEntry& entry : listing.entries)
    entry.data_offset = zip_data_offset(
        entry, bytes.subspan(entry.header_offset, zip_local_header_bytes(entry)), archive);
  return listing;
}

// ---- writing ----

// An entry to write: its name, size and the CRC-32 of the bytes the caller will place.
struct ZipEntrySpec {
  std::string name;
  std::uint64_t size = 0;
  std::uint32_t crc32 = 0;
};

// Where one entry goes: `header` at header_offset, then its data at data_offset (64-aligned).
struct ZipPlacement {
  std::uint64_t header_offset = 0;
  std::vector<std::byte> header;
  std::uint64_t data_offset = 0;
};

// The whole archive: each entry's placement, then `trailer` at trailer_offset, up to `length`.
struct ZipLayout {
  std::vector<ZipPlacement> entries;
  std::uint64_t trailer_offset = 0;
  std::vector<std::byte> trailer;
  std::uint64_t length = 0;
};

// Appends `value` as `width` (at most 8) little-endian bytes.
inline void zip_put(std::vector<std::byte>& out, std::uint64_t value, std::size_t width) {
  for (std::size_t i = 0; i < width; ++i) out.push_back(static_cast<std::byte>(value >> (8 * i)));
}

// Appends `count` zero bytes: fields torch leaves zero.
inline void zip_put_zeros(std::vector<std::byte>& out, std::size_t count) {
  out.insert(out.end(), count, std::byte{0});
}

inline void zip_put_text(std::vector<std::byte>& out, std::string_view text) {
  for (const char c : text) out.push_back(static_cast<std::byte>(c));
}

// A 32-bit field's value: `value`, or the escape when it needs ZIP64.
inline std::uint64_t zip32(std::uint64_t value) { return std::min(value, zip32_escape); }

// The ZIP64 extra field holding the escaped ones of `values` (APPNOTE 4.5.3's order); empty
// when none is escaped.
inline std::vector<std::byte> zip64_extra(std::initializer_list<std::uint64_t> values) {
  std::vector<std::byte> wide;
  for (const std::uint64_t value : values)
    if (value >= zip32_escape) zip_put(wide, value, 8);
  std::vector<std::byte> extra;
  if (wide.empty()) return extra;
  zip_put(extra, zip64_extra_id, 2);
  zip_put(extra, wide.size(), 2);
  extra.insert(extra.end(), wide.begin(), wide.end());
  return extra;
}

// The local header of `entry` at `offset`: real CRC and sizes (no data descriptor follows), the
// ZIP64 sizes when they need them, and torch's "FB" field padding the data to a multiple of 64.
inline std::vector<std::byte> zip_local_header(const ZipEntrySpec& entry, std::uint64_t offset) {
  const bool wide = entry.size >= zip32_escape;
  // A local ZIP64 extra field holds both sizes (APPNOTE 4.5.3); there is no offset to escape.
  std::vector<std::byte> extra = zip64_extra({entry.size, entry.size});
  const std::uint64_t before = offset + zip_local_size + entry.name.size() + extra.size() + 4;
  const std::uint64_t padding =
      (zip_data_alignment - before % zip_data_alignment) % zip_data_alignment;
  zip_put(extra, zip_padding_extra_id, 2);
  zip_put(extra, padding, 2);
  extra.insert(extra.end(), padding, std::byte{'Z'});
  std::vector<std::byte> header;
  zip_put(header, zip_local_signature, 4);
  zip_put(header, wide ? 45 : 20, 2);  // version needed: 4.5 for ZIP64
  zip_put(header, 0x0800, 2);          // flags: UTF-8 names
  zip_put_zeros(header, 2 + 2 + 2);    // method stored, no time, no date (as torch)
  zip_put(header, entry.crc32, 4);
  zip_put(header, zip32(entry.size), 4);
  zip_put(header, zip32(entry.size), 4);
  zip_put(header, entry.name.size(), 2);
  zip_put(header, extra.size(), 2);
  zip_put_text(header, entry.name);
  header.insert(header.end(), extra.begin(), extra.end());
  return header;
}

// The central header of `entry`, whose local header is at `offset`.
inline void put_zip_central(std::vector<std::byte>& out, const ZipEntrySpec& entry,
                            std::uint64_t offset) {
  const std::vector<std::byte> extra = zip64_extra({entry.size, entry.size, offset});
  zip_put(out, zip_central_signature, 4);
  zip_put(out, 45, 2);                       // made by: MS-DOS, 4.5
  zip_put(out, extra.empty() ? 20 : 45, 2);  // version needed
  zip_put(out, 0x0800, 2);
  zip_put_zeros(out, 2 + 2 + 2);
  zip_put(out, entry.crc32, 4);
  zip_put(out, zip32(entry.size), 4);
  zip_put(out, zip32(entry.size), 4);
  zip_put(out, entry.name.size(), 2);
  zip_put(out, extra.size(), 2);
  zip_put_zeros(out, 2 + 2 + 2 + 4);  // no comment, disk 0, no attributes
  zip_put(out, zip32(offset), 4);
  zip_put_text(out, entry.name);
  out.insert(out.end(), extra.begin(), extra.end());
}

// The ZIP64 end record, its locator and the end record after a directory of `entries` entries
// and `size` bytes at `offset`, as torch writes them whatever the sizes.
inline void put_zip_end_records(std::vector<std::byte>& out, std::uint64_t entries,
                                std::uint64_t size, std::uint64_t offset) {
  zip_put(out, zip64_end_signature, 4);
  zip_put(out, zip64_end_size - 12, 8);
  zip_put(out, 45, 2);
  zip_put(out, 45, 2);
  zip_put_zeros(out, 4 + 4);  // disk, directory disk
  zip_put(out, entries, 8);
  zip_put(out, entries, 8);
  zip_put(out, size, 8);
  zip_put(out, offset, 8);
  zip_put(out, zip64_locator_signature, 4);
  zip_put_zeros(out, 4);
  zip_put(out, offset + size, 8);  // the ZIP64 end record follows the directory
  zip_put(out, 1, 4);              // disks in all
  zip_put(out, zip_end_signature, 4);
  zip_put_zeros(out, 2 + 2);
  zip_put(out, std::min(entries, zip16_escape), 2);
  zip_put(out, std::min(entries, zip16_escape), 2);
  zip_put(out, zip32(size), 4);
  zip_put(out, zip32(offset), 4);
  zip_put_zeros(out, 2);  // no comment
}

// Refuses entries this file's reader would refuse: too many, unnamed or duplicated names.
inline void check_zip_specs(std::span<const ZipEntrySpec> entries) {
  if (entries.size() > zip_max_entries)
    throw_io_error("a ZIP archive of ", entries.size(), " entries; at most ", zip_max_entries,
                   " are written");
  std::set<std::string_view> names;
  for (const ZipEntrySpec& entry : entries)
    if (entry.name.empty() || entry.name.size() > 1024 || !names.insert(entry.name).second)
      throw_io_error("ZIP entry name ", in_quotes(entry.name),
                     " is empty, longer than 1024 bytes or given twice");
}

// Where each of `entries` goes, in order, in a stored ZIP archive as torch writes it, and the
// trailer (central directory and end records) after them.
inline ZipLayout zip_layout(std::span<const ZipEntrySpec> entries) {
  check_zip_specs(entries);
  ZipLayout layout;
  std::uint64_t cursor = 0;
  for (const ZipEntrySpec& entry : entries) {
    ZipPlacement placement{cursor, zip_local_header(entry, cursor), 0};
    placement.data_offset = cursor + placement.header.size();
    cursor = placement.data_offset + entry.size;
    layout.entries.push_back(std::move(placement));
  }
  layout.trailer_offset = cursor;
  for (std::size_t i = 0; i < entries.size(); ++i)
    put_zip_central(layout.trailer, entries[i], layout.entries[i].header_offset);
  put_zip_end_records(layout.trailer, entries.size(), layout.trailer.size(), cursor);
  layout.length = cursor + layout.trailer.size();
  return layout;
}

// A torch.save archive with its one storage's bytes left to the caller: `head` is bytes
// [0, storage_offset), the storage goes at storage_offset, `tail` follows it up to `length`.
struct TorchArchive {
  std::vector<std::byte> head;
  std::uint64_t storage_offset = 0;
  std::uint64_t storage_size = 0;
  std::vector<std::byte> tail;
  std::uint64_t length = 0;
};

// The storage of a tensor's archive (`data/0`): its size and the CRC-32 of its bytes.
struct TorchStorage {
  std::uint64_t size = 0;
  std::uint32_t crc32 = 0;
};

// Copies the part of `bytes` (at `offset` of the archive) that falls in `window`, which holds
// the archive's bytes from `begin`.
inline void copy_into_window(std::vector<std::byte>& window, std::uint64_t begin,
                             std::uint64_t offset, std::span<const std::byte> bytes) {
  const std::uint64_t from = std::max(offset, begin);
  const std::uint64_t to = std::min(offset + bytes.size(), begin + window.size());
  if (from < to)
    std::copy(bytes.begin() + (from - offset), bytes.begin() + (to - offset),
              window.begin() + (from - begin));
}

// Bytes [begin, end) of the archive `layout` with the entries' `contents` in place.
inline std::vector<std::byte> zip_window(const ZipLayout& layout,
                                         std::span<const std::string_view> contents,
                                         std::uint64_t begin, std::uint64_t end) {
  std::vector<std::byte> window(end - begin);
  for (std::size_t i = 0; i < layout.entries.size(); ++i) {
    const ZipPlacement& entry = layout.entries[i];
    copy_into_window(window, begin, entry.header_offset, entry.header);
    copy_into_window(window, begin, entry.data_offset, std::as_bytes(std::span(contents[i])));
  }
  copy_into_window(window, begin, layout.trailer_offset, layout.trailer);
  return window;
}

// The archive torch.save writes under `prefix` ("archive/") for the pickle `data_pkl` and, for
// a tensor, its storage `data/0` (without one, a non-tensor value: `head` is all of it). The
// records are torch 2.x's in its order, less `.data/serialization_id`, which torch.load does not
// need.
inline TorchArchive torch_archive(std::string_view prefix, std::span<const std::byte> data_pkl,
                                  const std::optional<TorchStorage>& storage) {
  const std::string folder(prefix);
  std::vector<ZipEntrySpec> specs;
  std::vector<std::string_view> contents;
  const auto add = [&](std::string_view record, std::string_view content) {
    specs.push_back({folder + std::string(record), content.size(),
                     zip_crc32(std::as_bytes(std::span(content)))});
    contents.push_back(content);
  };
  add("data.pkl", {reinterpret_cast<const char*>(data_pkl.data()), data_pkl.size()});
  add(".format_version", "1");
  add(".storage_alignment", "64");
  add("byteorder", "little");
  const std::size_t storage_index = specs.size();
  if (storage) {
    specs.push_back({folder + "data/0", storage->size, storage->crc32});
    contents.emplace_back();
  }
  add("version", "3\n");
  const ZipLayout layout = zip_layout(specs);
  TorchArchive archive;
  archive.length = layout.length;
  archive.storage_offset = storage ? layout.entries[storage_index].data_offset : layout.length;
  archive.storage_size = storage ? storage->size : 0;
  archive.head = zip_window(layout, contents, 0, archive.storage_offset);
  archive.tail =
      zip_window(layout, contents, archive.storage_offset + archive.storage_size, layout.length);
  return archive;
}

}  // namespace kshard::detail
