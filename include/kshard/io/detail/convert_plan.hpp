#pragma once

// What a conversion writes (io::convert_checkpoint), computed alike on every rank from the
// checkpoint's stored tensors and the options, before any byte moves: each output file's name,
// header and the box of the global tensor each of its tensors holds. Consolidated Hugging Face
// files hold whole tensors, split into files at a maximum size; per-rank shards hold, for each
// rank of a chosen mesh, that rank's box of each tensor its layout gives it a first copy of.
// Pure arithmetic: no I/O.

#include <fnmatch.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kshard/axis_split.hpp"
#include "kshard/error.hpp"
#include "kshard/io/checkpoint.hpp"
#include "kshard/io/convert_options.hpp"
#include "kshard/io/detail/sharding_info.hpp"
#include "kshard/io/safetensors_header.hpp"
#include "kshard/io/stored_tensor.hpp"
#include "kshard/layout_dispatch.hpp"
#include "kshard/layout_mapping.hpp"

namespace kshard::detail {

// One tensor of an output file: the box `[offsets, offsets + shape)` of a stored tensor, its
// bytes (row-major) at `at` of the file.
struct OutputTensor {
  const io::StoredTensor* tensor = nullptr;
  std::vector<std::int64_t> offsets;
  std::vector<std::int64_t> shape;
  std::uint64_t at = 0;

