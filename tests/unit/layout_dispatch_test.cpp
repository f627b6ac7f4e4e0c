// Runtime layouts: the parsers read what the formatters print, and dispatch_layout hands back
// the compile-time layout that prints the same text again.

#include <gtest/gtest.h>

#include <array>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kshard/format.hpp"
#include "kshard/layout_dispatch.hpp"

namespace {

using kshard::PlacementKind;
using kshard::PlacementSpec;
using kshard::ReduceOp;

// The message of the kshard::error `fn` throws ("" when it throws none).
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const kshard::error& e) {
    return e.what();
  }
  return "";
}

const std::vector<std::string> default_spellings{"Replicate()", "Shard(0)", "Shard(1)",
                                                 "StridedShard(0, sf=2)", "StridedShard(1, sf=3)"};
const std::vector<std::string> partial_spellings{"Partial(sum)", "Partial(avg)", "Partial(max)",
                                                 "Partial(min)"};

// Every layout of one and two mesh dimensions over `spellings`, as kshard prints layouts.
std::vector<std::string> layouts_of(const std::vector<std::string>& spellings, std::size_t rank) {
  std::vector<std::string> out;
  for (const std::string& a : spellings) {
    if (rank == 1) out.push_back("(" + a + ")");
    if (rank == 2)
      for (const std::string& b : spellings) out.push_back("(" + a + ", " + b + ")");
  }
  return out;
}

template <std::size_t N, class Set = kshard::default_placements>
std::string round_trip(const std::string& text) {
  return kshard::dispatch_layout<N, Set>(kshard::parse_layout(text),
                                         [](auto layout) { return fmt::format("{}", layout); });
}

TEST(ParsePlacement, ReadsEverySpellingKshardPrints) {
  EXPECT_EQ(kshard::parse_placement("Replicate()"), PlacementSpec{});
  EXPECT_EQ(kshard::parse_placement("Shard(1)"), (PlacementSpec{PlacementKind::shard, 1}));
  EXPECT_EQ(kshard::parse_placement("StridedShard(0, sf=2)"),
            (PlacementSpec{PlacementKind::strided_shard, 0, 2}));
  EXPECT_EQ(kshard::parse_placement("Partial(avg)"),
            (PlacementSpec{PlacementKind::partial, -1, 1, ReduceOp::avg}));
  for (const auto& spellings : {default_spellings, partial_spellings})
    for (const std::string& text : spellings)
      EXPECT_EQ(kshard::to_string(kshard::parse_placement(text)), text);
}

TEST(ParsePlacement, ToleratesWhiteSpace) {
  EXPECT_EQ(kshard::parse_placement(" \tStridedShard ( 1 ,sf = 40 ) \n"),
            (PlacementSpec{PlacementKind::strided_shard, 1, 40}));
  EXPECT_EQ(kshard::parse_placement("Replicate( )"), PlacementSpec{});
  EXPECT_EQ(kshard::parse_placement("Partial( min)"),
            (PlacementSpec{PlacementKind::partial, -1, 1, ReduceOp::min}));
}

