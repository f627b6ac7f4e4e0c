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
#include "kshard/layout_mapping.hpp"
#include "kshard/mesh.hpp"
#include "kshard/placement.hpp"

namespace kshard::detail {

// Formatters that take no format spec: "{}" only.
struct plain_formatter {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
};

template <class T>
constexpr std::string_view element_name() {
  if constexpr (std::is_same_v<T, float>)
    return "float";
  else if constexpr (std::is_same_v<T, double>)
    return "double";
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return "int32";
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return "int64";
  else if constexpr (std::is_same_v<T, bf16>)
    return "bf16";
  else if constexpr (std::is_same_v<T, f16>)
    return "f16";
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
  int size = 1;
  for (int e : mesh_shape) size *= e;
  std::vector<std::array<int, N>> coords(static_cast<std::size_t>(size));
  std::vector<LayoutMapping<N>> maps;
  for (int r = 0; r < size; ++r) {
    auto& c = coords[static_cast<std::size_t>(r)];
    for (std::size_t m = N, rest = static_cast<std::size_t>(r); m-- > 0;) {
      c[m] = static_cast<int>(rest % static_cast<std::size_t>(mesh_shape[m]));
      rest /= static_cast<std::size_t>(mesh_shape[m]);
    }
    maps.push_back(map_layout(layout.actions(), mesh_shape, c, rows, cols));
  }
  const auto row_bounds = detail::block_bounds(maps, 0, rows, picture_max_blocks);
  const auto col_bounds = detail::block_bounds(maps, 1, cols, picture_max_blocks);

  // Cell text: the holders' coordinates, "(0,1) (1,1)".
  std::vector<std::string> cells;
  std::size_t width = 4;
  for (std::size_t i = 0; i + 1 < row_bounds.size(); ++i)
    for (std::size_t j = 0; j + 1 < col_bounds.size(); ++j) {
      std::vector<std::string> holders;
      for (std::size_t r = 0; r < maps.size(); ++r)
        if (maps[r].rows.is_local(row_bounds[i]) && maps[r].cols.is_local(col_bounds[j]))
          holders.push_back(fmt::format("({})", fmt::join(coords[r], ",")));
      cells.push_back(fmt::format("{}", fmt::join(holders, " ")));
      width = std::max(width, cells.back().size());
    }
  std::vector<std::string> row_labels;
  std::size_t label_width = 0;
  for (std::size_t i = 0; i + 1 < row_bounds.size(); ++i) {
    row_labels.push_back("rows " + detail::index_range(row_bounds[i], row_bounds[i + 1]));
    label_width = std::max(label_width, row_labels.back().size());
  }
  for (std::size_t j = 0; j + 1 < col_bounds.size(); ++j)
    width = std::max(width, 5 + detail::index_range(col_bounds[j], col_bounds[j + 1]).size());

  std::string out = fmt::format("{} x {} matrix, cells list mesh coordinates ({})\n", rows, cols,
                                fmt::join(mesh_names, ", "));
  const std::size_t ncols = col_bounds.size() - 1;
  std::string rule = fmt::format("{:{}}+", "", label_width + 1);
  for (std::size_t j = 0; j < ncols; ++j) rule += std::string(width + 2, '-') + "+";
  out += std::string(label_width + 2, ' ');
  for (std::size_t j = 0; j < ncols; ++j)
    out += fmt::format(" {:<{}} ", "cols " + detail::index_range(col_bounds[j], col_bounds[j + 1]),
                       width + 1);
  out += "\n" + rule + "\n";
  for (std::size_t i = 0; i < row_labels.size(); ++i) {
    out += fmt::format("{:<{}} |", row_labels[i], label_width);
    for (std::size_t j = 0; j < ncols; ++j)
      out += fmt::format(" {:<{}} |", cells[i * ncols + j], width);
    out += "\n" + rule + "\n";
  }
  std::vector<std::string> empty;
  for (std::size_t r = 0; r < maps.size(); ++r)
    if (maps[r].local_size() == 0) empty.push_back(fmt::format("({})", fmt::join(coords[r], ",")));
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
    return fmt::format_to(ctx.out(), "Replicate()");
  }
};

template <int D>
struct fmt::formatter<kshard::Shard<D>> : kshard::detail::plain_formatter {
  template <class Ctx>
  auto format(const kshard::Shard<D>&, Ctx& ctx) const {
    return fmt::format_to(ctx.out(), "Shard({})", D);
  }
};

template <int D>
struct fmt::formatter<kshard::StridedShard<D>> : kshard::detail::plain_formatter {
  template <class Ctx>
  auto format(const kshard::StridedShard<D>& p, Ctx& ctx) const {
    return fmt::format_to(ctx.out(), "StridedShard({}, sf={})", D, p.split_factor());
  }
};

template <kshard::ReduceOp Op>
struct fmt::formatter<kshard::Partial<Op>> : kshard::detail::plain_formatter {
  template <class Ctx>
  auto format(const kshard::Partial<Op>&, Ctx& ctx) const {
    return fmt::format_to(ctx.out(), "Partial({})", kshard::to_string(Op));
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
