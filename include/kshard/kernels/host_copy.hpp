#pragma once

// Host copies that kshard's operations make and free before they return, in memory Kokkos
// does not own: Kokkos 4 and later fence every instance of the device (a global fence) whenever
// they free HostSpace memory, which would stall the caller's other instances (streams) on each
// host copy an operation frees.

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace kshard::detail {

// Asks Linux to back the 2 MiB pages that lie wholly within the `bytes` at `data` with
// transparent huge pages, before they are first touched. A buffer filled once and freed
// otherwise pays a page fault per 4 KiB: a checkpoint's 23 MB row block took 17.8 ms to read
// into fresh memory and 5 ms into touched memory, and its column read went from 1.31x to 0.88x
// a pread loop's time with this advice (2 ranks). With THP set to "madvise" (many distributions'
// default) only memory that asks gets huge pages; with "never" this does nothing. Only advice:
// an error (e.g. no THP in the kernel) changes nothing and is ignored.
inline void advise_huge_pages([[maybe_unused]] void* data, [[maybe_unused]] std::size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr std::uintptr_t huge = std::uintptr_t{2} << 20;
  const auto start = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t begin = (start + huge - 1) & ~(huge - 1);
  const std::uintptr_t end = (start + bytes) & ~(huge - 1);
  if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#endif
}

// The unmanaged host view with the shape and element type of `View`.
template <class View>
using host_copy_view_t =
    Kokkos::View<typename View::non_const_data_type, typename View::array_layout, Kokkos::HostSpace,
                 Kokkos::MemoryUnmanaged>;

template <class T>
struct HostStorage {
  std::unique_ptr<T[]> storage;
};

// An uninitialised host view shaped like `like` that owns its elements (outside Kokkos); moving
// keeps them in place. The storage is a base so that it exists before the view is made.
template <class View>
class HostCopy : private HostStorage<typename View::non_const_value_type>,
                 public host_copy_view_t<View> {
 public:
  explicit HostCopy(const View& like)
      : HostStorage<typename View::non_const_value_type>{std::make_unique_for_overwrite<
            typename View::non_const_value_type[]>(like.span())},
        host_copy_view_t<View>(this->storage.get(), like.layout()) {
    advise_huge_pages(this->storage.get(), like.span() * sizeof(typename View::value_type));
  }
};

// Host memory with the shape of `view` for the host to fill or read: `view` itself when the host
// can access it, else a HostCopy (nothing is copied either way).
template <class View>
auto host_mirror(const View& view) {
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                           typename View::memory_space>::accessible)
    return view;
  else
    return HostCopy<View>(view);
}

}  // namespace kshard::detail
