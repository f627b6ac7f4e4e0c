#pragma once

/// \file
/// Layouts chosen at run time: parse the spellings kshard prints (`Shard(0)`,
/// `(StridedShard(0, sf=2), Shard(0))`, `2x4`) and call a generic function with the matching
/// compile-time `Layout<...>`, so that a program reading layouts from its command line or a
/// config file need not spell out every instantiation:
///
/// \code
/// const std::vector<int> shape = kshard::parse_mesh_shape(argv[1]);          // "2x2"
/// const std::vector<kshard::PlacementSpec> specs = kshard::parse_layout(argv[2]);
/// kshard::dispatch_mesh_rank(shape.size(), [&](auto rank) {
///   constexpr std::size_t N = decltype(rank)::value;
///   kshard::dispatch_layout<N>(specs, [&](auto layout) { run(layout, shape); });
/// });
/// \endcode
///
/// Every parse error is a `kshard::error` naming the text, the 0-based position and what is
/// accepted there.

#include <array>
#include <charconv>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (moved here in fmt 11)

#include "kshard/error.hpp"
#include "kshard/index.hpp"
#include "kshard/placement.hpp"

namespace kshard {

/// A placement known only at run time, as `parse_placement` reads it and `dispatch_layout`
/// turns it into a placement type. Fields the kind does not use are ignored (the parsers leave
/// them at their defaults, so parsed specs compare equal to hand-built ones).
struct PlacementSpec {
  PlacementKind kind = PlacementKind::replicate;  ///< what the placement does
  int tensor_dim = -1;          ///< tensor dimension split (Shard and StridedShard)
  index_t split_factor = 1;     ///< number of pieces (StridedShard)
  ReduceOp op = ReduceOp::sum;  ///< pending reduction (Partial)

  /// Equal when every field is.
  friend constexpr bool operator==(const PlacementSpec&, const PlacementSpec&) = default;
};

namespace detail {

// The one spelling of a placement, as DTensor prints it; the split factor is left out where the
// caller does not know it (an agreement compares it as a value of its own).
inline std::string placement_text(PlacementKind kind, int tensor_dim,
                                  std::optional<index_t> split_factor, ReduceOp op) {
  switch (kind) {
    case PlacementKind::replicate:
      return "Replicate()";
    case PlacementKind::shard:
      return fmt::format("Shard({})", tensor_dim);
    case PlacementKind::strided_shard:
      return split_factor ? fmt::format("StridedShard({}, sf={})", tensor_dim, *split_factor)
                          : fmt::format("StridedShard({})", tensor_dim);
    case PlacementKind::partial:
      return fmt::format("Partial({})", to_string(op));
    case PlacementKind::custom:  // not parsed: a custom placement has its own spelling
      return fmt::format("a custom placement of dimension {}", tensor_dim);
  }
  return "?";
}

}  // namespace detail

/// The spelling kshard prints for the placement (`fmt::format("{}", placement)` of the matching
/// placement type): `Replicate()`, `Shard(0)`, `StridedShard(0, sf=2)` or `Partial(sum)`.
inline std::string to_string(const PlacementSpec& spec) {
  return detail::placement_text(spec.kind, spec.tensor_dim, spec.split_factor, spec.op);
}

}  // namespace kshard

namespace kshard::detail {

inline constexpr std::string_view placement_spellings =
    "Replicate(), Shard(D), StridedShard(D, sf=F) with F >= 1, Partial(sum|avg|max|min)";

// A cursor over text being parsed; every failure names the text, the position and what the
// caller accepts, so that a typo in a command line is found without reading the source.
class TextReader {
 public:
  TextReader(std::string_view text, std::string_view function, std::string_view accepted)
      : text_(text), function_(function), accepted_(accepted) {}

  [[noreturn]] void fail(std::size_t at, std::string_view expected, std::string_view found) const {
    throw error(
        fmt::format("kshard::{}: cannot read \"{}\" at position {}: expected {}, found {}; "
                    "accepted: {}",
                    function_, text_, at, expected, found, accepted_));
  }
  [[noreturn]] void fail(std::size_t at, std::string_view expected) const {
    fail(at, expected,
         at < text_.size() ? fmt::format("'{}'", text_[at]) : std::string("the end of the text"));
  }

  void skip_space() {
    while (pos_ < text_.size() && is_space(text_[pos_])) ++pos_;
  }
  // Consumes `c` (after white space) when it comes next.
  bool take(char c) {
    skip_space();
    if (pos_ == text_.size() || text_[pos_] != c) return false;
    ++pos_;
    return true;
  }
  void expect(char c) {
    if (!take(c)) fail(pos_, fmt::format("'{}'", c));
  }
  void expect_end(std::string_view expected) {
    skip_space();
    if (pos_ != text_.size()) fail(pos_, expected);
  }