TEST(ParsePlacement, NamesTextPositionAndAcceptedSpellings) {
  const std::string accepted =
      "; accepted: Replicate(), Shard(D), StridedShard(D, sf=F) with F >= 1, "
      "Partial(sum|avg|max|min)";
  EXPECT_EQ(error_of([] { kshard::parse_placement("Shard(x)"); }),
            "kshard::parse_placement: cannot read \"Shard(x)\" at position 6: expected a tensor "
            "dimension (an integer from 0 to 2147483647), found 'x'" +
                accepted);
  EXPECT_EQ(error_of([] { kshard::parse_placement("shard(0)"); }),
            "kshard::parse_placement: cannot read \"shard(0)\" at position 0: expected a "
            "placement name (Replicate, Shard, StridedShard or Partial), found \"shard\"" +
                accepted);
  EXPECT_EQ(error_of([] { kshard::parse_placement("Replicate"); }),
            "kshard::parse_placement: cannot read \"Replicate\" at position 9: expected '(', "
            "found the end of the text" +
                accepted);
  EXPECT_EQ(error_of([] { kshard::parse_placement("StridedShard(0, sf=0)"); }),
            "kshard::parse_placement: cannot read \"StridedShard(0, sf=0)\" at position 19: "
            "expected a split factor (an integer from 1 to 9223372036854775807), found 0" +
                accepted);
  EXPECT_EQ(error_of([] { kshard::parse_placement("StridedShard(0)"); }),
            "kshard::parse_placement: cannot read \"StridedShard(0)\" at position 14: expected "
            "',', found ')'" +
                accepted);
  EXPECT_EQ(error_of([] { kshard::parse_placement("StridedShard(0, f=2)"); }),
            "kshard::parse_placement: cannot read \"StridedShard(0, f=2)\" at position 16: "
            "expected \"sf\", found \"f\"" +
                accepted);
  EXPECT_EQ(error_of([] { kshard::parse_placement("Partial(prod)"); }),
            "kshard::parse_placement: cannot read \"Partial(prod)\" at position 8: expected a "
            "reduction (sum, avg, max or min), found \"prod\"" +
                accepted);
  EXPECT_EQ(error_of([] { kshard::parse_placement("Shard(2147483648)"); }),
            "kshard::parse_placement: cannot read \"Shard(2147483648)\" at position 6: expected "
            "a tensor dimension (an integer from 0 to 2147483647), found 2147483648" +
                accepted);
  EXPECT_EQ(error_of([] { kshard::parse_placement("Shard(0) x"); }),
            "kshard::parse_placement: cannot read \"Shard(0) x\" at position 9: expected the end "
            "of the placement, found 'x'" +
                accepted);
  EXPECT_EQ(error_of([] { kshard::parse_placement("Shard(-1)"); }),
            "kshard::parse_placement: cannot read \"Shard(-1)\" at position 6: expected a tensor "
            "dimension (an integer from 0 to 2147483647), found '-'" +
                accepted);
}

TEST(ParseLayout, ReadsPrintedAndBareLists) {
  const std::vector<PlacementSpec> expected{{PlacementKind::strided_shard, 0, 2},
                                            {PlacementKind::shard, 0}};
  EXPECT_EQ(kshard::parse_layout("(StridedShard(0, sf=2), Shard(0))"), expected);
  EXPECT_EQ(kshard::parse_layout("StridedShard(0,sf=2),Shard(0)"), expected);
  EXPECT_EQ(kshard::parse_layout(" ( StridedShard(0, sf=2) , Shard(0) ) "), expected);
  EXPECT_EQ(kshard::parse_layout("Replicate()"), std::vector<PlacementSpec>{PlacementSpec{}});
}

TEST(ParseLayout, NamesTextPositionAndAcceptedSpellings) {
  const std::string accepted =
      "; accepted: one or more placements separated by commas, optionally in parentheses, as in "
      "(Shard(0), Replicate()); placements: Replicate(), Shard(D), StridedShard(D, sf=F) with "
      "F >= 1, Partial(sum|avg|max|min)";
  EXPECT_EQ(error_of([] { kshard::parse_layout("(Shard(0), Replicate()"); }),
            "kshard::parse_layout: cannot read \"(Shard(0), Replicate()\" at position 22: "
            "expected ')', found the end of the text" +
                accepted);
  EXPECT_EQ(error_of([] { kshard::parse_layout("Shard(0),"); }),
            "kshard::parse_layout: cannot read \"Shard(0),\" at position 9: expected a placement "
            "name (Replicate, Shard, StridedShard or Partial), found the end of the text" +
                accepted);
  EXPECT_EQ(error_of([] { kshard::parse_layout("()"); }),
            "kshard::parse_layout: cannot read \"()\" at position 1: expected a placement name "
            "(Replicate, Shard, StridedShard or Partial), found ')'" +
                accepted);
  EXPECT_EQ(error_of([] { kshard::parse_layout("Shard(0); Replicate()"); }),
            "kshard::parse_layout: cannot read \"Shard(0); Replicate()\" at position 8: "
            "expected ',' or the end of the layout, found ';'" +
                accepted);
}

