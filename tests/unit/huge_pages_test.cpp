// detail::advise_huge_pages: on Linux with transparent huge pages available, fresh memory it
// advised is backed by huge pages once touched (read off /proc/self/smaps), and its advice covers
// only the 2 MiB pages wholly inside the buffer (memory beside it keeps its own pages).

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "kshard/kernels/host_copy.hpp"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace {

#if defined(__linux__) && defined(MADV_HUGEPAGE)
constexpr std::size_t huge = std::size_t{2} << 20;

// The THP mode in force ("always", "madvise" or "never"), or "" where the kernel has none.
std::string thp_mode() {
  std::ifstream file("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(file, line);
  const auto open = line.find('['), close = line.find(']');
  return open == std::string::npos ? "" : line.substr(open + 1, close - open - 1);
}

// AnonHugePages (kB) of the mapping that starts at `start`, from /proc/self/smaps.
long huge_kib_of_mapping(const void* start) {
  std::ifstream smaps("/proc/self/smaps");
  std::ostringstream header;
  header << std::hex << reinterpret_cast<std::uintptr_t>(start) << '-';
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    if (line.find('-') != std::string::npos && line.find(':') > line.find('-') &&
        line.find(' ') > line.find('-'))
      inside = line.rfind(header.str(), 0) == 0;
    if (inside && line.rfind("AnonHugePages:", 0) == 0) return std::stol(line.substr(14));
  }
  return -1;
}

TEST(HugePages, AdvisedFreshMemoryGetsHugePages) {
  if (thp_mode() != "madvise" && thp_mode() != "always")
    GTEST_SKIP() << "transparent huge pages are off here";
  // 8 MiB mapped privately and aligned to 2 MiB by hand, so that its mapping is its own.
  const std::size_t bytes = 8 * huge;
  void* raw =
      ::mmap(nullptr, bytes + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(raw, MAP_FAILED);
  auto* aligned = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(raw) + huge - 1) &
                                          ~std::uintptr_t{huge - 1});
  ::munmap(raw, static_cast<std::size_t>(aligned - static_cast<char*>(raw)));
  // A buffer that starts 1 KiB into the first 2 MiB page and ends 1 KiB into the last: only the
  // six pages in between are wholly inside it.
  char* buffer = aligned + 1024;
  kshard::detail::advise_huge_pages(buffer, 7 * huge);
  std::memset(aligned, 1, bytes);
  // The advice splits the mapping where it starts: the advised part is the one at aligned + 2 MiB.
  const long kib = huge_kib_of_mapping(aligned + huge);
  if (thp_mode() == "madvise") {  // the first page is only partly inside: no advice, no huge page
    EXPECT_LE(huge_kib_of_mapping(aligned), 0) << "the page only partly inside was advised";
  }
  EXPECT_GE(kib, 2048) << "no huge page backs the advised buffer";
  ::munmap(aligned, bytes);
}
#endif

TEST(HugePages, SmallOrUnalignedBuffersAreLeftAlone) {
  // Less than one whole 2 MiB page: no advice, and the memory is untouched and usable.
  std::string text(4096, 'k');
  kshard::detail::advise_huge_pages(text.data(), text.size());
  EXPECT_EQ(text, std::string(4096, 'k'));
}

}  // namespace