  // The letters that come next (possibly none), and where they start.
  std::pair<std::string_view, std::size_t> word() {
    skip_space();
    const std::size_t start = pos_;
    while (pos_ < text_.size() && ((text_[pos_] >= 'a' && text_[pos_] <= 'z') ||
                                   (text_[pos_] >= 'A' && text_[pos_] <= 'Z')))
      ++pos_;
    return {text_.substr(start, pos_ - start), start};
  }
  [[noreturn]] void fail_word(std::pair<std::string_view, std::size_t> w,
                              std::string_view expected) const {
    if (w.first.empty()) fail(w.second, expected);
    fail(w.second, expected, fmt::format("\"{}\"", w.first));
  }

  // A decimal integer in [min, max of Int], digits only; returns it and where it starts.
  template <std::integral Int>
  std::pair<Int, std::size_t> number(std::string_view what, Int min) {
    skip_space();
    const std::size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
    const std::string_view digits = text_.substr(start, pos_ - start);
    const std::string expected =
        fmt::format("{} (an integer from {} to {})", what, min, std::numeric_limits<Int>::max());
    if (digits.empty()) fail(start, expected);
    Int value{};
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (ec != std::errc{} || value < min) fail(start, expected, digits);
    return {value, start};
  }

 private:
  static bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
  }

  std::string_view text_;
  std::string_view function_;
  std::string_view accepted_;
  std::size_t pos_ = 0;
};

inline PlacementSpec read_placement(TextReader& in) {
  const auto name = in.word();
  PlacementSpec spec;
  if (name.first == "Replicate") {
    in.expect('(');
  } else if (name.first == "Shard" || name.first == "StridedShard") {
    spec.kind = name.first == "Shard" ? PlacementKind::shard : PlacementKind::strided_shard;
    in.expect('(');
    spec.tensor_dim = in.number("a tensor dimension", 0).first;
    if (spec.kind == PlacementKind::strided_shard) {
      in.expect(',');
      const auto sf = in.word();
      if (sf.first != "sf") in.fail_word(sf, "\"sf\"");
      in.expect('=');
      spec.split_factor = in.number("a split factor", index_t{1}).first;
    }
  } else if (name.first == "Partial") {
    spec.kind = PlacementKind::partial;
    in.expect('(');
    const auto op = in.word();
    bool known = false;
    for (ReduceOp o : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min})
      if (op.first == to_string(o)) {
        spec.op = o;
        known = true;
      }
    if (!known) in.fail_word(op, "a reduction (sum, avg, max or min)");
  } else {
    in.fail_word(name, "a placement name (Replicate, Shard, StridedShard or Partial)");
  }
  in.expect(')');
  return spec;
}

}  // namespace kshard::detail

