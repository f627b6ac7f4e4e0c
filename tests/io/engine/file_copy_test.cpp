// File-to-file copies (io/engine/posix.hpp): copy_in_kernel moves bytes between any offsets,
// whether both sit alike in their pages (copy_file_range) or not (a mapping), and counts them;
// a source shorter than the copy is a refusal, nothing counted. Syncs are skipped and not counted
// under Durability::page_cache, and the durability before a scope comes back after it.

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "kshard/io/engine/posix.hpp"
#include "kshard/io/engine/sync.hpp"

namespace {

namespace fs = std::filesystem;
using kshard::detail::ScopedFd;

// A file of `bytes` random bytes in a fresh folder, removed with it.
struct SourceFile {
  explicit SourceFile(std::size_t bytes)
      : folder(fs::temp_directory_path() / ("kshard-file-copy-" + std::to_string(::getpid()))),
        path(folder / "source"),
        data(bytes) {
    fs::create_directories(folder);
    std::mt19937 random(7);
    for (auto& b : data) b = static_cast<char>(random());
    std::ofstream(path, std::ios::binary).write(data.data(), static_cast<std::streamsize>(bytes));
  }
  ~SourceFile() { fs::remove_all(folder); }
  fs::path folder, path;
  std::vector<char> data;
};

std::vector<char> read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(FileCopy, MovesBytesBetweenAnyOffsets) {
  const SourceFile source(3 << 20);
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  // (from, to, bytes): alike in their pages, apart by 592 bytes as two headers' lengths leave
  // them, one page apart, and a copy shorter than a page across a page boundary.
  const std::vector<std::array<std::uint64_t, 3>> copies{
      {page, 0, 1 << 20}, {1616, 1024, (2 << 20) + 3}, {page + 8, 8, 5000}, {page - 100, 7, 300}};
  for (const auto& [from, to, bytes] : copies) {
    const fs::path target = source.folder / "target";
    const ScopedFd in(kshard::detail::open_or_throw(source.path, O_RDONLY));
    const ScopedFd out(::open(target.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    kshard::io::reset_io_stats();
    ASSERT_TRUE(kshard::detail::copy_in_kernel(in.get(), from, out.get(), to, bytes));
    EXPECT_EQ(kshard::io::io_stats().bytes_read, static_cast<std::int64_t>(bytes));
    EXPECT_EQ(kshard::io::io_stats().bytes_written, static_cast<std::int64_t>(bytes));
    const std::vector<char> written = read_all(target);
    ASSERT_EQ(written.size(), to + bytes) << from << " -> " << to;
    EXPECT_TRUE(std::equal(written.begin() + static_cast<std::ptrdiff_t>(to), written.end(),
                           source.data.begin() + static_cast<std::ptrdiff_t>(from)))
        << from << " -> " << to;
  }
}

TEST(FileCopy, RefusesASourceShorterThanTheCopy) {
  const SourceFile source(10000);
  const ScopedFd in(kshard::detail::open_or_throw(source.path, O_RDONLY));
  const fs::path target = source.folder / "target";
  const ScopedFd out(::open(target.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
  kshard::io::reset_io_stats();
  for (const std::uint64_t to : {std::uint64_t{0}, std::uint64_t{1}})  // in-kernel, mapped
    EXPECT_FALSE(kshard::detail::copy_in_kernel(in.get(), 8192, out.get(), to, 4096 * 3));
  EXPECT_EQ(kshard::io::io_stats().bytes_written, 0);
}

TEST(FileCopy, SyncsOnlyDurableWrites) {
  const SourceFile source(100);
  const ScopedFd fd(kshard::detail::open_or_throw(source.path, O_RDONLY));
  kshard::io::reset_io_stats();
  kshard::detail::fsync_or_throw(fd.get(), source.path);
  EXPECT_EQ(kshard::io::io_stats().syncs, 1);
  {
    const kshard::detail::DurabilityScope scope(kshard::io::Durability::page_cache);
    kshard::detail::fsync_or_throw(fd.get(), source.path);
    EXPECT_EQ(kshard::io::io_stats().syncs, 1);
    EXPECT_FALSE(kshard::detail::syncing());
  }
  EXPECT_TRUE(kshard::detail::syncing());
  kshard::detail::fsync_or_throw(fd.get(), source.path);
  EXPECT_EQ(kshard::io::io_stats().syncs, 2);
}

}  // namespace