TEST(ParseMeshShape, ReadsExtents) {
  EXPECT_EQ(kshard::parse_mesh_shape("8"), std::vector<int>{8});
  EXPECT_EQ(kshard::parse_mesh_shape("2x4"), (std::vector<int>{2, 4}));
  EXPECT_EQ(kshard::parse_mesh_shape(" 2 x 2 x 2 "), (std::vector<int>{2, 2, 2}));
  EXPECT_EQ(kshard::parse_mesh_shape("2147483647"), std::vector<int>{2147483647});
  EXPECT_EQ(kshard::parse_mesh_shape("65536x32767"), (std::vector<int>{65536, 32767}));
}

TEST(ParseMeshShape, NamesTextPositionAndAcceptedSpellings) {
  const std::string accepted =
      "; accepted: extents >= 1 separated by 'x', as in 8 or 2x4, whose product is at most "
      "2147483647";
  EXPECT_EQ(error_of([] { kshard::parse_mesh_shape("0x2"); }),
            "kshard::parse_mesh_shape: cannot read \"0x2\" at position 0: expected a mesh extent "
            "(an integer from 1 to 2147483647), found 0" +
                accepted);
  EXPECT_EQ(error_of([] { kshard::parse_mesh_shape("2x"); }),
            "kshard::parse_mesh_shape: cannot read \"2x\" at position 2: expected a mesh extent "
            "(an integer from 1 to 2147483647), found the end of the text" +
                accepted);
  EXPECT_EQ(error_of([] { kshard::parse_mesh_shape("65536x32768"); }),
            "kshard::parse_mesh_shape: cannot read \"65536x32768\" at position 6: expected "
            "extents whose product (the number of ranks) fits in an int, found a product of "
            "2147483648" +
                accepted);
  EXPECT_EQ(error_of([] { kshard::parse_mesh_shape("99999999999"); }),
            "kshard::parse_mesh_shape: cannot read \"99999999999\" at position 0: expected a mesh "
            "extent (an integer from 1 to 2147483647), found 99999999999" +
                accepted);
  EXPECT_EQ(error_of([] { kshard::parse_mesh_shape("2*4"); }),
            "kshard::parse_mesh_shape: cannot read \"2*4\" at position 1: expected 'x' or the end "
            "of the mesh shape, found '*'" +
                accepted);
  EXPECT_EQ(error_of([] { kshard::parse_mesh_shape(""); }),
            "kshard::parse_mesh_shape: cannot read \"\" at position 0: expected a mesh extent (an "
            "integer from 1 to 2147483647), found the end of the text" +
                accepted);
}

TEST(LayoutDispatch, RoundTripsEveryDefaultLayout) {
  for (const std::string& text : layouts_of(default_spellings, 1))
    EXPECT_EQ(round_trip<1>(text), text);
  for (const std::string& text : layouts_of(default_spellings, 2))
    EXPECT_EQ(round_trip<2>(text), text);
  EXPECT_EQ(layouts_of(default_spellings, 2).size(), 25U);
}

TEST(LayoutDispatch, RoundTripsEveryLayoutWithPartial) {
  std::vector<std::string> spellings = default_spellings;
  spellings.insert(spellings.end(), partial_spellings.begin(), partial_spellings.end());
  for (const std::string& text : layouts_of(spellings, 1))
    EXPECT_EQ((round_trip<1, kshard::with_partial>(text)), text);
  for (const std::string& text : layouts_of(spellings, 2))
    EXPECT_EQ((round_trip<2, kshard::with_partial>(text)), text);
}

TEST(LayoutDispatch, GivesTheLayoutTypeAndSplitFactors) {
  const std::array<PlacementSpec, 2> specs{
      PlacementSpec{PlacementKind::strided_shard, 1, 1'000'000'000'000},
      PlacementSpec{PlacementKind::shard, 0}};
  const bool same = kshard::dispatch_layout<2>(specs, [](auto layout) {
    return std::is_same_v<decltype(layout),
                          kshard::Layout<kshard::StridedShard<1>, kshard::Shard<0>>> &&
           layout.template get<0>().split_factor() == 1'000'000'000'000;
  });
  EXPECT_TRUE(same);
}

