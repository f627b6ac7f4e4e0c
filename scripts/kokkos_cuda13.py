#!/usr/bin/env python3
"""Adapts a Kokkos 4.6 source tree to CUDA 13, in place (used by scripts/device-bench).

Kokkos 4.6 predates CUDA 13, whose runtime API changed three calls Kokkos makes in
core/src/Cuda/Kokkos_Cuda_Instance.hpp: cudaGraphAddDependencies gained an edge-data argument,
cudaMemAdvise and cudaMemPrefetchAsync take a cudaMemLocation instead of a device number (and
the prefetch a flags word). Each call is put under `#if CUDART_VERSION >= 13000`, so the tree
still builds with CUDA 12. nvcc_wrapper 4.6 defaults to sm_70, which nvcc 13 dropped: its
default becomes sm_90 (H100/H200), which CMake's compiler check uses. A tree already adapted, or
a newer Kokkos that needs none of this, is left as it is.

usage: kokkos_cuda13.py KOKKOS_SOURCE_DIR
"""
import os
import sys

LOCATION = """    cudaMemLocation location{{}};
    location.type = {device} == cudaCpuDeviceId ? cudaMemLocationTypeHost
                                                : cudaMemLocationTypeDevice;
    location.id = {device} == cudaCpuDeviceId ? 0 : {device};
"""

CALLS = [
    ("    return cudaGraphAddDependencies(graph, from, to, numDependencies);\n",
     "    return cudaGraphAddDependencies(graph, from, to, nullptr, numDependencies);\n"),
    ("    return cudaMemAdvise(devPtr, count, advice, device);\n",
     LOCATION.format(device="device") +
     "    return cudaMemAdvise(devPtr, count, advice, location);\n"),
    ("    return cudaMemPrefetchAsync(devPtr, count, dstDevice,\n"
     "                                get_input_stream(stream));\n",
     LOCATION.format(device="dstDevice") +
     "    return cudaMemPrefetchAsync(devPtr, count, location, 0,\n"
     "                                get_input_stream(stream));\n"),
]


def adapt(path, old, new):
    with open(path) as f:
        text = f.read()
    if new in text or old not in text:  # adapted already, or a Kokkos that needs none of it
        return False
    text = text.replace(old, f"#if CUDART_VERSION >= 13000\n{new}#else\n{old}#endif\n", 1)
    with open(path, "w") as f:
        f.write(text)
    return True


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    source = sys.argv[1]
    instance = os.path.join(source, "core/src/Cuda/Kokkos_Cuda_Instance.hpp")
    wrapper = os.path.join(source, "bin/nvcc_wrapper")
    if not (os.path.isfile(instance) and os.path.isfile(wrapper)):
        sys.exit(f"kokkos_cuda13.py: '{source}' is not a Kokkos source tree (no {instance})")
    changed = sum(adapt(instance, old, new) for old, new in CALLS)
    with open(wrapper) as f:
        text = f.read()
    if 'default_arch="sm_70"' in text:
        with open(wrapper, "w") as f:
            f.write(text.replace('default_arch="sm_70"', 'default_arch="sm_90"', 1))
        changed += 1
    print(f"kokkos_cuda13.py: {changed} change(s) in '{source}'")


if __name__ == "__main__":
    main()