  [[nodiscard]] std::uint64_t bytes() const {
    return byte_count(tensor->name, tensor->dtype, shape);
  }
};

// Bytes of an output file that are not tensor data (a safetensors header, a DCP item's ZIP
// records), which rank 0 writes when it creates the file.
struct FileBytes {
  std::uint64_t at = 0;
  std::vector<std::byte> bytes;
};

// A value of the checkpoint copied as bytes to `at` of an output file (a DCP bytes item).
struct OutputItem {
  const io::StoredItem* item = nullptr;
  std::uint64_t at = 0;
};

// One output file: its name in the output folder, its size, the bytes rank 0 writes, its
// tensors in the order of their bytes and the items it carries. `archives`: each tensor is the
// storage of a torch.save archive, whose ZIP records hold the CRC-32 of its bytes.
struct OutputFile {
  std::string name;
  std::uint64_t size = 0;
  std::vector<FileBytes> framing;
  std::vector<OutputTensor> tensors;
  std::vector<OutputItem> items;
  bool archives = false;
};

// The safetensors file holding `tensors` in that order, with `metadata`.
inline OutputFile output_file(std::string name, std::vector<OutputTensor> tensors,
                              std::map<std::string, std::string> metadata) {
  std::vector<io::TensorSpec> specs;
  for (const OutputTensor& t : tensors) specs.push_back({t.tensor->name, t.tensor->dtype, t.shape});
  const io::SafetensorsHeader header = io::make_safetensors_header(specs, std::move(metadata));
  for (OutputTensor& t : tensors) t.at = header.data_offset + header.find(t.tensor->name)->begin;
  return {std::move(name),
          header.data_offset + header.data_size,
          {{0, io::serialize_safetensors_header(header)}},
          std::move(tensors),
          {},
          false};
}

// Consolidated Hugging Face files: whole tensors in `tensors`' order, a new file begun where the
// next tensor would pass `max_bytes` (a larger tensor has a file of its own): `model.safetensors`
// alone, or `model-0000i-of-0000n.safetensors`.
inline std::vector<OutputFile> plan_hf(const std::vector<const io::StoredTensor*>& tensors,
                                       std::uint64_t max_bytes) {
  std::vector<std::vector<OutputTensor>> groups(1);
  std::uint64_t bytes = 0;
  for (const io::StoredTensor* tensor : tensors) {
    const std::uint64_t size = tensor->bytes();
    if (!groups.back().empty() && size > max_bytes - std::min(max_bytes, bytes)) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(
        {tensor, std::vector<std::int64_t>(tensor->shape.size(), 0), tensor->shape, 0});
    bytes += size;
  }
  std::vector<OutputFile> files;
  for (std::size_t i = 0; i < groups.size(); ++i)
    files.push_back(output_file(
        groups.size() == 1 ? std::string("model.safetensors")
                           : fmt::format("model-{:05}-of-{:05}.safetensors", i + 1, groups.size()),
        std::move(groups[i]), {{"format", "pt"}}));
  return files;
}

// The text of model.safetensors.index.json for consolidated `files`.
inline std::string hf_index_text(const std::vector<OutputFile>& files) {
  nlohmann::ordered_json index;
  std::uint64_t total = 0;
  nlohmann::json weight_map = nlohmann::json::object();
  for (const OutputFile& file : files)
    for (const OutputTensor& t : file.tensors) {
      weight_map[t.tensor->name] = file.name;
      total += t.bytes();
    }
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = std::move(weight_map);
  return index.dump(2) + "\n";
}

// The layout `plan` gives tensor `name`: the first pattern it matches, else the default.
inline const std::vector<PlacementSpec>& layout_for(const io::ShardingPlan& plan,
                                                    const std::string& name) {
  for (const auto& [pattern, layout] : plan.layout_for)
    if (::fnmatch(pattern.c_str(), name.c_str(), 0) == 0) return layout;
  return plan.layout;
}

// The box rank `coords` of a mesh of `shape` holds of `tensor` under `layout`, or nothing where
// it holds no first copy (a mesh dimension that does not split the tensor, and its coordinate is
// not 0). Refuses a layout that gives a rank indices that are not one run of a dimension (a
// per-rank file holds one box per tensor).
inline std::optional<OutputTensor> rank_box(const io::StoredTensor& tensor,
                                            const std::vector<PlacementSpec>& layout,
                                            const std::vector<int>& shape,
                                            const std::vector<int>& coords) {
  const std::size_t rank = tensor.shape.size();
  std::vector<AxisMap<8>> axes;
  for (const std::int64_t extent : tensor.shape) axes.emplace_back(extent);
  for (std::size_t m = 0; m < layout.size(); ++m) {
    const PlacementSpec& p = layout[m];
    const bool splits = p.tensor_dim >= 0 && static_cast<std::size_t>(p.tensor_dim) < rank;
    if (!splits) {
      if (coords[m] != 0) return std::nullopt;
      continue;
    }
    AxisMap<8>& axis = axes[static_cast<std::size_t>(p.tensor_dim)];
    const index_t factor = p.kind == PlacementKind::strided_shard ? p.split_factor : 1;
    axis.add_split(AxisSplit::chunked(axis.local_extent(), factor, shape[m], coords[m]));
  }
  OutputTensor box{&tensor, {}, {}, 0};
  for (std::size_t d = 0; d < rank; ++d) {
    if (!axes[d].is_contiguous())
      throw_io_error("the layout gives a rank indices of dimension ", d, " of tensor ",
                     in_quotes(tensor.name),
                     " that are not one run; a per-rank file holds one "
                     "box of each tensor");
    box.offsets.push_back(axes[d].global_offset());
    box.shape.push_back(axes[d].local_extent());
  }
  return box;
}

// The DCP_SHARDING_INFO of a shard holding `tensors`, as torch writes it.
inline std::map<std::string, std::string> shard_metadata(const std::vector<OutputTensor>& tensors) {
  nlohmann::json info = nlohmann::json::object();
  for (const OutputTensor& t : tensors) info[t.tensor->name] = {{saved_offsets_key, t.offsets}};
  return {{std::string(sharding_info_key), info.dump()}, {"DCP_VERSION", "1.0"}, {"format", "pt"}};
}

// The boxes of each rank of a split, in the order of their bytes: (rank, boxes).
using RankBoxes = std::vector<std::pair<std::int64_t, std::vector<OutputTensor>>>;

// The boxes each rank of `plan`'s mesh holds a first copy of, in `tensors`' order (empty ones
// too, as torch saves them), for the ranks holding any.
inline RankBoxes rank_boxes(const std::vector<const io::StoredTensor*>& tensors,
                            const io::ShardingPlan& plan) {
  std::int64_t world = 1;
  for (const int extent : plan.mesh) world *= extent;
  RankBoxes ranks;
  std::vector<int> coords(plan.mesh.size());
  for (std::int64_t r = 0; r < world; ++r) {
    for (std::size_t m = plan.mesh.size(), rest = static_cast<std::size_t>(r); m-- > 0;) {
      coords[m] = static_cast<int>(rest % static_cast<std::size_t>(plan.mesh[m]));
      rest /= static_cast<std::size_t>(plan.mesh[m]);
    }
    std::vector<OutputTensor> held;
    for (const io::StoredTensor* tensor : tensors)
      if (auto box = rank_box(*tensor, layout_for(plan, tensor->name), plan.mesh, coords))
        held.push_back(std::move(*box));
    if (!held.empty()) ranks.emplace_back(r, std::move(held));
  }
  return ranks;
}

// The split `model` is stored in: each data file (as a rank) with its pieces by their place in
// it (files holding no piece too).
inline RankBoxes stored_split(const io::Checkpoint& model) {
  RankBoxes files;
  for (std::size_t f = 0; f < model.data_files().size(); ++f) {
    std::vector<std::pair<std::uint64_t, OutputTensor>> placed;
    for (const auto& name : model.tensor_names())
      for (const io::StoredPiece& piece : model.tensor(name).pieces)
        if (piece.file == f)
          placed.push_back(
              {piece.file_offset, {&model.tensor(name), piece.offsets, piece.shape, 0}});
    std::sort(placed.begin(), placed.end(),
              [](const auto& x, const auto& y) { return x.first < y.first; });
    std::vector<OutputTensor> boxes;
    for (auto& [offset, box] : placed) boxes.push_back(std::move(box));
    files.emplace_back(static_cast<std::int64_t>(f), std::move(boxes));
  }
  return files;
}

// The split of `options` for per-rank output: its mesh's, or without one the stored split.
inline RankBoxes output_split(const io::Checkpoint& model, const io::ShardingPlan& plan) {
  if (plan.mesh.empty()) return stored_split(model);
  std::vector<const io::StoredTensor*> tensors;
  for (const auto& name : model.tensor_names()) tensors.push_back(&model.tensor(name));
  return rank_boxes(tensors, plan);
}

// Per-rank shards of `split`: a file per rank holding boxes
// (`shard-0000{r+1}-model-00001-of-00001.safetensors`, as torch and NeMo AutoModel name them).
inline std::vector<OutputFile> plan_shards(RankBoxes split) {
  std::vector<OutputFile> files;
  for (auto& [rank, held] : split) {
    if (held.empty()) continue;
    auto metadata = shard_metadata(held);
    files.push_back(
        output_file(fmt::format("shard-{:05}-model-00001-of-00001.safetensors", rank + 1),
                    std::move(held), std::move(metadata)));
  }
  return files;
}

// The checkpoint's own files: each file's tensors (in its header's order) as the pieces it
// holds, its metadata kept.
inline std::vector<OutputFile> plan_as_stored(const io::Checkpoint& model) {
  std::vector<OutputFile> files;
  for (std::size_t f = 0; f < model.files().size(); ++f) {
    const io::SafetensorsFile& file = model.files()[f];
    std::vector<OutputTensor> held;
    for (const io::TensorEntry& entry : file.header().tensors) {
      if (!model.contains(entry.name)) continue;  // not in the index: not the checkpoint's
      const io::StoredTensor& tensor = model.tensor(entry.name);
      for (const io::StoredPiece& piece : tensor.pieces)
        if (piece.file == f) held.push_back({&tensor, piece.offsets, piece.shape, 0});
    }
    files.push_back(
        output_file(file.path().filename().string(), std::move(held), file.header().metadata));
  }
  return files;
}

}  // namespace kshard::detail
