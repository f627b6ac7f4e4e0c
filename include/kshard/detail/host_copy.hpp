#pragma once

// Host copies that kshard's operations make and free before they return, in memory Kokkos
// does not own: Kokkos 4 and later fence every instance of the device (a global fence) whenever
// they free HostSpace memory, which would stall the caller's other instances (streams) on each
// host copy an operation frees.

#include <Kokkos_Core.hpp>

#include <memory>

namespace kshard::detail {

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
        host_copy_view_t<View>(this->storage.get(), like.layout()) {}
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
