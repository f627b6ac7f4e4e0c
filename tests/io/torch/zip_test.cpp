// The stored ZIP archives (torch.save) inside PyTorch DCP `.distcp` files: torch's own archives
// read, the reference archives of fixtures/dcp_zip (written by Python without kshard, checked
// with Python's zipfile) written byte for byte, ZIP64 arithmetic past 4 GiB, and every lie
// refused with a kshard::error, never a crash.

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kshard/error.hpp"
#include "kshard/io/torch/zip.hpp"
#include "safetensors_test_support.hpp"

namespace {

namespace kd = kshard::detail;
using Bytes = std::vector<std::byte>;

const std::filesystem::path fixtures = KSHARD_IO_FIXTURES_DIR;

Bytes read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  const std::vector<char> chars((std::istreambuf_iterator<char>(in)), {});
  const auto bytes = std::as_bytes(std::span(chars));
  return {bytes.begin(), bytes.end()};
}

Bytes golden() { return read_file(fixtures / "dcp_example" / "__0_0.distcp"); }

Bytes text_bytes(std::string_view text) {
  const auto bytes = std::as_bytes(std::span(text));
  return {bytes.begin(), bytes.end()};
}

std::string text_of(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

using kshard_io_test::error_of;

std::string parse_error(const Bytes& archive) {
  return error_of([&] { kd::parse_zip(archive, "the archive"); });
}

// Writes `value` as `width` little-endian bytes at `at`.
void patch(Bytes& bytes, std::size_t at, std::uint64_t value, std::size_t width) {
  for (std::size_t i = 0; i < width; ++i) bytes[at + i] = static_cast<std::byte>(value >> (8 * i));
}

// The golden archive's landmarks (spec Appendix B).
constexpr std::size_t golden_directory = 1080, golden_zip64_end = 1543, golden_locator = 1599,
                      golden_end = 1619;
// Its central header of entry `i` (all its names are under 20 bytes: walk the directory).
std::size_t golden_central(const Bytes& archive, std::size_t i) {
  std::size_t at = golden_directory;
  for (; i > 0; --i)
    at += kd::zip_central_size + kd::zip_le(archive, at + 28, 2) + kd::zip_le(archive, at + 30, 2);
  return at;
}

TEST(DcpZip, ReadsTorchsArchive) {
  for (const char* file : {"__0_0.distcp", "__1_0.distcp"}) {
    const Bytes archive = read_file(fixtures / "dcp_example" / file);
    ASSERT_EQ(archive.size(), 1641u);
    const kd::ZipListing listing = kd::parse_zip(archive, file);
    EXPECT_EQ(listing.prefix, "archive/");
    const std::vector<std::string> names = {"archive/data.pkl",
                                            "archive/.format_version",
                                            "archive/.storage_alignment",
                                            "archive/byteorder",
                                            "archive/data/0",
                                            "archive/version",
                                            "archive/.data/serialization_id"};
    const std::vector<std::uint64_t> offsets = {64, 320, 448, 576, 704, 896, 1024};
    const std::vector<std::uint64_t> sizes = {154, 1, 2, 6, 64, 2, 40};
    ASSERT_EQ(listing.entries.size(), 7u);
    for (std::size_t i = 0; i < 7; ++i) {
      const kd::ZipEntry& entry = listing.entries[i];
      EXPECT_EQ(entry.name, names[i]);
      EXPECT_EQ(entry.data_offset, offsets[i]);
      EXPECT_EQ(entry.size, sizes[i]);
      const auto data = std::span(archive).subspan(entry.data_offset, entry.size);
      EXPECT_NO_THROW(kd::check_zip_crc(entry, kd::zip_crc32(data), file));
    }
    const kd::ZipEntry& storage = kd::zip_entry(listing, "data/0", file);
    EXPECT_EQ(storage.data_offset, 704u);
    EXPECT_EQ(
        text_of(std::span(archive).subspan(kd::zip_entry(listing, "version", file).data_offset, 2)),
        "3\n");
  }
}

// The caller's flow with a tail too short for the directory: a second read of exactly it, then
// one local header per entry wanted.
TEST(DcpZip, ReadsTheDirectoryBeforeTheTail) {
  const Bytes archive = golden();
  const std::uint64_t length = archive.size();
  EXPECT_EQ(kd::zip_tail_bytes(length), length);
  EXPECT_EQ(kd::zip_tail_bytes(std::uint64_t{1} << 40), 68u * 1024);
  const auto tail = std::span(archive).last(length - golden_zip64_end);
  const kd::ZipDirectory directory = kd::find_zip_directory(tail, length, "item");
  EXPECT_EQ(directory.offset, golden_directory);
  EXPECT_EQ(directory.size, golden_zip64_end - golden_directory);
  EXPECT_EQ(directory.entries, 7u);
  EXPECT_FALSE(kd::zip_directory_in_tail(tail, length, directory));
  ASSERT_TRUE(kd::zip_directory_in_tail(archive, length, directory));
  EXPECT_EQ(kd::zip_directory_in_tail(archive, length, directory)->data(),
            archive.data() + golden_directory);
  kd::ZipListing listing = kd::parse_zip_directory(
      std::span(archive).subspan(directory.offset, directory.size), directory, "item");
  const kd::ZipEntry& pickle = kd::zip_entry(listing, "data.pkl", "item");
  EXPECT_EQ(kd::zip_local_header_bytes(pickle), 46u);
  EXPECT_EQ(kd::zip_data_offset(pickle, std::span(archive).first(46), "item"), 64u);
  EXPECT_EQ(pickle.room_end, 234u);
  EXPECT_NE(error_of([&] {
              kd::zip_entry(listing, "data/1", "item");
            }).find("item has no ZIP entry 'archive/data/1'"),
            std::string::npos);
}

TEST(DcpZip, RefusesDamagedDataByCrc) {
  Bytes archive = golden();
  const kd::ZipListing listing = kd::parse_zip(archive, "item");
  const kd::ZipEntry& storage = kd::zip_entry(listing, "data/0", "item");
  archive[storage.data_offset + 5] ^= std::byte{1};
  const auto data = std::span(archive).subspan(storage.data_offset, storage.size);
  const std::string message =
      error_of([&] { kd::check_zip_crc(storage, kd::zip_crc32(data), "item"); });
  EXPECT_NE(message.find("ZIP entry 'archive/data/0' with CRC-32 0x"), std::string::npos);
  EXPECT_NE(message.find("where its central directory says 0x21c0b223: the data is damaged"),
            std::string::npos)
      << message;
}

TEST(DcpZip, CombinesCrcsOfPieces) {
  const Bytes archive = golden();
  const auto all = std::span(archive);
  EXPECT_EQ(kd::zip_crc32_combine(kd::zip_crc32(all.first(700)), kd::zip_crc32(all.subspan(700)),
                                  all.size() - 700),
            kd::zip_crc32(all));
  EXPECT_EQ(kd::zip_crc32(all.subspan(700), kd::zip_crc32(all.first(700))), kd::zip_crc32(all));
  EXPECT_EQ(kd::zip_crc32(text_bytes("123456789")), 0xcbf43926u);  // the CRC-32 check value
}

// kshard's archive for `storage` (none: a bytes item), with the storage's bytes in place.
Bytes written(std::string_view prefix, const Bytes& pickle, const std::optional<Bytes>& storage) {
  std::optional<kd::TorchStorage> spec;
  if (storage) spec = kd::TorchStorage{storage->size(), kd::zip_crc32(*storage)};
  const kd::TorchArchive archive = kd::torch_archive(prefix, pickle, spec);
  EXPECT_TRUE(!storage || archive.storage_offset % 64 == 0);
  EXPECT_EQ(archive.head.size(), archive.storage_offset);
  EXPECT_EQ(archive.storage_offset + archive.storage_size + archive.tail.size(), archive.length);
  Bytes bytes = archive.head;
  if (storage) bytes.insert(bytes.end(), storage->begin(), storage->end());
  bytes.insert(bytes.end(), archive.tail.begin(), archive.tail.end());
  return bytes;
}

// What make_reference.py writes, byte for byte, and what kshard's reader then reads.
TEST(DcpZip, WritesTheReferenceArchives) {
  const Bytes archive = golden();
  const kd::ZipListing listing = kd::parse_zip(archive, "golden");
  const auto entry_bytes = [&](std::string_view record) {
    const kd::ZipEntry& entry = kd::zip_entry(listing, record, "golden");
    const auto data = std::span(archive).subspan(entry.data_offset, entry.size);
    return Bytes(data.begin(), data.end());
  };
  const Bytes pickle = entry_bytes("data.pkl"), rows = entry_bytes("data/0");
  Bytes seven;
  for (int i = 1; i <= 7; ++i) seven.push_back(static_cast<std::byte>(i));
  struct Case {
    const char* file;
    const char* prefix;
    Bytes pickle;
    std::optional<Bytes> storage;
  };
  const std::vector<Case> cases = {
      {"torch_4x4_float32.zip", "archive/", pickle, rows},
      {"torch_empty.zip", "archive/", pickle, Bytes{}},
      {"torch_7_bytes.zip", "model_step_3/", pickle, seven},
      {"torch_bytes_item.zip", "archive/", text_bytes("\x80\x02K\x07."), std::nullopt}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file);
    const Bytes bytes = written(c.prefix, c.pickle, c.storage);
    EXPECT_EQ(bytes, read_file(fixtures / "dcp_zip" / c.file));
    const kd::ZipListing read = kd::parse_zip(bytes, c.file);
    EXPECT_EQ(read.prefix, c.prefix);
    EXPECT_EQ(read.entries.size(), c.storage ? 6u : 5u);
    for (const kd::ZipEntry& entry : read.entries) {
      EXPECT_EQ(entry.data_offset % 64, 0u) << entry.name;
      const auto data = std::span(bytes).subspan(entry.data_offset, entry.size);
      EXPECT_NO_THROW(kd::check_zip_crc(entry, kd::zip_crc32(data), c.file));
    }
    const kd::ZipEntry& stored_pickle = kd::zip_entry(read, "data.pkl", c.file);
    EXPECT_EQ(Bytes(bytes.begin() + stored_pickle.data_offset,
                    bytes.begin() + stored_pickle.data_offset + stored_pickle.size),
              c.pickle);
  }
}

