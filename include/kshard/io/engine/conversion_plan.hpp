#pragma once

// What a conversion writes (io::convert_checkpoint), computed alike on every rank from the
// checkpoint's stored tensors and the options, before any byte moves: each output file's name,
// size, framing bytes and the box of the global tensor each of its tensors holds, and which boxes
// each rank of a chosen mesh holds a first copy of. The formats lay the files out
// (io/formats/<name>/plan.hpp); the byte mover fills them. Pure arithmetic: no I/O.

#include <fnmatch.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kshard/axis_split.hpp"
#include "kshard/error.hpp"
#include "kshard/io/model/convert_options.hpp"
#include "kshard/io/model/stored_tensor.hpp"
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
inline RankBoxes stored_split(const io::StoredContents& model) {
  RankBoxes files;
  for (std::size_t f = 0; f < model.data_files.size(); ++f) {
    std::vector<std::pair<std::uint64_t, OutputTensor>> placed;
    for (const auto& [name, tensor] : model.tensors)
      for (const io::StoredPiece& piece : tensor.pieces)
        if (piece.file == f)
          placed.push_back({piece.file_offset, {&tensor, piece.offsets, piece.shape, 0}});
    std::sort(placed.begin(), placed.end(),
              [](const auto& x, const auto& y) { return x.first < y.first; });
    std::vector<OutputTensor> boxes;
    for (auto& [offset, box] : placed) boxes.push_back(std::move(box));
    files.emplace_back(static_cast<std::int64_t>(f), std::move(boxes));
  }
  return files;
}

// The split of `options` for per-rank output: its mesh's, or without one the stored split.
inline RankBoxes output_split(const io::StoredContents& model, const io::ShardingPlan& plan) {
  if (plan.mesh.empty()) return stored_split(model);
  std::vector<const io::StoredTensor*> tensors;
  for (const auto& [name, tensor] : model.tensors) tensors.push_back(&tensor);
  return rank_boxes(tensors, plan);
}

}  // namespace kshard::detail
