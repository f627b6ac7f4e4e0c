#pragma once

/// \file
/// The whole of kshard: `#include <kshard/kshard.hpp>`.

/// \namespace kshard
/// Distributed matrices on Kokkos and MPI: meshes, placements and layouts, `DistMatrix`, layout
/// changes, rowwise algorithms, embedding repair and tensor-parallel layers. Everything in
/// `kshard::detail` is internal.

#include "kshard/bfloat16.hpp"
#include "kshard/comm/stats.hpp"
#include "kshard/dist_matrix.hpp"
#include "kshard/distribute.hpp"
#include "kshard/error.hpp"
#include "kshard/float16.hpp"
#include "kshard/format.hpp"
#include "kshard/index.hpp"
#include "kshard/layout_dispatch.hpp"
#include "kshard/layout_mapping.hpp"
#include "kshard/log.hpp"
#include "kshard/mesh.hpp"
#include "kshard/placement.hpp"
#include "kshard/redistribute.hpp"
#include "kshard/repair.hpp"
#include "kshard/rowwise.hpp"
#include "kshard/tensor_parallel.hpp"
#include "kshard/watchdog.hpp"