TEST(DcpZip, ReadsPythonsZipfileArchives) {
  for (const char* file : {"zipfile_stored.zip", "zipfile_zip64_local.zip"}) {
    SCOPED_TRACE(file);
    const Bytes bytes = read_file(fixtures / "dcp_zip" / file);
    const kd::ZipListing listing = kd::parse_zip(bytes, file);
    EXPECT_EQ(listing.prefix, "ckpt/");
    const kd::ZipEntry& pickle = kd::zip_entry(listing, "data.pkl", file);
    EXPECT_EQ(text_of(std::span(bytes).subspan(pickle.data_offset, pickle.size)), "\x80\x02K\x07.");
    const kd::ZipEntry& storage = kd::zip_entry(listing, "data/0", file);
    EXPECT_NO_THROW(kd::check_zip_crc(
        storage, kd::zip_crc32(std::span(bytes).subspan(storage.data_offset, storage.size)), file));
  }
  EXPECT_NE(parse_error(read_file(fixtures / "dcp_zip" / "zipfile_deflated.zip"))
                .find("the archive has ZIP entry 'ckpt/data.pkl' compressed with method 8 "
                      "(8 is deflate); torch stores its entries (method 0)"),
            std::string::npos);
}

// A 5 GiB storage after 4 GiB of other entries: the escapes and ZIP64 extra fields, checked in
// the header and trailer bytes without writing the data.
TEST(DcpZip, WritesZip64PastFourGiB) {
  constexpr std::uint64_t gib = std::uint64_t{1} << 30;
  const std::vector<kd::ZipEntrySpec> specs = {
      {"a/big", 4 * gib, 0x11111111}, {"a/data/0", 5 * gib, 0x22222222}, {"a/version", 2, 0x33}};
  const kd::ZipLayout layout = kd::zip_layout(specs);
  ASSERT_EQ(layout.entries.size(), 3u);
  for (const kd::ZipPlacement& placement : layout.entries) {
    EXPECT_EQ(placement.data_offset % 64, 0u);
    EXPECT_EQ(placement.header_offset + placement.header.size(), placement.data_offset);
  }
  const Bytes& header = layout.entries[1].header;
  EXPECT_EQ(kd::zip_le(header, 4, 2), 45u);           // version needed: ZIP64
  EXPECT_EQ(kd::zip_le(header, 18, 4), 0xffffffffu);  // sizes escaped ...
  EXPECT_EQ(kd::zip_le(header, 22, 4), 0xffffffffu);
  const std::size_t extra = 30 + specs[1].name.size();
  EXPECT_EQ(kd::zip_le(header, extra, 2), 1u);  // ... to the ZIP64 extra field
  EXPECT_EQ(kd::zip_le(header, extra + 2, 2), 16u);
  EXPECT_EQ(kd::zip_le(header, extra + 4, 8), 5 * gib);
  EXPECT_EQ(kd::zip_le(header, extra + 12, 8), 5 * gib);
  EXPECT_EQ(kd::zip_le(header, extra + 20, 2), 0x4246u);  // then "FB"
  EXPECT_EQ(kd::zip_le(layout.entries[2].header, 18, 4), 2u);
  EXPECT_GT(layout.entries[2].header_offset, 9 * gib);
  EXPECT_EQ(layout.trailer_offset, layout.entries[2].data_offset + 2);
  EXPECT_EQ(layout.length, layout.trailer_offset + layout.trailer.size());

  // The trailer read back as the tail of the archive, and each local header's first bytes.
  const kd::ZipDirectory directory = kd::find_zip_directory(layout.trailer, layout.length, "big");
  EXPECT_EQ(directory.offset, layout.trailer_offset);
  const auto bytes = kd::zip_directory_in_tail(layout.trailer, layout.length, directory);
  ASSERT_TRUE(bytes);
  kd::ZipListing listing = kd::parse_zip_directory(*bytes, directory, "big");
  ASSERT_EQ(listing.entries.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    kd::ZipEntry& entry = listing.entries[i];
    EXPECT_EQ(entry.size, specs[i].size);
    EXPECT_EQ(entry.crc32, specs[i].crc32);
    EXPECT_EQ(entry.header_offset, layout.entries[i].header_offset);
    const auto local = std::span(layout.entries[i].header).first(kd::zip_local_header_bytes(entry));
    EXPECT_EQ(kd::zip_data_offset(entry, local, "big"), layout.entries[i].data_offset);
  }
  // The end record escapes the directory's offset; the ZIP64 end record holds it.
  EXPECT_EQ(kd::zip_le(layout.trailer, layout.trailer.size() - 6, 4), 0xffffffffu);
}