namespace kshard {

/// Reads one placement in the spelling kshard prints: `Replicate()`, `Shard(D)`,
/// `StridedShard(D, sf=F)` (F >= 1) or `Partial(sum|avg|max|min)`, with any white space
/// around names, parentheses, commas and `=`. Names are case-sensitive. Throws `kshard::error`
/// naming the text, the 0-based position and what is accepted.
inline PlacementSpec parse_placement(std::string_view text) {
  detail::TextReader in(text, "parse_placement", detail::placement_spellings);
  const PlacementSpec spec = detail::read_placement(in);
  in.expect_end("the end of the placement");
  return spec;
}

/// Reads a layout, one placement per mesh dimension separated by commas (commas inside a
/// placement's parentheses belong to it), optionally in parentheses as kshard prints layouts:
/// `(StridedShard(0, sf=2), Shard(0))` or `Shard(0), Replicate()`. Throws `kshard::error`
/// naming the text, the 0-based position and what is accepted.
inline std::vector<PlacementSpec> parse_layout(std::string_view text) {
  const std::string accepted = fmt::format(
      "one or more placements separated by commas, optionally in parentheses, as in "
      "(Shard(0), Replicate()); placements: {}",
      detail::placement_spellings);
  detail::TextReader in(text, "parse_layout", accepted);
  const bool parenthesized = in.take('(');
  std::vector<PlacementSpec> specs{detail::read_placement(in)};
  while (in.take(',')) specs.push_back(detail::read_placement(in));
  if (parenthesized) in.expect(')');
  in.expect_end(parenthesized ? "the end of the layout" : "',' or the end of the layout");
  return specs;
}

/// Reads a mesh shape, extents >= 1 separated by `x` (`8`, `2x4`, `2 x 2 x 2`), whose product
/// (the number of ranks) must fit in an `int`, as MPI's communicator sizes do. Throws
/// `kshard::error` naming the text, the 0-based position and what is accepted.
inline std::vector<int> parse_mesh_shape(std::string_view text) {
  detail::TextReader in(text, "parse_mesh_shape",
                        "extents >= 1 separated by 'x', as in 8 or 2x4, whose product is at most "
                        "2147483647");
  std::vector<int> shape;
  std::int64_t ranks = 1;  // <= INT_MAX before each product, so the product fits in int64
  do {
    const auto [extent, start] = in.number("a mesh extent", 1);
    ranks *= extent;
    if (ranks > std::numeric_limits<int>::max())
      in.fail(start, "extents whose product (the number of ranks) fits in an int",
              fmt::format("a product of {}", ranks));
    shape.push_back(extent);
  } while (in.take('x'));
  in.expect_end("'x' or the end of the mesh shape");
  return shape;
}

/// A set of placement types for `dispatch_layout` to choose from, for every mesh dimension.
/// Each type costs compile time: a set of S types instantiates the callback S^N times.
template <Placement... Ps>
struct placement_set {
  static_assert(sizeof...(Ps) > 0, "kshard::placement_set: give at least one placement type");
};

/// `dispatch_layout`'s default set: the placements a stored or input matrix has.
using default_placements =
    placement_set<Replicate, Shard<0>, Shard<1>, StridedShard<0>, StridedShard<1>>;

/// The default set plus every `Partial` (matrices awaiting a reduction): 9^N instantiations.
using with_partial = placement_set<Replicate, Shard<0>, Shard<1>, StridedShard<0>, StridedShard<1>,
                                   Partial<ReduceOp::sum>, Partial<ReduceOp::avg>,
                                   Partial<ReduceOp::max>, Partial<ReduceOp::min>>;

}  // namespace kshard

namespace kshard::detail {

template <Placement P>
constexpr PlacementSpec spec_of() {
  PlacementSpec spec{P::kind, P::tensor_dim};
  if constexpr (P::kind == PlacementKind::partial) spec.op = P::op;
  return spec;
}

// Whether `spec` stands for placement type `P`, comparing only the fields its kind uses.
template <Placement P>
constexpr bool matches(const PlacementSpec& spec) {
  constexpr PlacementSpec type = spec_of<P>();
  return spec.kind == type.kind &&
         (spec.kind == PlacementKind::replicate || spec.kind == PlacementKind::partial ||
          spec.tensor_dim == type.tensor_dim) &&
         (spec.kind != PlacementKind::partial || spec.op == type.op);
}

template <Placement P>
P make_placement(const PlacementSpec& spec) {
  if constexpr (P::kind == PlacementKind::strided_shard)
    return P{spec.split_factor};
  else
    return P{};
}

template <Placement P>
std::string set_entry_text() {
  if constexpr (P::kind == PlacementKind::strided_shard)
    return fmt::format("StridedShard({}, sf=F)", P::tensor_dim);
  else
    return to_string(spec_of<P>());
}

template <std::size_t, class P>
using repeat = P;

// What `f` returns for the layout of the set's first placement type on every mesh dimension.
template <class F, class First, class... Rest, std::size_t... M>
auto first_result(placement_set<First, Rest...>, std::index_sequence<M...>)
    -> std::invoke_result_t<F, Layout<repeat<M, First>...>>;

template <class Set, std::size_t N, class F>
struct LayoutDispatch;

// One step per mesh dimension: a table indexed by the matching placement type calls the next
// step with that placement appended, so the cost is one table lookup per dimension.
template <class... Ps, std::size_t N, class F>
struct LayoutDispatch<placement_set<Ps...>, N, F> {
  using Specs = std::array<PlacementSpec, N>;
  // Every layout must give this, the first one's result.
  using Result = decltype(first_result<F>(placement_set<Ps...>{}, std::make_index_sequence<N>{}));

  template <class... Acc>
  static Result run(const Specs& specs, F&& f, const Acc&... acc) {
    constexpr std::size_t m = sizeof...(Acc);
    if constexpr (m == N) {
      static_assert(std::is_same_v<std::invoke_result_t<F, Layout<Acc...>>, Result>,
                    "kshard::dispatch_layout: f must return the same type for every layout of "
                    "the placement set");
      return std::invoke(std::forward<F>(f), Layout<Acc...>(acc...));
    } else {
      using Step = Result (*)(const Specs&, F&&, const Acc&...);
      static constexpr std::array<Step, sizeof...(Ps)> steps{&extend<Ps, Acc...>...};
      return steps[index_of(specs[m], m)](specs, std::forward<F>(f), acc...);
    }
  }

