#pragma once

/// \file
/// What `io::convert_checkpoint` writes: the output's form, and for per-rank shards or DCP the
/// mesh and layouts of the job that would have written them.

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kshard/io/model/durability.hpp"
#include "kshard/layout_dispatch.hpp"

namespace kshard::io {

/// The form a conversion writes.
enum class OutputForm : std::uint8_t {
  hf,  ///< consolidated Hugging Face: whole tensors, `model.safetensors` or split files + index
  sharded,   ///< per-rank shards, as a job on `ShardingPlan::mesh` writes them
  dcp,       ///< a PyTorch DCP folder, as `dcp.save` on `ShardingPlan::mesh` writes it
  as_stored  ///< the input's own files and pieces (a copy; with row patches, a repaired copy)
};

/// How per-rank shards (or a DCP) split the tensors: the mesh of the job that would have written
/// them, its layout (one placement per mesh dimension: `Replicate()`, `Shard(d)` or
/// `StridedShard(d, sf)`; a placement of a dimension a tensor lacks leaves it replicated), and the
/// layouts of tensors whose names match a glob pattern (`*q_proj*`), the first match winning, as
/// tensor-parallel plans give column-wise and row-wise layouts per module.
struct ShardingPlan {
  /// The job's mesh shape; empty: the split the input is stored in (each of its data files'
  /// pieces as a rank's)
  std::vector<int> mesh;
  std::vector<PlacementSpec> layout;  ///< one placement per mesh dimension
  std::vector<std::pair<std::string, std::vector<PlacementSpec>>> layout_for;  ///< per pattern
};

/// The options of a conversion.
struct ConvertOptions {
  OutputForm form = OutputForm::hf;  ///< what to write
  /// The largest consolidated file (a larger tensor gets a file of its own); 5 GB, Hugging
  /// Face's default.
  std::uint64_t max_shard_bytes = 5'000'000'000;
  ShardingPlan sharding;  ///< the split of per-rank output
  /// The largest buffer a rank holds while it moves bytes.
  std::uint64_t buffer_bytes = std::uint64_t{64} << 20;
  /// Whether every file is fsynced before the folder takes its name (see Durability).
  Durability durability = Durability::fsync;
  /// Called on rank 0 as bytes are written (its bytes scaled to all ranks, and the total).
  std::function<void(std::uint64_t done, std::uint64_t total)> progress;
};

}  // namespace kshard::io