TEST(DcpZip, WriterRefusesWhatItsReaderWould) {
  const std::vector<kd::ZipEntrySpec> twice = {{"a/x", 1, 0}, {"a/x", 1, 0}};
  EXPECT_NE(error_of([&] { kd::zip_layout(twice); }).find("'a/x' is empty, longer than"),
            std::string::npos);
  const std::vector<kd::ZipEntrySpec> many(4097, kd::ZipEntrySpec{"a/x", 0, 0});
  EXPECT_NE(error_of([&] { kd::zip_layout(many); }).find("4097 entries; at most 4096"),
            std::string::npos);
}

TEST(DcpZip, RefusesAnArchiveWithoutEndRecord) {
  EXPECT_NE(parse_error(Bytes(100))
                .find("has no ZIP end of central directory record in its last "
                      "100 bytes"),
            std::string::npos);
  EXPECT_NE(parse_error(Bytes{}).find("in its last 0 bytes"), std::string::npos);
  Bytes archive = golden();
  archive.push_back(std::byte{0});  // the end record's (empty) comment no longer reaches the end
  EXPECT_NE(parse_error(archive).find("has no ZIP end of central directory record"),
            std::string::npos);
}

TEST(DcpZip, RefusesInconsistentZip64Records) {
  Bytes archive = golden();
  patch(archive, golden_end + 8, 6, 2);  // the end record's entry counts
  patch(archive, golden_end + 10, 6, 2);
  EXPECT_NE(parse_error(archive).find("has inconsistent ZIP64 fields: its end record gives 6 "
                                      "entries, 463 directory bytes at byte 1080, its ZIP64 end "
                                      "record 7 entries"),
            std::string::npos);
  archive = golden();
  patch(archive, golden_locator + 8, golden_zip64_end - 8, 8);
  EXPECT_NE(parse_error(archive).find("has its ZIP64 end record at byte 1535, but the 56-byte "
                                      "record must end where its locator begins, at byte 1599"),
            std::string::npos);
  archive = golden();
  patch(archive, golden_zip64_end, 0, 4);
  EXPECT_NE(parse_error(archive).find("has no ZIP64 end record of 56 bytes at byte 1543"),
            std::string::npos);
  archive = golden();
  patch(archive, golden_locator, 0, 4);  // no locator: the end record alone must then be right
  EXPECT_NE(parse_error(archive).find("but its end records begin at byte 1619"), std::string::npos);
  patch(archive, golden_end + 16, 0xffffffff, 4);
  EXPECT_NE(parse_error(archive).find("escapes its end record's fields to ZIP64 but has no ZIP64 "
                                      "locator"),
            std::string::npos);
}