  template <class P, class... Acc>
  static Result extend(const Specs& specs, F&& f, const Acc&... acc) {
    return run<Acc..., P>(specs, std::forward<F>(f), acc...,
                          make_placement<P>(specs[sizeof...(Acc)]));
  }

  static std::size_t index_of(const PlacementSpec& spec, std::size_t m) {
    constexpr std::array<bool (*)(const PlacementSpec&), sizeof...(Ps)> tests{&matches<Ps>...};
    for (std::size_t i = 0; i < tests.size(); ++i)
      if (tests[i](spec)) return i;
    throw error(fmt::format(
        "kshard::dispatch_layout: mesh dimension {} has placement {}, which is not in the "
        "placement set {{{}}}; pass a set holding it as dispatch_layout's second template "
        "argument (kshard::with_partial adds Partial)",
        m, to_string(spec),
        fmt::join(std::array<std::string, sizeof...(Ps)>{set_entry_text<Ps>()...}, ", ")));
  }
};

}  // namespace kshard::detail

namespace kshard {

/// Calls `f(layout)` with the `Layout<...>` whose placement on mesh dimension `m` matches
/// `specs[m]`, split factors set from the specs, and returns what `f` returns; `f` must return
/// the same type for every layout (a static_assert says so otherwise). `Set` is a
/// `placement_set`; a spec outside it throws `kshard::error` naming the mesh dimension and
/// listing the set.
///
/// Compile-time cost: `f` is instantiated once per layout of the set, S^N times for a set of S
/// types: 5^N with `default_placements` (5, 25, 125 for N = 1, 2, 3), 9^N with
/// `with_partial` (729 for N = 3). Pass a smaller set when `f` is heavy.
template <std::size_t N, class Set = default_placements, class F>
decltype(auto) dispatch_layout(const std::array<PlacementSpec, N>& specs, F&& f) {
  static_assert(N >= 1, "kshard::dispatch_layout: a layout needs at least one mesh dimension");
  return detail::LayoutDispatch<Set, N, F>::run(specs, std::forward<F>(f));
}

/// `dispatch_layout` for a layout of run-time length, as `parse_layout` returns; throws
/// `kshard::error` unless it has exactly `N` placements.
template <std::size_t N, class Set = default_placements, class F>
decltype(auto) dispatch_layout(const std::vector<PlacementSpec>& specs, F&& f) {
  if (specs.size() != N) {
    std::vector<std::string> texts;
    for (const PlacementSpec& spec : specs) texts.push_back(to_string(spec));
    throw error(fmt::format(
        "kshard::dispatch_layout: the layout ({}) has {} placements but the mesh has {} "
        "dimensions; give one placement per mesh dimension",
        fmt::join(texts, ", "), specs.size(), N));
  }
  std::array<PlacementSpec, N> fixed;
  for (std::size_t m = 0; m < N; ++m) fixed[m] = specs[m];
  return dispatch_layout<N, Set>(fixed, std::forward<F>(f));
}

/// Calls `f(std::integral_constant<std::size_t, N>{})` for the mesh rank `N == n` (1, 2 or 3) and
/// returns what `f` returns, the same type for every rank; throws `kshard::error` for other `n`.
/// With `dispatch_layout` inside, `f`'s layouts cost 5 + 25 + 125 instantiations with the default
/// set.
template <class F>
decltype(auto) dispatch_mesh_rank(std::size_t n, F&& f) {
  using Result = std::invoke_result_t<F, std::integral_constant<std::size_t, 1>>;
  static_assert(
      std::is_same_v<std::invoke_result_t<F, std::integral_constant<std::size_t, 2>>, Result> &&
          std::is_same_v<std::invoke_result_t<F, std::integral_constant<std::size_t, 3>>, Result>,
      "kshard::dispatch_mesh_rank: f must return the same type for every mesh rank");
  switch (n) {
    case 1:
      return std::invoke(std::forward<F>(f), std::integral_constant<std::size_t, 1>{});
    case 2:
      return std::invoke(std::forward<F>(f), std::integral_constant<std::size_t, 2>{});
    case 3:
      return std::invoke(std::forward<F>(f), std::integral_constant<std::size_t, 3>{});
  }
  throw error(fmt::format(
      "kshard::dispatch_mesh_rank: a mesh of {} dimensions is not supported (1, 2 or 3)", n));
}

}  // namespace kshard
