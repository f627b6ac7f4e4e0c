// Checkpoints written by real torch (tests/io/fixtures/torch_shards: FSDP2, TP, FSDP2 x TP with
// _StridedShard, a rank without a file, integer, bool, F8 and 0-d tensors; see its README),
// read at every rank count of the io suite and compared bit for bit with the ground truth torch's
// tensors were saved as (expected.safetensors, written by the safetensors package): the tensors'
// shapes and dtypes, 2-D tensors read into several layouts, the checkpoint consolidated, and
// resharded for another mesh and consolidated again.

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kshard/io/convert.hpp"
#include "kshard/io/read_checkpoint.hpp"
#include "kshard_test.hpp"
#include "safetensors_mpi_support.hpp"

namespace {

using namespace kshard_io_mpi_test;
using kshard::test::all_ranks;

const fs::path fixtures = KSHARD_TORCH_FIXTURES_DIR;
const std::vector<std::string> cases{"fsdp2_4rank", "tp_2rank", "fsdp_tp_2x2", "empty_rank_3rank",
                                     "single_rank"};

kshard::Mesh<1> line() { return kshard::Mesh<1>(MPI_COMM_WORLD, {kshard::test::world_size()}); }

// The bytes of tensor `name` of the single-file checkpoint whose file image is `image`.
std::vector<std::byte> tensor_bytes(const io::Checkpoint& model,
                                    const std::vector<std::byte>& image, const std::string& name) {
  const io::SafetensorsFile& file = model.file_of(name);
  const io::TensorEntry& entry = *file.header().find(name);
  const auto begin = image.begin() + static_cast<std::ptrdiff_t>(file.file_offset(entry));
  return {begin, begin + static_cast<std::ptrdiff_t>(entry.bytes())};
}

// Every tensor of `converted` (a consolidated folder) has the ground truth's name, dtype, shape
// and bytes.
void expect_same_tensors(const io::Checkpoint& converted, const io::Checkpoint& truth) {
  ASSERT_EQ(converted.tensor_names(), truth.tensor_names());
  const auto truth_image = read_file(truth.path());
  for (const auto& name : truth.tensor_names()) {
    SCOPED_TRACE(name);
    EXPECT_EQ(converted.tensor(name).dtype, truth.tensor(name).dtype);
    EXPECT_EQ(converted.tensor(name).shape, truth.tensor(name).shape);
    const auto image = read_file(converted.file_of(name).path());
    EXPECT_TRUE(
        all_ranks(tensor_bytes(converted, image, name) == tensor_bytes(truth, truth_image, name)));
  }
}

// Reads every 2-D tensor of element type T into `layout` and compares each rank's shard with
// the ground truth.
template <class T, class L>
void expect_reads(const io::Checkpoint& shards, const io::Checkpoint& truth, const L& layout) {
  const auto truth_image = read_file(truth.path());
  const auto mesh = line();
  for (const auto& name : truth.tensor_names()) {
    const io::StoredTensor& t = truth.tensor(name);
    if (t.shape.size() != 2 || t.dtype != io::dtype_of<T>()) continue;
    SCOPED_TRACE(fmt::format("{} as {}", name, layout));
    const auto matrix = io::read_matrix<T, ExecSpace, MemSpace>(shards, name, mesh, layout);
    const auto local = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), matrix.local());
    const auto bytes = tensor_bytes(truth, truth_image, name);
    const auto& map = matrix.mapping();
    bool same = true;
    for (index_t i = 0; i < map.rows.local_extent(); ++i)
      for (index_t j = 0; j < map.cols.local_extent(); ++j) {
        const auto at = (map.rows.to_global(i) * t.shape[1] + map.cols.to_global(j)) * sizeof(T);
        same = same && std::memcmp(&local(i, j), bytes.data() + at, sizeof(T)) == 0;
      }
    EXPECT_TRUE(all_ranks(same));
  }
}

TEST(TorchFixturesMpi, ReadAsTorchWroteThem) {
  const auto mesh = line();
  for (const auto& name : cases) {
    SCOPED_TRACE(name);
    const io::Checkpoint shards(mesh, fixtures / name / "model");
    const io::Checkpoint truth(mesh, fixtures / name / "expected.safetensors");
    EXPECT_EQ(shards.form(), io::CheckpointForm::per_rank_shards);
    ASSERT_EQ(shards.tensor_names(), truth.tensor_names());
    for (const auto& tensor : truth.tensor_names()) {
      EXPECT_EQ(shards.tensor(tensor).dtype, truth.tensor(tensor).dtype) << tensor;
      EXPECT_EQ(shards.tensor(tensor).shape, truth.tensor(tensor).shape) << tensor;
    }
    expect_reads<float>(shards, truth, kshard::Layout<kshard::Shard<0>>{});
    expect_reads<float>(shards, truth, kshard::Layout<kshard::Shard<1>>{});
    expect_reads<float>(shards, truth, kshard::Layout(kshard::StridedShard<0>{2}));
    expect_reads<kshard::bf16>(shards, truth, kshard::Layout<kshard::Replicate>{});
    expect_reads<kshard::bf16>(shards, truth, kshard::Layout<kshard::Shard<1>>{});
  }
}

TEST(TorchFixturesMpi, ConsolidateAndReshardToTheGroundTruth) {
  const Scratch scratch;
  const auto mesh = line();
  for (const auto& name : cases) {
    SCOPED_TRACE(name);
    const io::Checkpoint shards(mesh, fixtures / name / "model");
    const io::Checkpoint truth(mesh, fixtures / name / "expected.safetensors");
    io::convert_checkpoint(mesh, shards, scratch / (name + "_hf"), {});
    expect_same_tensors(io::Checkpoint(mesh, scratch / (name + "_hf")), truth);
    io::ConvertOptions other;  // another job: 3 ranks, columns where a tensor has them
    other.form = io::OutputForm::sharded;
    other.sharding.mesh = {3};
    other.sharding.layout = kshard::parse_layout("Shard(1)");
    io::convert_checkpoint(mesh, shards, scratch / (name + "_tp3"), other);
    const io::Checkpoint resharded(mesh, scratch / (name + "_tp3"));
    io::convert_checkpoint(mesh, resharded, scratch / (name + "_hf2"), {});
    expect_same_tensors(io::Checkpoint(mesh, scratch / (name + "_hf2")), truth);
  }
}

}  // namespace