// Sets the directory's size or offset or entry count in both end records.
void patch_directory(Bytes& archive, std::size_t plain_at, std::size_t plain_width,
                     std::size_t wide_at, std::uint64_t value) {
  patch(archive, golden_end + plain_at, value, plain_width);
  patch(archive, golden_zip64_end + wide_at, value, 8);
}

TEST(DcpZip, RefusesADirectoryOutsideTheArchiveOrPastTheBounds) {
  Bytes archive = golden();
  patch_directory(archive, 16, 4, 48, 1000);
  EXPECT_NE(parse_error(archive).find("has its ZIP central directory at byte 1000, 463 bytes long, "
                                      "but its end records begin at byte 1543"),
            std::string::npos);
  archive = golden();
  patch_directory(archive, 16, 4, 48, 5000);
  EXPECT_NE(parse_error(archive).find("directory at byte 5000"), std::string::npos);
  archive = golden();
  patch_directory(archive, 12, 4, 40, 2 << 20);
  EXPECT_NE(parse_error(archive).find("has a ZIP central directory of 2097152 bytes; at most "
                                      "1048576 are read"),
            std::string::npos);
  archive = golden();
  patch_directory(archive, 10, 2, 32, 5000);
  patch(archive, golden_end + 8, 5000, 2);
  patch(archive, golden_zip64_end + 24, 5000, 8);
  EXPECT_NE(parse_error(archive).find("has 5000 ZIP entries; at most 4096 are read"),
            std::string::npos);
  archive = golden();
  patch_directory(archive, 10, 2, 32, 11);
  patch(archive, golden_end + 8, 11, 2);
  patch(archive, golden_zip64_end + 24, 11, 8);
  EXPECT_NE(parse_error(archive).find("directory of 463 bytes for 11 entries of at least 46"),
            std::string::npos);
  archive = golden();
  patch_directory(archive, 10, 2, 32, 6);
  patch(archive, golden_end + 8, 6, 2);
  patch(archive, golden_zip64_end + 24, 6, 8);
  EXPECT_NE(parse_error(archive).find("has 76 bytes after its 6 ZIP central headers"),
            std::string::npos);
}