TEST(LayoutDispatch, CustomSetCutsInstantiations) {
  using Set = kshard::placement_set<kshard::Replicate, kshard::Shard<0>>;
  int calls = 0;
  kshard::dispatch_layout<2, Set>(kshard::parse_layout("Shard(0), Replicate()"), [&](auto layout) {
    EXPECT_EQ(fmt::format("{}", layout), "(Shard(0), Replicate())");
    ++calls;
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(error_of([] {
              kshard::dispatch_layout<1, Set>(kshard::parse_layout("Shard(1)"), [](auto) {});
            }),
            "kshard::dispatch_layout: mesh dimension 0 has placement Shard(1), which is not in "
            "the placement set {Replicate(), Shard(0)}; pass a set holding it as "
            "dispatch_layout's second template argument (kshard::with_partial adds Partial)");
}

TEST(LayoutDispatch, RefusesPlacementsOutsideTheSet) {
  EXPECT_EQ(error_of([] {
              kshard::dispatch_layout<2>(kshard::parse_layout("Shard(0), Partial(sum)"),
                                         [](auto) {});
            }),
            "kshard::dispatch_layout: mesh dimension 1 has placement Partial(sum), which is not "
            "in the placement set {Replicate(), Shard(0), Shard(1), StridedShard(0, sf=F), "
            "StridedShard(1, sf=F)}; pass a set holding it as dispatch_layout's second template "
            "argument (kshard::with_partial adds Partial)");
  EXPECT_NE(error_of([] {
              kshard::dispatch_layout<1, kshard::with_partial>(kshard::parse_layout("Shard(2)"),
                                                               [](auto) {});
            })
                .find("mesh dimension 0 has placement Shard(2), which is not in the placement set "
                      "{Replicate(), Shard(0), Shard(1), StridedShard(0, sf=F), "
                      "StridedShard(1, sf=F), Partial(sum), Partial(avg), Partial(max), "
                      "Partial(min)}"),
            std::string::npos);
}

TEST(LayoutDispatch, RefusesWrongLength) {
  EXPECT_EQ(error_of([] {
              kshard::dispatch_layout<2>(kshard::parse_layout("Shard(0), Replicate(), Shard(1)"),
                                         [](auto) {});
            }),
            "kshard::dispatch_layout: the layout (Shard(0), Replicate(), Shard(1)) has 3 "
            "placements but the mesh has 2 dimensions; give one placement per mesh dimension");
}

TEST(LayoutDispatch, FromCommandLine) {
  const auto describe = [](std::string_view mesh, std::string_view layout) {
    const std::vector<int> shape = kshard::parse_mesh_shape(mesh);
    const std::vector<PlacementSpec> specs = kshard::parse_layout(layout);
    return kshard::dispatch_mesh_rank(shape.size(), [&](auto rank) {
      constexpr std::size_t N = decltype(rank)::value;
      return kshard::dispatch_layout<N>(
          specs, [&](auto l) { return fmt::format("{} on {}", l, fmt::join(shape, "x")); });
    });
  };
  EXPECT_EQ(describe("8", "Shard(1)"), "(Shard(1)) on 8");
  EXPECT_EQ(describe("2x4", "StridedShard(0, sf=2), Shard(0)"),
            "(StridedShard(0, sf=2), Shard(0)) on 2x4");
  EXPECT_EQ(describe("2x2x2", "Replicate(), Shard(0), Shard(1)"),
            "(Replicate(), Shard(0), Shard(1)) on 2x2x2");
  EXPECT_EQ(error_of([&] { describe("2x2x2x2", "Shard(0)"); }),
            "kshard::dispatch_mesh_rank: a mesh of 4 dimensions is not supported (1, 2 or 3)");
}

}  // namespace
