// Checkpoints written by real torch, per-rank safetensors shards (tests/io/fixtures/torch_shards:
// FSDP2, TP, FSDP2 x TP with _StridedShard, a rank without a file, integer, bool, F8 and 0-d
// tensors) and PyTorch DCP folders (tests/io/fixtures/torch_dcp: FSDP2 with AdamW state, TP,
// FSDP2 x TP, an empty chunk, every dtype torch saves, transposed chunks, several files per rank,
// `.metadata` at pickle protocols 2 to 5; see their READMEs), read at every rank count of the io
// suite and compared bit for bit with the ground truth torch's tensors were saved as
// (expected.safetensors, written by the safetensors package): the tensors' shapes and dtypes,
// 2-D tensors read into several layouts (whole, and a few rows alone), the checkpoint
// consolidated, and resharded for another mesh and consolidated again.

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kshard/io/convert.hpp"
#include "kshard/io/read_checkpoint.hpp"
#include "kshard/io/verify.hpp"
#include "kshard_test.hpp"
#include "safetensors_mpi_support.hpp"

namespace {

using namespace kshard_io_mpi_test;
using kshard::test::all_ranks;

const fs::path fixtures = KSHARD_TORCH_FIXTURES_DIR;
const std::vector<std::string> cases{"fsdp2_4rank", "tp_2rank", "fsdp_tp_2x2", "empty_rank_3rank",
                                     "single_rank"};
const fs::path dcp_fixtures = KSHARD_TORCH_DCP_DIR;
const std::vector<std::string> dcp_cases{
    "fsdp2_adamw_4rank", "tp_2rank",         "fsdp_tp_2x2",      "empty_rank_3rank",
    "dtypes_2rank",      "transposed_2rank", "multi_file_2rank", "per_rank_metadata_2rank"};

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

// Reads the first, middle and last rows of tensor `name` (of `shape`, `bytes` the ground
// truth's) alone into a zero matrix of `layout` and compares them with the ground truth.
template <class T, class L>
void expect_reads_rows(const io::Checkpoint& stored, const std::string& name, const L& layout,
                       const std::vector<std::byte>& bytes,
                       const std::vector<std::int64_t>& shape) {
  const std::vector<index_t> ids{shape[0] - 1, shape[0] / 2, 0};
  const kshard::DistMatrix<T, L, ExecSpace, MemSpace> matrix(line(), layout, shape[0], shape[1]);
  io::read_rows_into(stored, name, matrix, ids);
  EXPECT_TRUE(all_ranks(holds_only_rows(matrix, bytes, shape[1], ids))) << "rows of " << name;
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
    const auto bytes = tensor_bytes(truth, truth_image, name);
    EXPECT_TRUE(all_ranks(holds_all(matrix, bytes, t.shape[1])));
    expect_reads_rows<T>(shards, name, layout, bytes, t.shape);
  }
}

// The keys of the JSON object in file `path`.
std::vector<std::string> json_keys(const fs::path& path) {
  std::ifstream in(path);
  const nlohmann::json object = nlohmann::json::parse(in);
  std::vector<std::string> keys;
  for (auto it = object.begin(); it != object.end(); ++it) keys.push_back(it.key());
  return keys;
}

// Compares the stored tensors of `stored` with the ground truth, and reads its 2-D tensors into
// several layouts.
void expect_stored_as_truth(const io::Checkpoint& stored, const io::Checkpoint& truth) {
  ASSERT_EQ(stored.tensor_names(), truth.tensor_names());
  for (const auto& tensor : truth.tensor_names()) {
    EXPECT_EQ(stored.tensor(tensor).dtype, truth.tensor(tensor).dtype) << tensor;
    EXPECT_EQ(stored.tensor(tensor).shape, truth.tensor(tensor).shape) << tensor;
  }
  expect_reads<float>(stored, truth, kshard::Layout<kshard::Shard<0>>{});
  expect_reads<float>(stored, truth, kshard::Layout<kshard::Shard<1>>{});
  expect_reads<float>(stored, truth, kshard::Layout(kshard::StridedShard<0>{2}));
  expect_reads<kshard::bf16>(stored, truth, kshard::Layout<kshard::Replicate>{});
  expect_reads<kshard::bf16>(stored, truth, kshard::Layout<kshard::Shard<1>>{});
}