TEST(DcpZip, RefusesMultiDiskArchives) {
  Bytes archive = golden();
  patch(archive, golden_end + 4, 1, 2);
  EXPECT_NE(parse_error(archive).find("is a multi-disk ZIP archive (its end record names disk 1"),
            std::string::npos);
  archive = golden();
  patch(archive, golden_zip64_end + 20, 2, 4);
  EXPECT_NE(parse_error(archive).find("(its ZIP64 end record names disk 0, directory disk 2"),
            std::string::npos);
  archive = golden();
  patch(archive, golden_locator + 16, 3, 4);
  EXPECT_NE(parse_error(archive).find("(its ZIP64 locator names disk 0 of 3)"), std::string::npos);
  archive = golden();
  patch(archive, golden_central(archive, 2) + 34, 1, 2);
  EXPECT_NE(parse_error(archive).find("entry 'archive/.storage_alignment' starts on disk 1"),
            std::string::npos);
}

TEST(DcpZip, RefusesEncryptedOrCompressedEntries) {
  Bytes archive = golden();
  patch(archive, golden_central(archive, 4) + 8, 0x0809, 2);
  EXPECT_NE(parse_error(archive).find("has encrypted ZIP entry 'archive/data/0' (flags "
                                      "0x00000809); only plain entries are read"),
            std::string::npos);
  archive = golden();
  patch(archive, golden_central(archive, 0) + 10, 12, 2);
  EXPECT_NE(parse_error(archive).find("'archive/data.pkl' compressed with method 12"),
            std::string::npos);
  archive = golden();
  patch(archive, 8, 8, 2);  // the local header alone says deflate
  EXPECT_NE(parse_error(archive).find("'archive/data.pkl' compressed with method 8"),
            std::string::npos);
  archive = golden();
  patch(archive, golden_central(archive, 1) + 20, 3, 4);
  EXPECT_NE(parse_error(archive).find("has stored ZIP entry 'archive/.format_version' of 1 bytes "
                                      "that says it has 3 compressed bytes"),
            std::string::npos);
}

