// Formatters for placements and layouts, and the sharding picture, against golden text.

#include <gtest/gtest.h>

#include <fmt/format.h>

#include "kshard/format.hpp"

namespace {

using kshard::Layout;
using kshard::Partial;
using kshard::ReduceOp;
using kshard::Replicate;
using kshard::Shard;
using kshard::StridedShard;

TEST(Format, Placements) {
  EXPECT_EQ(fmt::format("{}", Replicate{}), "Replicate()");
  EXPECT_EQ(fmt::format("{}", Shard<1>{}), "Shard(1)");
  EXPECT_EQ(fmt::format("{}", StridedShard<0>{2}), "StridedShard(0, sf=2)");
  EXPECT_EQ(fmt::format("{}", Partial<>{}), "Partial(sum)");
  EXPECT_EQ(fmt::format("{}", Partial<ReduceOp::avg>{}), "Partial(avg)");
}

TEST(Format, Layouts) {
  EXPECT_EQ(fmt::format("{}", Layout(StridedShard<0>{2}, Shard<0>{})),
            "(StridedShard(0, sf=2), Shard(0))");
  EXPECT_EQ(fmt::format("{}", Layout(Replicate{}, Partial<ReduceOp::max>{}, Shard<1>{})),
            "(Replicate(), Partial(max), Shard(1))");
}

// Spec section 1, last example: the non-contiguous FSDP-inside-TP rows.
TEST(Format, PictureOfNonContiguousRows) {
  const std::array<std::string, 2> names{"dp", "tp"};
  EXPECT_EQ(kshard::sharding_picture(Layout(Shard<0>{}, StridedShard<0>{2}),
                                     std::array<int, 2>{2, 2}, names, 8, 3),
            "8 x 3 matrix, cells list mesh coordinates (dp, tp)\n"
            "         cols 0-2  \n"
            "       +----------+\n"
            "rows 0 | (0,0)    |\n"
            "       +----------+\n"
            "rows 1 | (0,1)    |\n"
            "       +----------+\n"
            "rows 2 | (0,0)    |\n"
            "       +----------+\n"
            "rows 3 | (0,1)    |\n"
            "       +----------+\n"
            "rows 4 | (1,0)    |\n"
            "       +----------+\n"
            "rows 5 | (1,1)    |\n"
            "       +----------+\n"
            "rows 6 | (1,0)    |\n"
            "       +----------+\n"
            "rows 7 | (1,1)    |\n"
            "       +----------+\n");
}

TEST(Format, PictureOfReplicasColumnsAndEmptyShards) {
  const std::array<std::string, 2> names{"dp", "tp"};
  EXPECT_EQ(kshard::sharding_picture(Layout(Replicate{}, Shard<1>{}), std::array<int, 2>{2, 3},
                                     names, 2, 2),
            "2 x 2 matrix, cells list mesh coordinates (dp, tp)\n"
            "           cols 0        cols 1       \n"
            "         +-------------+-------------+\n"
            "rows 0-1 | (0,0) (1,0) | (0,1) (1,1) |\n"
            "         +-------------+-------------+\n"
            "empty shards: (0,2) (1,2)\n");
}

}  // namespace