// `stored` consolidated, and resharded for another job (3 ranks, columns where a tensor has
// them) and consolidated again, equals the ground truth.
void expect_converts_to_truth(const Scratch& scratch, const std::string& name,
                              const io::Checkpoint& stored, const io::Checkpoint& truth) {
  const auto mesh = line();
  io::convert_checkpoint(mesh, stored, scratch / (name + "_hf"), {});
  expect_same_tensors(io::Checkpoint(mesh, scratch / (name + "_hf")), truth);
  io::ConvertOptions other;
  other.form = io::OutputForm::sharded;
  other.sharding.mesh = {3};
  other.sharding.layout = kshard::parse_layout("Shard(1)");
  io::convert_checkpoint(mesh, stored, scratch / (name + "_tp3"), other);
  const io::Checkpoint resharded(mesh, scratch / (name + "_tp3"));
  io::convert_checkpoint(mesh, resharded, scratch / (name + "_hf2"), {});
  expect_same_tensors(io::Checkpoint(mesh, scratch / (name + "_hf2")), truth);
}

TEST(TorchFixturesMpi, ReadAsTorchWroteThem) {
  const auto mesh = line();
  for (const auto& name : cases) {
    SCOPED_TRACE(name);
    const io::Checkpoint shards(mesh, fixtures / name / "model");
    EXPECT_EQ(shards.form(), io::CheckpointForm::per_rank_shards);
    expect_stored_as_truth(shards, io::Checkpoint(mesh, fixtures / name / "expected.safetensors"));
  }
}

TEST(TorchFixturesMpi, ConsolidateAndReshardToTheGroundTruth) {
  const Scratch scratch;
  const auto mesh = line();
  for (const auto& name : cases) {
    SCOPED_TRACE(name);
    expect_converts_to_truth(scratch, name, io::Checkpoint(mesh, fixtures / name / "model"),
                             io::Checkpoint(mesh, fixtures / name / "expected.safetensors"));
  }
}

TEST(TorchDcpMpi, ReadAsTorchWroteThem) {
  const auto mesh = line();
  for (const auto& name : dcp_cases) {
    SCOPED_TRACE(name);
    const io::Checkpoint dcp(mesh, dcp_fixtures / name / "checkpoint");
    EXPECT_EQ(dcp.form(), io::CheckpointForm::dcp);
    std::vector<std::string> items;  // the bytes items, as torch saved
    for (const io::StoredItem& item : dcp.other_items()) items.push_back(item.name);
    std::vector<std::string> saved = json_keys(dcp_fixtures / name / "expected_bytes.json");
    std::sort(items.begin(), items.end());
    std::sort(saved.begin(), saved.end());
    EXPECT_EQ(items, saved);
    expect_stored_as_truth(dcp, io::Checkpoint(mesh, dcp_fixtures / name / "expected.safetensors"));
  }
}

TEST(TorchDcpMpi, ConsolidateAndReshardToTheGroundTruth) {
  const Scratch scratch;
  const auto mesh = line();
  for (const auto& name : dcp_cases) {
    SCOPED_TRACE(name);
    expect_converts_to_truth(scratch, name,
                             io::Checkpoint(mesh, dcp_fixtures / name / "checkpoint"),
                             io::Checkpoint(mesh, dcp_fixtures / name / "expected.safetensors"));
  }
}

// The bytes of each item of `model` (a DCP folder's bytes items), by name.
std::map<std::string, std::vector<std::byte>> item_bytes(const io::Checkpoint& model) {
  std::map<std::string, std::vector<std::byte>> items;
  for (const io::StoredItem& item : model.other_items()) {
    const auto image = read_file(model.data_files()[item.file].path);
    const auto begin = image.begin() + static_cast<std::ptrdiff_t>(item.offset);
    items[item.name] = {begin, begin + static_cast<std::ptrdiff_t>(item.bytes)};
  }
  return items;
}