TEST(DcpZip, RefusesOverlappingEntries) {
  Bytes archive = golden();
  patch(archive, golden_central(archive, 3) + 42, 350, 4);  // byteorder inside .storage_alignment
  EXPECT_NE(parse_error(archive).find("has ZIP entry 'archive/.storage_alignment' (local header at "
                                      "byte 337, 2 data bytes) that overlaps entry "
                                      "'archive/byteorder' at byte 350"),
            std::string::npos);
  archive = golden();
  patch(archive, golden_central(archive, 6) + 24, 200, 4);
  patch(archive, golden_central(archive, 6) + 20, 200, 4);
  EXPECT_NE(parse_error(archive).find("'archive/.data/serialization_id' (local header at byte "
                                      "914, 200 data bytes) that overlaps the central directory "
                                      "at byte 1080"),
            std::string::npos);
  archive = golden();
  patch(archive, golden_central(archive, 6) + 42, 5000, 4);
  EXPECT_NE(parse_error(archive).find("local header at byte 5000"), std::string::npos);
  archive = golden();
  patch(archive, 28, 200, 2);  // data.pkl's local extra reaches into the next entry
  EXPECT_NE(parse_error(archive).find("has ZIP entry 'archive/data.pkl' whose 154 data bytes at "
                                      "byte 246 run past byte 234"),
            std::string::npos);
  // 4 GiB sizes escaped to an extra field the entry lacks, or too short.
  archive = golden();
  patch(archive, golden_central(archive, 0) + 20, 0xffffffff, 4);
  patch(archive, golden_central(archive, 0) + 24, 0xffffffff, 4);
  EXPECT_NE(parse_error(archive).find("with 2 fields escaped to ZIP64 but no ZIP64 extra field"),
            std::string::npos);
}

