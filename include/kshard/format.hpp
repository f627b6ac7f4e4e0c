#pragma once

/// \file
/// {fmt} formatters for placements, layouts, meshes and matrices, and a text picture of
/// which mesh coordinates hold which block of a matrix (in the spirit of JAX's
/// `visualize_array_sharding`).
///
/// With this header, `fmt::format("{}", x)` (no format spec) prints a placement as
/// `Replicate()`, `Shard(0)`, `StridedShard(0, sf=2)` or `Partial(sum)` (a custom placement as
/// `Name(dimension, factor)`), a layout as
/// `(StridedShard(0, sf=2), Shard(0))`, a mesh as `Mesh(dp=2, tp=2)` and a matrix as
/// `DistMatrix<float>[10 x 6] (Replicate(), Shard(0)) on Mesh(dp=2, tp=2)`. None communicates.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (moved here in fmt 11)

#include "kshard/bfloat16.hpp"
#include "kshard/comm/agreement.hpp"
#include "kshard/dist_matrix.hpp"
#include "kshard/float16.hpp"
#include "kshard/layout_dispatch.hpp"
#include "kshard/layout_mapping.hpp"
#include "kshard/matrix_agreement.hpp"
#include "kshard/mesh.hpp"
#include "kshard/placement.hpp"

namespace kshard::detail {

// Formatters that take no format spec: "{}" only.
struct plain_formatter {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
};

template <class T>
constexpr std::string_view element_name() {
  if constexpr (TableElement<T>)
    return element_info<T>().name;
  else
    return "T";
}

inline std::string index_range(index_t begin, index_t end) {
  return end - begin == 1 ? fmt::format("{}", begin) : fmt::format("{}-{}", begin, end - 1);
}

// Boundaries of the blocks every coordinate's runs cut the axis into, capped at `max_blocks`.
template <std::size_t N>
std::vector<index_t> block_bounds(const std::vector<LayoutMapping<N>>& maps, int d, index_t extent,
                                  std::size_t max_blocks) {
  std::vector<index_t> bounds{0, extent};
  for (const auto& map : maps)
    for (const IndexRun& run : map.axis(d).runs()) {
      bounds.push_back(run.global_begin);
      bounds.push_back(run.global_end());
    }
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  if (bounds.size() > max_blocks + 1) bounds.resize(max_blocks + 1);
  return bounds;
}

// The coordinates of every rank of a mesh of `shape`, in rank order.
template <std::size_t N>
std::vector<std::array<int, N>> all_coordinates(const std::array<int, N>& shape) {
  int size = 1;
  for (int e : shape) size *= e;
  std::vector<std::array<int, N>> coords;
  for (int r = 0; r < size; ++r) coords.push_back(mesh_coords(shape, r));
  return coords;
}

// Coordinates as the picture prints them: "(0,1)".
template <std::size_t N>
std::string coordinates_text(const std::array<int, N>& coords) {
  return fmt::format("({})", fmt::join(coords, ","));
}

// The labels of the blocks between consecutive `bounds` of one axis: "rows 0-3", "cols 4".
inline std::vector<std::string> block_labels(std::string_view axis,
                                             const std::vector<index_t>& bounds) {
  std::vector<std::string> labels;
  for (std::size_t i = 0; i + 1 < bounds.size(); ++i)
    labels.push_back(fmt::format("{} {}", axis, index_range(bounds[i], bounds[i + 1])));
  return labels;
}

// The text of each block, row-major: the coordinates holding it, "(0,1) (1,1)".
template <std::size_t N>
std::vector<std::string> holder_cells(const std::vector<LayoutMapping<N>>& maps,
                                      const std::vector<std::array<int, N>>& coords,
                                      const std::vector<index_t>& row_bounds,
                                      const std::vector<index_t>& col_bounds) {
  std::vector<std::string> cells;
  for (std::size_t i = 0; i + 1 < row_bounds.size(); ++i)
    for (std::size_t j = 0; j + 1 < col_bounds.size(); ++j) {
      std::vector<std::string> holders;
      for (std::size_t r = 0; r < maps.size(); ++r)
        if (maps[r].rows.is_local(row_bounds[i]) && maps[r].cols.is_local(col_bounds[j]))
          holders.push_back(coordinates_text(coords[r]));
      cells.push_back(fmt::format("{}", fmt::join(holders, " ")));
    }
  return cells;
}

// The length of the longest of `texts`, at least `least`.
inline std::size_t widest(const std::vector<std::string>& texts, std::size_t least) {
  for (const std::string& text : texts) least = std::max(least, text.size());
  return least;
}

// The table of the blocks: a line of column labels, then a line per row of blocks (`cells`,
// row-major), each ruled below.
inline std::string block_table(const std::vector<std::string>& row_labels,
                               const std::vector<std::string>& col_labels,
                               const std::vector<std::string>& cells) {
  const std::size_t width = std::max(widest(cells, 4), widest(col_labels, 0));
  const std::size_t label_width = widest(row_labels, 0);
  const std::size_t ncols = col_labels.size();
  std::string rule = fmt::format("{:{}}+", "", label_width + 1);
  for (std::size_t j = 0; j < ncols; ++j) rule += std::string(width + 2, '-') + "+";
  std::string out(label_width + 2, ' ');
  for (const std::string& label : col_labels) out += fmt::format(" {:<{}} ", label, width + 1);
  out += "\n" + rule + "\n";
  for (std::size_t i = 0; i < row_labels.size(); ++i) {
    out += fmt::format("{:<{}} |", row_labels[i], label_width);
    for (std::size_t j = 0; j < ncols; ++j)
      out += fmt::format(" {:<{}} |", cells[i * ncols + j], width);
    out += "\n" + rule + "\n";
  }
  return out;
}

}  // namespace kshard::detail