// A DCP kshard wrote: the ground truth's tensors, every piece's CRC-32 right, the input's bytes
// items carried byte for byte.
void expect_written_dcp(const io::Checkpoint& written, const io::Checkpoint& input,
                        const io::Checkpoint& truth) {
  const auto mesh = line();
  ASSERT_EQ(written.form(), io::CheckpointForm::dcp);
  expect_stored_as_truth(written, truth);
  std::size_t pieces = 0;
  for (const auto& tensor : written.tensor_names()) pieces += written.tensor(tensor).pieces.size();
  EXPECT_EQ(io::verify_checksums(mesh, written), pieces);
  EXPECT_EQ(item_bytes(written), item_bytes(input));
}

// Every DCP written as another job's DCP (3 ranks by rows; 2 x 2 by rows and columns) and copied
// as stored reads as the ground truth, and consolidates to it.
TEST(TorchDcpMpi, WriteDcpThatReadsAsTheGroundTruth) {
  const Scratch scratch;
  const auto mesh = line();
  io::ConvertOptions rows, grid, copy;
  rows.form = grid.form = io::OutputForm::dcp;
  rows.sharding = {{3}, kshard::parse_layout("Shard(0)"), {}};
  grid.sharding = {{2, 2}, kshard::parse_layout("Shard(0), Shard(1)"), {}};
  copy.form = io::OutputForm::as_stored;
  for (const auto& name : dcp_cases) {
    SCOPED_TRACE(name);
    const io::Checkpoint input(mesh, dcp_fixtures / name / "checkpoint");
    const io::Checkpoint truth(mesh, dcp_fixtures / name / "expected.safetensors");
    for (const auto& [suffix, options] :
         {std::pair{"_rows", rows}, std::pair{"_grid", grid}, std::pair{"_copy", copy}}) {
      SCOPED_TRACE(suffix);
      const fs::path out = scratch / (name + suffix);
      io::convert_checkpoint(mesh, input, out, options);
      const io::Checkpoint written(mesh, out);
      expect_written_dcp(written, input, truth);
      io::convert_checkpoint(mesh, written, scratch / (name + suffix + "_hf"), {});
      expect_same_tensors(io::Checkpoint(mesh, scratch / (name + suffix + "_hf")), truth);
    }
  }
}

// torch's per-rank safetensors shards, written as DCP in their own split, read as the truth.
TEST(TorchDcpMpi, ShardsWrittenAsDcp) {
  const Scratch scratch;
  const auto mesh = line();
  io::ConvertOptions options;
  options.form = io::OutputForm::dcp;  // no mesh: the shards' own split
  for (const auto& name : cases) {
    SCOPED_TRACE(name);
    const io::Checkpoint shards(mesh, fixtures / name / "model");
    io::convert_checkpoint(mesh, shards, scratch / name, options);
    const io::Checkpoint written(mesh, scratch / name);
    expect_written_dcp(written, shards,
                       io::Checkpoint(mesh, fixtures / name / "expected.safetensors"));
    EXPECT_EQ(written.data_files().size(), shards.data_files().size());
  }
}

// The same checkpoint with its `.metadata` pickled at protocols 2 to 5 reads the same.
TEST(TorchDcpMpi, MetadataAtEveryPickleProtocol) {
  const Scratch scratch;
  const auto mesh = line();
  const fs::path from = dcp_fixtures / "metadata_protocols";
  const io::Checkpoint truth(mesh, from / "expected.safetensors");
  for (const int protocol : {2, 3, 4, 5}) {
    SCOPED_TRACE(protocol);
    const fs::path folder = scratch / fmt::format("p{}", protocol);
    if (kshard::test::world_rank() == 0) {
      fs::create_directories(folder);
      for (const char* file : {"__0_0.distcp", "__1_0.distcp"})
        fs::copy_file(from / file, folder / file);
      fs::copy_file(from / fmt::format("metadata.p{}", protocol), folder / ".metadata");
    }
    MPI_Barrier(MPI_COMM_WORLD);
    expect_stored_as_truth(io::Checkpoint(mesh, folder), truth);
  }
}

