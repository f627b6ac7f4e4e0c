// Per-rank shards (a training job's checkpoint: one safetensors file per rank, its pieces placed
// by DCP_SHARDING_INFO) read at any rank count into every layout of one and two mesh dimensions:
// pieces cut here by torch.chunk's arithmetic (written out, not kshard's mapping) from a serial
// reference, each rank's shard compared bit for bit and its bytes read counted; the forms of a
// checkpoint recognised by their contents; chosen rows read alone (io::read_rows_into) from
// the shards and the consolidated file; and folders that lie refused alike on every rank.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kshard/format.hpp"
#include "kshard/io/read_checkpoint.hpp"
#include "kshard_test.hpp"
#include "safetensors_mpi_support.hpp"
#include "shard_job.hpp"

namespace {

using namespace kshard_io_mpi_test;  // fs, io, index_t, ExecSpace, MemSpace and the helpers
using kshard::test::collective_error;

// Reads `name` into `layout` on `mesh`: the values, and the bytes read: each first copy reads
// its block once, the tensor's bytes in all.
template <class T, std::size_t N, class L>
void read_and_check(const io::Checkpoint& model, const std::string& name, const Tensor& full,
                    const kshard::Mesh<N>& mesh, const L& layout) {
  SCOPED_TRACE(
      fmt::format("{} on mesh ({}), layout {}", name, fmt::join(mesh.shape(), ", "), layout));
  io::reset_io_stats();
  const auto matrix = io::read_matrix<T, ExecSpace, MemSpace>(model, name, mesh, layout);
  EXPECT_TRUE(kshard::test::all_ranks(holds_all(matrix, full.bytes, full.shape[1])));
  std::int64_t read = io::io_stats().bytes_read;
  const bool first = L::is_first_copy(mesh.coords(), {0, 1});
  EXPECT_EQ(read, first ? matrix.mapping().local_size() * std::int64_t{sizeof(T)} : 0);
  MPI_Allreduce(MPI_IN_PLACE, &read, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(read, static_cast<std::int64_t>(full.bytes.size()));
}

TEST(ShardFolderMpi, ReadsAJobsShardsIntoEveryLayout) {
  const Scratch scratch;
  const JobCheckpoint job;
  job.write(scratch / "model");
  const kshard::Mesh<1> line(MPI_COMM_WORLD, {kshard::test::world_size()});
  const io::Checkpoint model(line, scratch / "model");
  EXPECT_EQ(model.form(), io::CheckpointForm::per_rank_shards);
  EXPECT_EQ(model.files().size(), 4u);
  EXPECT_EQ(model.tensor("experts").shape, (Offsets{3, 2, 2}));
  EXPECT_EQ(model.tensor("experts").dtype, io::Dtype::BF16);
  EXPECT_EQ(model.tensor("norm").shape, (Offsets{5}));
  EXPECT_EQ(model.tensor("embed").pieces.size(), 4u);
  std::uint64_t seed = 390;
  for (const auto& shape : kshard::test::mesh_shapes<2>(kshard::test::world_size())) {
    const kshard::Mesh<2> mesh(MPI_COMM_WORLD, shape);
    kshard::test::for_each_layout(
        seed,
        [&](const auto& layout) {
          read_and_check<float>(model, "embed", job.tensors.at("embed"), line, layout);
          read_and_check<float>(model, "proj", job.tensors.at("proj"), line, layout);
        },
        [&](const auto& layout) {
          read_and_check<double>(model, "grid", job.tensors.at("grid"), mesh, layout);
        });
  }
}

// Reads rows `ids` of `name` into a zero matrix of `layout` on `mesh`: those rows hold the
// tensor's, every other element is still zero, and each rank read its columns of the rows it
// holds and nothing else.
template <class T, std::size_t N, class L>
void read_rows_and_check(const io::Checkpoint& model, const std::string& name, const Tensor& full,
                         const kshard::Mesh<N>& mesh, const L& layout,
                         const std::vector<index_t>& ids) {
  SCOPED_TRACE(fmt::format("rows [{}] of {} on mesh ({}), layout {}", fmt::join(ids, ", "), name,
                           fmt::join(mesh.shape(), ", "), layout));
  const kshard::DistMatrix<T, L, ExecSpace, MemSpace> matrix(mesh, layout, full.shape[0],
                                                             full.shape[1], name);
  io::reset_io_stats();
  io::read_rows_into(ExecSpace{}, model, name, matrix, ids);
  EXPECT_TRUE(kshard::test::all_ranks(holds_only_rows(matrix, full.bytes, full.shape[1], ids)));
  const auto& map = matrix.mapping();
  std::int64_t held = 0;  // distinct chosen rows this rank holds
  for (index_t i = 0; i < map.rows.local_extent(); ++i)
    held += std::find(ids.begin(), ids.end(), map.rows.to_global(i)) != ids.end() ? 1 : 0;
  EXPECT_EQ(io::io_stats().bytes_read,
            held * map.cols.local_extent() * static_cast<std::int64_t>(sizeof(T)));
}

TEST(ShardFolderMpi, ReadsChosenRowsIntoEveryLayout) {
  const Scratch scratch;
  const JobCheckpoint job;
  job.write(scratch / "model");
  write_file(scratch / "model.safetensors", consolidated_file(job.tensors));
  const kshard::Mesh<1> line(MPI_COMM_WORLD, {kshard::test::world_size()});
  std::uint64_t seed = 391;
  for (const fs::path& path : {scratch / "model", scratch / "model.safetensors"}) {
    const io::Checkpoint model(line, path);
    for (const auto& shape : kshard::test::mesh_shapes<2>(kshard::test::world_size())) {
      const kshard::Mesh<2> mesh(MPI_COMM_WORLD, shape);
      kshard::test::for_each_layout(
          seed,
          [&](const auto& layout) {
            read_rows_and_check<float>(model, "embed", job.tensors.at("embed"), line, layout,
                                       {36, 9, 10, 0, 9});
            read_rows_and_check<float>(model, "proj", job.tensors.at("proj"), line, layout, {});
          },
          [&](const auto& layout) {
            read_rows_and_check<double>(model, "grid", job.tensors.at("grid"), mesh, layout,
                                        {3, 6});
          });
    }
  }
  const io::Checkpoint model(line, scratch / "model");
  kshard::DistMatrix<float, kshard::Layout<kshard::Shard<0>>, ExecSpace, MemSpace> matrix(
      line, {}, 37, 8, "embed");
  const std::uint64_t before = kshard::test::checksum(matrix);
  const std::string outside = collective_error([&] {
    io::read_rows_into(model, "embed", matrix, {3, 37});
  });
  EXPECT_NE(outside.find("row id 37 of 'embed' is outside [0, 37)"), std::string::npos) << outside;
  if (kshard::test::world_size() > 1) {
    const std::string differ = collective_error([&] {
      io::read_rows_into(model, "embed", matrix, {kshard::test::world_rank() == 0 ? 1 : 2});
    });
    EXPECT_NE(differ.find("the rows of 'embed' to read differs"), std::string::npos) << differ;
  }
  const std::string shape =
      collective_error([&] { io::read_rows_into(model, "proj", matrix, {1}); });
  EXPECT_NE(shape.find("has shape [9, 10], but the matrix is 37 x 8"), std::string::npos) << shape;
  EXPECT_EQ(kshard::test::checksum(matrix), before);  // refused: nothing read
}

TEST(ShardFolderMpi, ReadsIntoAnExistingMatrix) {
  const Scratch scratch;
  const JobCheckpoint job;
  job.write(scratch / "model");
  const kshard::Mesh<2> mesh = kshard::test::dp_tp_mesh();
  const io::Checkpoint model(mesh, scratch / "model");
  kshard::DistMatrix<float, kshard::Layout<kshard::Shard<1>, kshard::Shard<0>>, ExecSpace, MemSpace>
      matrix(mesh, {}, 37, 8, "embed");
  io::read_into(ExecSpace{}, model, "embed", matrix);
  const Tensor& embed = job.tensors.at("embed");
  EXPECT_TRUE(kshard::test::all_ranks(holds_all(matrix, embed.bytes, embed.shape[1])));
  const std::string wrong = collective_error([&] { io::read_into(model, "proj", matrix); });
  EXPECT_NE(wrong.find("tensor 'proj' of '" + (scratch / "model").string() +
                       "' has shape [9, 10], but the matrix is 37 x 8"),
            std::string::npos)
      << wrong;
  const std::string three_d = collective_error([&] { io::read_into(model, "experts", matrix); });
  EXPECT_NE(three_d.find("is BF16, but the matrix holds float"), std::string::npos) << three_d;
  const std::string scalar = collective_error([&] { io::read_into(model, "scale", matrix); });
  EXPECT_NE(scalar.find("is F16, but the matrix holds float"), std::string::npos) << scalar;
}

// The message every rank throws opening `folder` (after `damage` changed the job's files).
std::string open_error(
    const Scratch& scratch, const std::string& name,
    const std::function<void(std::vector<std::vector<Piece>>&,
                             std::vector<std::optional<std::string>>&)>& damage) {
  const JobCheckpoint job;
  auto files = job.files();
  std::vector<std::optional<std::string>> infos(files.size());
  damage(files, infos);
  const fs::path folder = scratch / name;
  if (kshard::test::world_rank() == 0) fs::create_directories(folder);
  for (std::size_t r = 0; r < files.size(); ++r)
    write_file(folder / shard_name(static_cast<int>(r)), shard_file(files[r], infos[r]));
  const kshard::Mesh<1> line(MPI_COMM_WORLD, {kshard::test::world_size()});
  return collective_error([&] { const io::Checkpoint model(line, folder); });
}

Piece& piece(std::vector<Piece>& file, const std::string& name) {
  return *std::find_if(file.begin(), file.end(), [&](const Piece& p) { return p.name == name; });
}

TEST(ShardFolderMpi, RefusesFoldersThatLie) {
  const Scratch scratch;
  using Files = std::vector<std::vector<Piece>>;
  using Infos = std::vector<std::optional<std::string>>;
  const auto expect = [&](const std::string& name, const std::string& phrase, auto damage) {
    const std::string message = open_error(scratch, name, damage);
    EXPECT_NE(message.find(phrase), std::string::npos) << name << ": " << message;
  };
  expect("gap", "the pieces of tensor 'embed' (shape [37, 8], in 3 pieces) cover 216 of its 296",
         [](Files& f, Infos&) {
           std::erase_if(f[1], [](const Piece& p) { return p.name == "embed"; });
         });
  expect("overlap", "pieces of tensor 'proj' overlap: '", [](Files& f, Infos&) {
    piece(f[2], "proj").offsets = {0, 0};
  });
  expect("outside", "cover 296 of its 304 elements", [](Files& f, Infos&) {
    piece(f[3], "embed").offsets = {31, 0};
  });
  expect("dtype", "tensor 'embed' is F32 of rank 2 in '",
         [](Files& f, Infos&) { piece(f[2], "embed").dtype = io::Dtype::I32; });
  expect("not_json", "is not a JSON object", [](Files&, Infos& i) { i[1] = "{\"embed\": "; });
  expect("names_absent", "names tensor 'ghost', which the file does not hold",
         [](Files&, Infos& i) { i[0] = R"({"ghost": {"saved_offsets": [0, 0]}})"; });
  expect("missing_offsets", "gives no offsets for it", [](Files& f, Infos& i) {
    f[3] = {piece(f[3], "embed"), piece(f[3], "proj")};
    i[3] = R"({"embed": {"saved_offsets": [30, 0]}})";
  });
}

TEST(ShardFolderMpi, ConsolidatedFormsReadAsBefore) {
  const Scratch scratch;
  const auto full = kshard::test::reference_matrix<float>(6, 4, 36);
  if (kshard::test::world_rank() == 0) fs::create_directories(scratch / "single");
  write_file(scratch / "single" / "model.safetensors", checkpoint_image(full));
  const kshard::Mesh<1> line(MPI_COMM_WORLD, {kshard::test::world_size()});
  const io::Checkpoint model(line, scratch / "single");
  EXPECT_EQ(model.form(), io::CheckpointForm::single_file);
  read_and_check<float>(model, "weight", Tensor{io::Dtype::F32, {6, 4}, bytes_of(full)}, line,
                        kshard::Layout<kshard::Shard<0>>{});
  EXPECT_EQ(model.tensor("weight").pieces.size(), 1u);
  if (kshard::test::world_rank() == 0) fs::create_directories(scratch / "empty");
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string none =
      collective_error([&] { const io::Checkpoint m(line, scratch / "empty"); });
  EXPECT_NE(none.find("holds no model.safetensors.index.json, no model.safetensors and no "
                      ".safetensors files"),
            std::string::npos)
      << none;
  write_file(scratch / "empty" / "a.safetensors", checkpoint_image(full));
  const std::string plain =
      collective_error([&] { const io::Checkpoint m(line, scratch / "empty"); });
  EXPECT_NE(plain.find("a.safetensors' has no DCP_SHARDING_INFO in its metadata"),
            std::string::npos)
      << plain;
}

}  // namespace
