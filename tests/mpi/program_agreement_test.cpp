// The agreement programs built on kshard use before their own collectives
// (kshard/comm/program_agreement.hpp; kshard-repair's command line), at every rank count:
// arguments that differ on the last rank only, and a problem only the last rank found, are the
// same kshard::error on every rank, and the next collective runs.

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "kshard/comm/program_agreement.hpp"
#include "kshard/mesh.hpp"
#include "kshard_test.hpp"

namespace {

using kshard::comm::NamedText;
using kshard::test::all_ranks;
using kshard::test::collective_error;

bool last_rank() { return kshard::test::world_rank() == kshard::test::world_size() - 1; }

TEST(CommandLine, ArgumentsThatDifferOnOneRankAreOneErrorEverywhere) {
  const kshard::Mesh<1> line(MPI_COMM_WORLD, {kshard::test::world_size()});
  const auto& group = line.group();
  const std::vector<NamedText> given{{"MODEL", "m"}, {"--out", "o"}, {"--keep", "[0]"}};
  EXPECT_EQ(collective_error([&] { kshard::comm::agree_on_arguments(group, given); }), "");
  if (kshard::test::world_size() == 1) return;  // no other rank to differ from

  auto other = given;
  if (last_rank()) other[1].text = "p";
  std::string message = collective_error([&] { kshard::comm::agree_on_arguments(group, other); });
  EXPECT_NE(message.find("kshard::comm::agree_on_arguments: --out differs between ranks"),
            std::string::npos)
      << message;

  auto more = given;
  if (last_rank()) more.push_back({"--dry-run", "on"});
  message = collective_error([&] { kshard::comm::agree_on_arguments(group, more); });
  EXPECT_NE(message.find("differ"), std::string::npos) << message;
  EXPECT_TRUE(all_ranks(true));  // the next collective runs
}

TEST(CommandLine, AProblemOneRankFoundIsEveryRanksError) {
  const kshard::Mesh<1> line(MPI_COMM_WORLD, {kshard::test::world_size()});
  EXPECT_EQ(collective_error([&] { kshard::comm::throw_if_any(line.group(), std::nullopt); }), "");
  const std::string message = collective_error([&] {
    kshard::comm::throw_if_any(line.group(),
                               last_rank() ? std::optional<std::string>("found it") : std::nullopt);
  });
  EXPECT_EQ(message, "found it");
  // The lowest rank's problem wins.
  EXPECT_EQ(collective_error([&] {
              kshard::comm::throw_if_any(line.group(),
                                         "rank " + std::to_string(kshard::test::world_rank()));
            }),
            "rank 0");
}

}  // namespace