// A copy of DCP fixture `name` in `scratch`, with `damage(folder)` done by rank 0; the message
// every rank throws opening it.
std::string dcp_open_error(const Scratch& scratch, const std::string& name,
                           const std::function<void(const fs::path&)>& damage) {
  const fs::path folder = scratch / name;
  if (kshard::test::world_rank() == 0) {
    fs::copy(dcp_fixtures / name / "checkpoint", folder, fs::copy_options::recursive);
    damage(folder);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return kshard::test::collective_error([&] { const io::Checkpoint model(line(), folder); });
}

// Every piece's CRC-32 checks; a byte changed in one piece's storage is found, named the same on
// every rank, though the folder still opens (its structure is sound).
TEST(TorchDcpMpi, VerifyChecksums) {
  const Scratch scratch;
  const auto mesh = line();
  for (const auto& name : dcp_cases) {
    const io::Checkpoint dcp(mesh, dcp_fixtures / name / "checkpoint");
    std::size_t pieces = 0;
    for (const auto& tensor : dcp.tensor_names()) pieces += dcp.tensor(tensor).pieces.size();
    EXPECT_EQ(io::verify_checksums(mesh, dcp), pieces) << name;
  }
  const fs::path folder = scratch / "flipped";
  if (kshard::test::world_rank() == 0)
    fs::copy(dcp_fixtures / "tp_2rank" / "checkpoint", folder, fs::copy_options::recursive);
  MPI_Barrier(MPI_COMM_WORLD);
  const io::Checkpoint original(mesh, folder);
  const io::StoredChecksum target = original.checksums().back();
  if (kshard::test::world_rank() == 0) {  // one byte of the last piece's storage inverted
    std::fstream file(original.data_files()[target.file].path,
                      std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(target.offset + target.bytes / 2);
    file.seekg(at);
    const int byte = file.get();
    file.seekp(at);
    file.put(static_cast<char>(byte ^ 0xff));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const io::Checkpoint flipped(mesh, folder);
  const std::string error =
      kshard::test::collective_error([&] { io::verify_checksums(mesh, flipped); });
  EXPECT_NE(error.find("but its archive records"), std::string::npos) << error;
  EXPECT_NE(error.find(target.name), std::string::npos) << error;
}

// Files that lie: every rank throws the same error naming what is wrong, and nothing runs.
TEST(TorchDcpMpi, FilesThatLieAreRefused) {
  const Scratch scratch;
  const fs::path pickles = fs::path(KSHARD_TORCH_DCP_DIR).parent_path() / "dcp_pickles";
  const std::string evil = dcp_open_error(scratch, "tp_2rank", [&](const fs::path& folder) {
    fs::copy_file(pickles / "evil_os_system.pkl", folder / ".metadata",
                  fs::copy_options::overwrite_existing);
  });
  EXPECT_NE(evil.find("os.system"), std::string::npos) << evil;
  const std::string cut = dcp_open_error(scratch, "dtypes_2rank", [](const fs::path& folder) {
    fs::resize_file(folder / "__1_0.distcp", fs::file_size(folder / "__1_0.distcp") / 2);
  });
  EXPECT_NE(cut.find("lies past the end of the file"), std::string::npos) << cut;
  const std::string swapped = dcp_open_error(scratch, "multi_file_2rank", [](const fs::path& f) {
    fs::rename(f / "__0_0.distcp", f / "kept");  // every item of one file now points elsewhere
    fs::rename(f / "__0_1.distcp", f / "__0_0.distcp");
    fs::rename(f / "kept", f / "__0_1.distcp");
  });
  EXPECT_NE(swapped.find("the item of 'big' at bytes 0..1833 of"), std::string::npos) << swapped;
  EXPECT_NE(swapped.find("no ZIP end of central directory record"), std::string::npos) << swapped;
}

}  // namespace