TEST(DcpZip, RefusesDuplicateNamesAndABadPrefix) {
  const std::vector<kd::ZipEntrySpec> specs = {{"a/x1", 1, 0}, {"a/x2", 1, 0}};
  const kd::ZipLayout layout = kd::zip_layout(specs);
  Bytes archive(layout.length);
  for (const kd::ZipPlacement& entry : layout.entries)
    std::copy(entry.header.begin(), entry.header.end(), archive.begin() + entry.header_offset);
  std::copy(layout.trailer.begin(), layout.trailer.end(), archive.begin() + layout.trailer_offset);
  EXPECT_EQ(parse_error(archive), "");
  // The second entry renamed "a/x1" in its local and central headers.
  Bytes twice = archive;
  patch(twice, layout.entries[1].header_offset + 33, '1', 1);
  patch(twice, layout.trailer_offset + 46 + 4 + 46 + 3, '1', 1);
  EXPECT_NE(parse_error(twice).find("has ZIP entry 'a/x1' twice"), std::string::npos);
  // Entries in no folder, as torch never writes them.
  Bytes flat = archive;
  patch(flat, 30 + 1, '_', 1);
  patch(flat, layout.trailer_offset + 46 + 1, '_', 1);
  EXPECT_NE(parse_error(flat).find("has first ZIP entry 'a_x1', which is not in a folder"),
            std::string::npos);
}

TEST(DcpZip, RefusesALocalHeaderThatDisagrees) {
  Bytes archive = golden();
  patch(archive, 0, 0x04034b51, 4);
  EXPECT_NE(parse_error(archive).find("has no local header for ZIP entry 'archive/data.pkl' at "
                                      "byte 0 (signature and name must match)"),
            std::string::npos);
  archive = golden();
  patch(archive, 30 + 8, 'A', 1);  // "archive/Data.pkl"
  EXPECT_NE(parse_error(archive).find("no local header for ZIP entry 'archive/data.pkl'"),
            std::string::npos);
  archive = golden();
  patch(archive, 6, 0x0800, 2);  // no data descriptor: the local CRC (0) must be the real one
  EXPECT_NE(parse_error(archive).find("with CRC-32 0x00000000 in its local header but 0xb6a41441 "
                                      "in the directory"),
            std::string::npos);
  archive = golden();
  const kd::ZipListing listing = kd::parse_zip(archive, "item");
  EXPECT_NE(error_of([&] {
              kd::zip_data_offset(listing.entries[0], std::span(archive).first(20), "item");
            }).find("no local header"),
            std::string::npos);
}

// Each prefix of the archive as an archive of its own, and each byte changed: a clean refusal
// or a parse whose entries lie inside, never a crash (the fuzzer goes further).
TEST(DcpZip, SurvivesTruncationAndDamage) {
  const Bytes archive = golden();
  const auto check = [](const Bytes& bytes) {
    try {
      const kd::ZipListing listing = kd::parse_zip(bytes, "item");
      for (const kd::ZipEntry& entry : listing.entries)
        ASSERT_LE(entry.data_offset + entry.size, bytes.size());
    } catch (const kshard::error&) {
    }
  };
  for (std::size_t length = 0; length < archive.size(); ++length) {
    const Bytes prefix(archive.begin(), archive.begin() + length);
    EXPECT_NE(parse_error(prefix), "") << length;
  }
  for (std::size_t at = 0; at < archive.size(); ++at) {
    for (const std::byte value : {std::byte{0x00}, std::byte{0xff}, std::byte{0x7f}}) {
      Bytes damaged = archive;
      damaged[at] = value;
      check(damaged);
    }
  }
}

}  // namespace
