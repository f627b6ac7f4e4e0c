#pragma once

/// \file
/// What `io::convert_checkpoint` writes: the output's form, and for per-rank shards or DCP the
/// mesh and layouts of the job that would have written them.

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
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

/// A form a command line may name (`kshard-convert --to`), with what it writes, for help texts.
struct NamedOutputForm {
  OutputForm form;          ///< the form
  std::string_view name;    ///< as a command line spells it
  std::string_view writes;  ///< what it writes, one phrase
  bool per_rank;            ///< split by a `ShardingPlan` (a mesh and its layouts)
};

/// The forms a command line may name, in the order help lists them (`as_stored` is none: it is
/// the input's own form).
inline constexpr std::array<NamedOutputForm, 3> named_output_forms{{
    {OutputForm::hf, "hf", "a consolidated Hugging Face model", false},
    {OutputForm::sharded, "sharded", "the per-rank shards a job on the chosen mesh writes", true},
    {OutputForm::dcp, "dcp", "the PyTorch DCP folder such a job's dcp.save writes", true},
}};

/// The name of `form` ("as_stored" for the input's own form).
constexpr std::string_view to_string(OutputForm form) {
  for (const NamedOutputForm& named : named_output_forms)
    if (named.form == form) return named.name;
  return "as_stored";
}

/// The form a command line names `name`, or nothing.
constexpr std::optional<OutputForm> output_form_named(std::string_view name) {
  for (const NamedOutputForm& named : named_output_forms)
    if (named.name == name) return named.form;
  return std::nullopt;
}

/// True for the forms split by a `ShardingPlan`: per-rank shards and DCP.
constexpr bool is_per_rank(OutputForm form) {
  for (const NamedOutputForm& named : named_output_forms)
    if (named.form == form) return named.per_rank;
  return false;
}

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