namespace kshard {

/// Maximum number of row (and column) blocks `sharding_picture` draws.
inline constexpr std::size_t picture_max_blocks = 16;

/// A text table of the `rows x cols` matrix cut into the blocks the layout makes; each cell
/// lists the mesh coordinates that hold it (replicas and all). No communication.
template <class L, std::size_t N>
std::string sharding_picture(const L& layout, const std::array<int, N>& mesh_shape,
                             const std::array<std::string, N>& mesh_names, index_t rows,
                             index_t cols) {
  static_assert(L::rank == N, "kshard::sharding_picture: layout length differs from mesh rank");
  const auto coords = detail::all_coordinates(mesh_shape);
  std::vector<LayoutMapping<N>> maps;
  std::vector<std::string> empty;
  for (const auto& c : coords) {
    maps.push_back(map_layout(layout.actions(), mesh_shape, c, rows, cols));
    if (maps.back().local_size() == 0) empty.push_back(detail::coordinates_text(c));
  }
  const auto row_bounds = detail::block_bounds(maps, 0, rows, picture_max_blocks);
  const auto col_bounds = detail::block_bounds(maps, 1, cols, picture_max_blocks);
  std::string out = fmt::format("{} x {} matrix, cells list mesh coordinates ({})\n", rows, cols,
                                fmt::join(mesh_names, ", "));
  out += detail::block_table(detail::block_labels("rows", row_bounds),
                             detail::block_labels("cols", col_bounds),
                             detail::holder_cells(maps, coords, row_bounds, col_bounds));
  if (!empty.empty() && rows * cols > 0)
    out += fmt::format("empty shards: {}\n", fmt::join(empty, " "));
  if (row_bounds.back() < rows || col_bounds.back() < cols)
    out += fmt::format("(first {} blocks per axis shown)\n", picture_max_blocks);
  return out;
}

/// The picture of `matrix`'s layout on its mesh.
template <class T, class L, class E, class S>
std::string sharding_picture(const DistMatrix<T, L, E, S>& matrix) {
  return sharding_picture(matrix.layout(), matrix.mesh().shape(), matrix.mesh().names(),
                          matrix.rows(), matrix.cols());
}

}  // namespace kshard

/// @cond INTERNAL
template <>
struct fmt::formatter<kshard::Replicate> : kshard::detail::plain_formatter {
  template <class Ctx>
  auto format(const kshard::Replicate&, Ctx& ctx) const {
    return fmt::format_to(ctx.out(), "{}", kshard::to_string(kshard::PlacementSpec{}));
  }
};

template <int D>
struct fmt::formatter<kshard::Shard<D>> : kshard::detail::plain_formatter {
  template <class Ctx>
  auto format(const kshard::Shard<D>&, Ctx& ctx) const {
    return fmt::format_to(ctx.out(), "{}", kshard::to_string({kshard::PlacementKind::shard, D}));
  }
};

template <int D>
struct fmt::formatter<kshard::StridedShard<D>> : kshard::detail::plain_formatter {
  template <class Ctx>
  auto format(const kshard::StridedShard<D>& p, Ctx& ctx) const {
    return fmt::format_to(
        ctx.out(), "{}",
        kshard::to_string({kshard::PlacementKind::strided_shard, D, p.split_factor()}));
  }
};

template <kshard::ReduceOp Op>
struct fmt::formatter<kshard::Partial<Op>> : kshard::detail::plain_formatter {
  template <class Ctx>
  auto format(const kshard::Partial<Op>&, Ctx& ctx) const {
    return fmt::format_to(ctx.out(), "{}",
                          kshard::to_string({kshard::PlacementKind::partial, -1, 1, Op}));
  }
};

// A placement defined outside kshard prints as its name, tensor dimension and factor.
template <kshard::Placement P>
requires(P::kind == kshard::PlacementKind::custom) struct fmt::formatter<P>
    : kshard::detail::plain_formatter {
  template <class Ctx>
  auto format(const P& p, Ctx& ctx) const {
    return fmt::format_to(ctx.out(), "{}({}, {})", P::name, P::tensor_dim, p.split_factor());
  }
};

template <class... Ps>
struct fmt::formatter<kshard::Layout<Ps...>> : kshard::detail::plain_formatter {
  template <class Ctx>
  auto format(const kshard::Layout<Ps...>& layout, Ctx& ctx) const {
    return format_each(layout, ctx, std::index_sequence_for<Ps...>{});
  }

 private:
  template <class Ctx, std::size_t... M>
  static auto format_each(const kshard::Layout<Ps...>& layout, Ctx& ctx,
                          std::index_sequence<M...>) {
    auto out = fmt::format_to(ctx.out(), "(");
    ((out = fmt::format_to(out, "{}{}", M == 0 ? "" : ", ", layout.template get<M>())), ...);
    return fmt::format_to(out, ")");
  }
};

template <std::size_t N>
struct fmt::formatter<kshard::Mesh<N>> : kshard::detail::plain_formatter {
  template <class Ctx>
  auto format(const kshard::Mesh<N>& mesh, Ctx& ctx) const {
    return fmt::format_to(ctx.out(), "{}", kshard::detail::mesh_text(mesh));
  }
};

template <class T, class L, class E, class S>
struct fmt::formatter<kshard::DistMatrix<T, L, E, S>> : kshard::detail::plain_formatter {
  template <class Ctx>
  auto format(const kshard::DistMatrix<T, L, E, S>& matrix, Ctx& ctx) const {
    return fmt::format_to(ctx.out(), "DistMatrix<{}>[{} x {}] {} on {}",
                          kshard::detail::element_name<T>(), matrix.rows(), matrix.cols(),
                          matrix.layout(), matrix.mesh());
  }
};
/// @endcond
