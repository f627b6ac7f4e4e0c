// Checkpoints converted at any rank count (io::convert_checkpoint): a 4-rank job's per-rank
// shards (tensors of rank 0 to 3 and of nine dtypes) consolidated into the file built serially,
// byte for byte, whole or split at a maximum size with its index; resharded into the files a job
// on another mesh writes (their pieces and sharding info checked against torch.chunk's
// arithmetic, and consolidated back to the same bytes); each rank's share of the bytes counted;
// and bad options and paths refused alike on every rank with nothing written.

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kshard/distribute.hpp"
#include "kshard/io/convert.hpp"
#include "kshard/io/rewrite.hpp"
#include "kshard_test.hpp"
#include "safetensors_mpi_support.hpp"
#include "shard_job.hpp"

namespace {

using namespace kshard_io_mpi_test;
using kshard::test::all_ranks;
using kshard::test::collective_error;

// The plan of a job on `mesh` with `layout`, and `rules` (pattern, layout) per tensor.
io::ShardingPlan plan(std::vector<int> mesh, const char* layout,
                      const std::vector<std::pair<std::string, std::string>>& rules = {}) {
  io::ShardingPlan p;
  p.mesh = std::move(mesh);
  p.layout = kshard::parse_layout(layout);
  for (const auto& [pattern, text] : rules)
    p.layout_for.emplace_back(pattern, kshard::parse_layout(text));
  return p;
}

kshard::Mesh<1> line() { return kshard::Mesh<1>(MPI_COMM_WORLD, {kshard::test::world_size()}); }

// The ranks wrote the output's data bytes once, and rank 0 its `header_bytes` too; no rank
// wrote more than its share rounded up to whole elements of each tensor it touched (within 8
// bytes per tensor).
void expect_shares(std::int64_t data_bytes, std::int64_t header_bytes, std::size_t tensors) {
  std::int64_t mine = io::io_stats().bytes_written;
  if (kshard::test::world_rank() == 0) mine -= header_bytes;
  std::int64_t sum = mine;
  MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(sum, data_bytes);
  const std::int64_t share = data_bytes / kshard::test::world_size();
  EXPECT_TRUE(all_ranks(mine <= share + 8 * static_cast<std::int64_t>(tensors) + 8));
}

// The job's shards written into `folder` and opened on `mesh`.
io::Checkpoint write_and_open(const JobCheckpoint& job, const fs::path& folder,
                              const kshard::Mesh<1>& mesh) {
  job.write(folder);
  return io::Checkpoint(mesh, folder);
}

// A 4-rank job's per-rank shards in a fresh scratch folder, opened on every rank.
class ConvertJob : public ::testing::Test {
 protected:
  const Scratch scratch{};
  const JobCheckpoint job{};
  const kshard::Mesh<1> mesh = line();
  const io::Checkpoint model = write_and_open(job, scratch / "model", mesh);
};

TEST(ConvertMpi, ConsolidatesAJobsShardsByteForByte) {
  const Scratch scratch;
  const JobCheckpoint job;
  job.write(scratch / "model");
  if (kshard::test::world_rank() == 0) fs::create_directories(scratch / "model" / ".hf_metadata");
  const std::string config = R"({"pad_token_id": 3})";
  write_file(
      scratch / "model" / ".hf_metadata" / "config.json",
      std::vector<std::byte>(reinterpret_cast<const std::byte*>(config.data()),
                             reinterpret_cast<const std::byte*>(config.data()) + config.size()));
  const auto mesh = line();
  const io::Checkpoint model(mesh, scratch / "model");
  EXPECT_EQ(model.config().pad_token_id, 3);  // a job keeps its config in .hf_metadata/
  io::reset_io_stats();
  const auto written = io::convert_checkpoint(mesh, model, scratch / "hf/", {});
  ASSERT_EQ(written, std::vector<fs::path>{scratch / "hf" / "model.safetensors"});
  const auto expected = consolidated_file(job.tensors);
  EXPECT_TRUE(all_ranks(read_file(written[0]) == expected));
  std::int64_t data = 0;
  for (const auto& [name, t] : job.tensors) data += static_cast<std::int64_t>(t.bytes.size());
  expect_shares(data, static_cast<std::int64_t>(expected.size()) - data, job.tensors.size());
  EXPECT_TRUE(all_ranks(fs::exists(scratch / "hf" / "config.json")));
  // A checkpoint and its consolidation hash alike, tensor by tensor.
  EXPECT_EQ(io::tensor_hashes(mesh, model),
            io::tensor_hashes(mesh, io::Checkpoint(mesh, scratch / "hf")));
  EXPECT_FALSE(all_ranks(fs::exists(scratch / "hf.kshard-partial")));
}

TEST_F(ConvertJob, SplitsAtTheMaximumSizeWithAnIndex) {
  io::ConvertOptions options;
  options.max_shard_bytes = 600;  // codes | embed | experts, grid, mask, norm | proj, scale, steps
  options.buffer_bytes = 4096;    // several buffers per tensor
  const auto written = io::convert_checkpoint(mesh, model, scratch / "hf", options);
  ASSERT_EQ(written.size(), 4u);
  const auto index = nlohmann::json::parse(std::string(
      reinterpret_cast<const char*>(read_file(scratch / "hf" / io::safetensors_index_name).data()),
      read_file(scratch / "hf" / io::safetensors_index_name).size()));
  std::int64_t total = 0;
  std::map<std::string, std::vector<std::string>> by_file;
  for (const auto& [name, t] : job.tensors) {
    total += static_cast<std::int64_t>(t.bytes.size());
    by_file[index["weight_map"][name].get<std::string>()].push_back(name);
  }
  EXPECT_EQ(index["metadata"]["total_size"].get<std::int64_t>(), total);
  ASSERT_EQ(by_file.size(), 4u);
  for (const auto& path : written) {
    const std::string file = path.filename().string();
    std::map<std::string, Tensor> part;
    for (const auto& name : by_file[file]) part.emplace(name, job.tensors.at(name));
    EXPECT_TRUE(all_ranks(read_file(path) == consolidated_file(part))) << file;
  }
  EXPECT_EQ(written[0].filename(), "model-00001-of-00004.safetensors");
}

TEST_F(ConvertJob, ReshardsIntoAnotherJobsShards) {
  io::ConvertOptions options;
  options.form = io::OutputForm::sharded;
  options.sharding = {
      {3}, kshard::parse_layout("Shard(0)"), {{"pro*", kshard::parse_layout("Shard(1)")}}};
  const auto written = io::convert_checkpoint(mesh, model, scratch / "tp3", options);
  ASSERT_EQ(written.size(), 3u);
  // Rank 1 of 3: embed rows 13-25 (torch.chunk: 13, 13, 11), proj columns 4-7; no scale (0-d,
  // first copy on rank 0); the 1-D tensors by rows too.
  const io::SafetensorsFile second(mesh, scratch / "tp3" / shard_name(1));
  const auto info = nlohmann::json::parse(second.header().metadata.at("DCP_SHARDING_INFO"));
  EXPECT_EQ(info["embed"]["saved_offsets"], nlohmann::json({13, 0}));
  EXPECT_EQ(info["proj"]["saved_offsets"], nlohmann::json({0, 4}));
  EXPECT_EQ(info["norm"]["saved_offsets"], nlohmann::json({2}));
  EXPECT_FALSE(info.contains("scale"));
  EXPECT_EQ(second.header().find("embed")->shape, (Offsets{13, 8}));
  EXPECT_EQ(second.header().find("proj")->shape, (Offsets{9, 4}));
  // Back to one file: the same bytes.
  const io::Checkpoint resharded(mesh, scratch / "tp3");
  const auto hf = io::convert_checkpoint(mesh, resharded, scratch / "hf", {});
  EXPECT_TRUE(all_ranks(read_file(hf[0]) == consolidated_file(job.tensors)));
}

// The job's checkpoint with rows `ids` of "embed" negated: the host matrix and the tensors.
struct Patched {
  kshard::HostMatrix<float> embed;
  std::map<std::string, Tensor> tensors;
};
Patched patched(const JobCheckpoint& job, const std::vector<index_t>& ids) {
  Patched p{kshard::HostMatrix<float>("embed", 37, 8), job.tensors};
  std::memcpy(p.embed.data(), job.tensors.at("embed").bytes.data(), 37 * 8 * sizeof(float));
  for (const index_t id : ids)
    for (std::size_t c = 0; c < 8; ++c) p.embed(id, c) = -p.embed(id, c) - 1.0f;
  std::memcpy(p.tensors.at("embed").bytes.data(), p.embed.data(), 37 * 8 * sizeof(float));
  return p;
}

TEST_F(ConvertJob, WritesPatchedRowsInEveryForm) {
  const std::vector<index_t> ids{0, 9, 10, 36};
  const Patched expected = patched(job, ids);
  const auto repaired = kshard::distribute<ExecSpace, MemSpace>(
      mesh, kshard::Layout<kshard::Shard<1>>{}, kshard::HostMatrix<const float>(expected.embed));
  const auto patch = io::patch_rows("embed", repaired, {36, 0, 10, 9, 10});
  EXPECT_EQ(patch.ids, ids);
  io::ConvertOptions same;
  same.form = io::OutputForm::as_stored;
  const auto files = io::convert_checkpoint(mesh, model, scratch / "same", same, {patch});
  JobCheckpoint repaired_job;
  repaired_job.tensors = expected.tensors;
  const auto shards = repaired_job.files();
  ASSERT_EQ(files.size(), 4u);
  for (int r = 0; r < 4; ++r)
    EXPECT_TRUE(all_ranks(read_file(files[r]) == shard_file(shards[r]))) << files[r];
  const auto hf = io::convert_checkpoint(mesh, model, scratch / "hf", {}, {patch});
  EXPECT_TRUE(all_ranks(read_file(hf[0]) == consolidated_file(expected.tensors)));
  const auto wrong = collective_error([&] {
    io::convert_checkpoint(mesh, model, scratch / "x", {}, {io::patch_rows("proj", repaired, {1})});
  });
  EXPECT_NE(wrong.find("tensor 'proj' is F32 [9, 10], but its patch is of a 37 x 8 F32 matrix"),
            std::string::npos)
      << wrong;
}

// Each of the job's shard files as `tensors` would make them.
void expect_shard_files(const fs::path& folder, const std::map<std::string, Tensor>& tensors) {
  JobCheckpoint job;
  job.tensors = tensors;
  const auto shards = job.files();
  for (int r = 0; r < 4; ++r)
    EXPECT_TRUE(all_ranks(read_file(folder / shard_name(r)) == shard_file(shards[r]))) << r;
}

TEST_F(ConvertJob, PatchesShardsInPlaceAndUndoes) {
  const Patched expected = patched(job, {0, 9, 10, 36});  // rows in files 0, 0, 1 and 3
  const auto repaired = kshard::distribute<ExecSpace, MemSpace>(
      mesh, kshard::Layout<kshard::Shard<0>>{}, kshard::HostMatrix<const float>(expected.embed));
  const auto files =
      io::write_patch_in_place(mesh, model, io::patch_rows("embed", repaired, {0, 9, 10, 36}));
  EXPECT_EQ(files, (std::vector<fs::path>{scratch / "model" / shard_name(0),
                                          scratch / "model" / shard_name(1),
                                          scratch / "model" / shard_name(3)}));
  expect_shard_files(scratch / "model", expected.tensors);
  const std::string again = collective_error(
      [&] { io::write_patch_in_place(mesh, model, io::patch_rows("embed", repaired, {1})); });
  EXPECT_NE(again.find("exists already; undo that write"), std::string::npos) << again;
  EXPECT_EQ(io::undo_checkpoint(mesh, model), files);
  expect_shard_files(scratch / "model", job.tensors);
  // A column-sharded tensor: every shard holds some columns of the rows.
  kshard::HostMatrix<float> proj("proj", 9, 10);
  std::memcpy(proj.data(), job.tensors.at("proj").bytes.data(), 9 * 10 * sizeof(float));
  for (std::size_t c = 0; c < 10; ++c) proj(4, c) = 100.0f + static_cast<float>(c);
  auto tensors = job.tensors;
  std::memcpy(tensors.at("proj").bytes.data(), proj.data(), 9 * 10 * sizeof(float));
  const auto new_proj = kshard::distribute<ExecSpace, MemSpace>(
      mesh, kshard::Layout<kshard::Shard<1>>{}, kshard::HostMatrix<const float>(proj));
  EXPECT_EQ(io::write_patch_in_place(mesh, model, io::patch_rows("proj", new_proj, {4})).size(),
            4u);
  expect_shard_files(scratch / "model", tensors);
}

// A tensor written as the DCP of a 300-rank job (more data files than a conversion keeps open)
// and the job's shards, both consolidated back to the very bytes of the file it came from; DCP
// output takes the same options' refusals.
TEST(ConvertMpi, WritesADcpOfManyFilesAndBack) {
  const Scratch scratch;
  const auto mesh = line();
  const std::vector<io::TensorSpec> specs{{"table", io::Dtype::U8, {600, 3}}};
  std::vector<std::byte> image =
      io::serialize_safetensors_header(io::make_safetensors_header(specs, {{"format", "pt"}}));
  for (int i = 0; i < 600 * 3; ++i) image.push_back(static_cast<std::byte>(i * 37 + i / 251));
  write_file(scratch / "table.safetensors", image);
  io::ConvertOptions dcp;
  dcp.form = io::OutputForm::dcp;
  dcp.sharding = plan({300}, "Shard(0)");
  io::convert_checkpoint(mesh, io::Checkpoint(mesh, scratch / "table.safetensors"), scratch / "dcp",
                         dcp);
  const io::Checkpoint many(mesh, scratch / "dcp");
  EXPECT_EQ(many.data_files().size(), 300u);
  EXPECT_EQ(many.tensor("table").pieces.size(), 300u);
  const auto written = io::convert_checkpoint(mesh, many, scratch / "hf", {});
  EXPECT_TRUE(all_ranks(read_file(written.at(0)) == image));
  dcp.sharding = plan({2}, "Partial(sum)");
  const std::string message =
      collective_error([&] { io::convert_checkpoint(mesh, many, scratch / "partial", dcp); });
  EXPECT_NE(message.find("the layout holds Partial(sum)"), std::string::npos) << message;
  EXPECT_TRUE(all_ranks(!fs::exists(scratch / "partial.kshard-partial")));
}

// Durability::page_cache writes the same bytes with no fsync on any rank (the folder still
// appears whole, as cp's files do not); the default syncs what each rank writes, and rank 0 the
// file it created and the folder it publishes too.
TEST_F(ConvertJob, WritesTheSameBytesUnsynced) {
  io::reset_io_stats();
  io::convert_checkpoint(mesh, model, scratch / "synced", {});
  const std::int64_t synced = io::io_stats().syncs;
  EXPECT_TRUE(all_ranks(synced >= (kshard::test::world_rank() == 0 ? 3 : 1))) << synced;
  io::ConvertOptions unsynced;
  unsynced.durability = io::Durability::page_cache;
  io::reset_io_stats();
  const auto written = io::convert_checkpoint(mesh, model, scratch / "unsynced", unsynced);
  EXPECT_TRUE(all_ranks(io::io_stats().syncs == 0));
  EXPECT_TRUE(all_ranks(read_file(written.at(0)) == consolidated_file(job.tensors)));
  EXPECT_TRUE(all_ranks(!fs::exists(scratch / "unsynced.kshard-partial")));
}

TEST_F(ConvertJob, RefusesAlikeAndWritesNothing) {
  const auto refuse = [&](const io::ConvertOptions& options, const fs::path& out,
                          const std::string& phrase) {
    const std::string message =
        collective_error([&] { io::convert_checkpoint(mesh, model, out, options); });
    EXPECT_NE(message.find(phrase), std::string::npos) << message;
    EXPECT_TRUE(all_ranks(!fs::exists(kshard::detail::partial_path(out))));
  };
  io::ConvertOptions sharded;
  sharded.form = io::OutputForm::sharded;
  sharded.sharding = plan({2}, "Partial(sum)");
  refuse(sharded, scratch / "a", "the layout holds Partial(sum); per-rank shards take");
  sharded.sharding = plan({2, 2}, "Shard(0)");
  refuse(sharded, scratch / "b", "the layout has 1 placements for a mesh of 2 dimensions");
  sharded.sharding = plan({2}, "StridedShard(0, sf=2)");
  refuse(sharded, scratch / "c", "indices of dimension 0 of tensor 'codes' that are not one run");
  io::ConvertOptions differs;
  if (kshard::test::world_rank() == kshard::test::world_size() - 1) differs.max_shard_bytes = 7;
  if (kshard::test::world_size() > 1) refuse(differs, scratch / "d", "the options");
  io::ConvertOptions durability;  // an MPI_File_sync on some ranks only would hang
  if (kshard::test::world_rank() == 0) durability.durability = io::Durability::page_cache;
  if (kshard::test::world_size() > 1) refuse(durability, scratch / "e", "durability page_cache");
  refuse({}, scratch / "model", "exists; a conversion writes a new folder");
  refuse({}, scratch / "no" / "such", "of the output folder");
  EXPECT_TRUE(all_ranks(!fs::exists(scratch / "a") && !fs::exists(scratch / "c")));
}

}  // namespace
