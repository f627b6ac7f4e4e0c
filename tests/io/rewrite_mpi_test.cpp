// A checkpoint's files as a whole (kshard/io/rewrite.hpp), at every rank count of the
// io suite: a sharded folder written anew with some rows replaced (its other files copied, its
// weights written, byte for byte), and left absent after a failure; the undo files of in-place
// writes found, checked (a copied folder's undo file names the original) and restored; every
// tensor hashed; the paths a run reads and makes, and their clashes refused alike everywhere.

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "kshard/distribute.hpp"
#include "kshard/io/rewrite.hpp"
#include "kshard_test.hpp"
#include "safetensors_mpi_support.hpp"

namespace {

using namespace kshard_io_mpi_test;  // fs, io, index_t, ExecSpace, MemSpace and the helpers
using kshard::test::all_ranks;
using kshard::test::collective_error;

constexpr const char* first_shard = "model-00001-of-00002.safetensors";
constexpr const char* second_shard = "model-00002-of-00002.safetensors";

std::vector<std::byte> text_bytes(const std::string& text) {
  std::vector<std::byte> bytes(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) bytes[i] = static_cast<std::byte>(text[i]);
  return bytes;
}

// A sharded checkpoint folder: tensor "a" in the first shard, "weight" (6 x 4 float) and three
// more in the second (checkpoint_image), an index, a config, a tokenizer, a subfolder, and an
// undo file a copy must leave out. Rank 0 writes it; every rank holds its images.
struct Folder {
  fs::path path;
  kshard::HostMatrix<float> weight = kshard::test::reference_matrix<float>(6, 4, 21);
  std::vector<std::byte> first;
  std::vector<std::byte> second = checkpoint_image(weight);

  Folder(const Scratch& scratch, const std::string& name) : path(scratch / name) {
    const std::vector<io::TensorSpec> specs{{"a", io::Dtype::U8, {5}}};
    const auto header = io::make_safetensors_header(specs);
    first = io::serialize_safetensors_header(header);
    for (int i = 0; i < 5; ++i) first.push_back(static_cast<std::byte>(40 + i));
    if (kshard::test::world_rank() == 0) fs::create_directories(path / "1_Pooling");
    write_file(path / first_shard, first);
    write_file(path / second_shard, second);
    std::string map = std::string(R"({"weight_map": {"a": ")") + first_shard + "\"";
    for (const char* tensor : {"odd", "weight", "after", "twin"})
      map += std::string(", \"") + tensor + "\": \"" + second_shard + "\"";
    write_file(path / io::safetensors_index_name, text_bytes(map + "}}"));
    write_file(path / "config.json", text_bytes(R"({"pad_token_id": 0})"));
    write_file(path / "tokenizer.json", text_bytes("{}"));
    write_file(path / "1_Pooling" / "config.json", text_bytes(R"({"mode": "mean"})"));
    write_file(path / "stale.kshard-undo", text_bytes("not copied"));
  }
};

// Every test's start: the folder, opened on a line of all ranks, and `m`, its weight with rows
// 1 and 4 negated (`changed` on the host), distributed by rows.
class CheckpointFolder : public ::testing::Test {
 protected:
  static kshard::HostMatrix<float> negated_rows(const kshard::HostMatrix<float>& weight) {
    kshard::HostMatrix<float> changed("changed", weight.extent(0), weight.extent(1));
    Kokkos::deep_copy(changed, weight);
    for (const std::size_t r : {1, 4})
      for (std::size_t c = 0; c < changed.extent(1); ++c) changed(r, c) = -changed(r, c);
    return changed;
  }

  const Scratch scratch;
  const kshard::Mesh<1> line{MPI_COMM_WORLD, {kshard::test::world_size()}};
  const Folder folder{scratch, "model"};
  const io::Checkpoint model{line, folder.path};
  const kshard::HostMatrix<float> changed = negated_rows(folder.weight);
  const kshard::DistMatrix<float, kshard::Layout<kshard::Shard<0>>, ExecSpace, MemSpace> m =
      kshard::distribute<ExecSpace, MemSpace>(line, kshard::Layout(kshard::Shard<0>{}),
                                              kshard::HostMatrix<const float>(changed));
};

bool same_file(const fs::path& a, const fs::path& b) { return read_file(a) == read_file(b); }

TEST_F(CheckpointFolder, WriteCheckpointCopiesTheFolderAndWritesItsWeights) {
  const fs::path out = scratch / "out";
  const auto written =
      io::write_checkpoint(line, model, out, {io::replace_rows("weight", m, {4, 1})});
  EXPECT_EQ(written, (std::vector<fs::path>{out / first_shard, out / second_shard}));
  EXPECT_TRUE(all_ranks(read_file(out / first_shard) == folder.first));
  EXPECT_TRUE(all_ranks(read_file(out / second_shard) == checkpoint_image(changed)));
  for (const char* name :
       {"config.json", "tokenizer.json", "1_Pooling/config.json", "model.safetensors.index.json"})
    EXPECT_TRUE(all_ranks(same_file(folder.path / name, out / name))) << name;
  EXPECT_TRUE(all_ranks(!fs::exists(out / "stale.kshard-undo")));
  EXPECT_TRUE(all_ranks(!fs::exists(out / (std::string(second_shard) + ".kshard-partial"))));

  // A single file is written to the file `out` names.
  const io::Checkpoint single(line, folder.path / second_shard);
  const fs::path file_out = scratch / "single.safetensors";
  EXPECT_EQ(io::write_checkpoint(line, single, file_out, {io::replace("weight", m)}),
            std::vector<fs::path>{file_out});
  EXPECT_TRUE(all_ranks(read_file(file_out) == checkpoint_image(changed)));
}

// Durability::page_cache: the same files, no fsync (nor MPI_File_sync) on any rank; the ranks
// must agree on it, and one that does not is refused before anything is written.
TEST_F(CheckpointFolder, WriteCheckpointUnsyncedWritesTheSameFiles) {
  const fs::path out = scratch / "out";
  io::reset_io_stats();
  io::write_checkpoint(line, model, out, {io::replace_rows("weight", m, {4, 1})},
                       io::Durability::page_cache);
  EXPECT_TRUE(all_ranks(io::io_stats().syncs == 0));
  EXPECT_TRUE(all_ranks(read_file(out / first_shard) == folder.first));
  EXPECT_TRUE(all_ranks(read_file(out / second_shard) == checkpoint_image(changed)));
  io::reset_io_stats();
  io::write_checkpoint(line, model, scratch / "synced", {io::replace_rows("weight", m, {4, 1})});
  EXPECT_TRUE(all_ranks(io::io_stats().syncs > 0));
  if (kshard::test::world_size() == 1) return;
  const auto mine =
      kshard::test::world_rank() == 0 ? io::Durability::page_cache : io::Durability::fsync;
  const std::string message =
      collective_error([&] { io::write_checkpoint(line, model, scratch / "never", {}, mine); });
  EXPECT_NE(message.find("the durability"), std::string::npos) << message;
  EXPECT_TRUE(all_ranks(!fs::exists(scratch / "never")));
}

TEST_F(CheckpointFolder, WriteCheckpointLeavesNoHalfWrittenCheckpoint) {
  const std::int64_t before = folder_digest(folder.path);

  // The second shard cannot be written (a folder holds its name): the first, written already,
  // and every copied file are removed again; the folder keeps what it had.
  const fs::path out = scratch / "out";
  if (kshard::test::world_rank() == 0) fs::create_directories(out / second_shard);
  std::string message = collective_error(
      [&] { io::write_checkpoint(line, model, out, {io::replace_rows("weight", m, {1})}); });
  EXPECT_NE(message.find(second_shard), std::string::npos) << message;
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(out)) left.push_back(entry.path().filename());
  EXPECT_TRUE(all_ranks(left == std::vector<std::string>{second_shard}));

  // Refused before anything is made: a tensor the checkpoint lacks, an output that is the
  // checkpoint itself.
  message = collective_error([&] {
    io::write_checkpoint(line, model, scratch / "never", {io::replace_rows("nope", m, {1})});
  });
  EXPECT_NE(message.find("has no tensor 'nope' to replace"), std::string::npos) << message;
  EXPECT_TRUE(all_ranks(!fs::exists(scratch / "never")));
  message = collective_error([&] { io::write_checkpoint(line, model, folder.path, {}); });
  EXPECT_NE(message.find("is the checkpoint file"), std::string::npos) << message;
  EXPECT_EQ(folder_digest(folder.path), before);
}

TEST_F(CheckpointFolder, UndoCheckpointRestoresWhatInPlaceWritesChanged) {
  const fs::path weights = folder.path / second_shard;
  EXPECT_TRUE(io::files_with_undo(line, model).empty());
  io::write_rows_in_place(line, model.file_of("weight"), {io::replace_rows("weight", m, {1, 4})},
                          io::undo_path_of(weights));
  EXPECT_EQ(io::files_with_undo(line, model), std::vector<fs::path>{weights});

  // A copy of the folder holds an undo file made for the original: refused, nothing restored.
  const fs::path copy = scratch / "copy";
  if (kshard::test::world_rank() == 0) fs::copy(folder.path, copy, fs::copy_options::recursive);
  const io::Checkpoint copied(line, copy);
  const std::int64_t copy_before = folder_digest(copy);
  std::string message = collective_error([&] { io::undo_checkpoint(line, copied); });
  EXPECT_NE(message.find("was made for"), std::string::npos) << message;
  EXPECT_EQ(folder_digest(copy), copy_before);
  EXPECT_TRUE(all_ranks(read_file(weights) == checkpoint_image(changed)));

  EXPECT_EQ(io::undo_checkpoint(line, model), std::vector<fs::path>{weights});
  EXPECT_TRUE(all_ranks(read_file(weights) == folder.second));
  EXPECT_TRUE(all_ranks(!fs::exists(io::undo_path_of(weights))));
  message = collective_error([&] { io::undo_checkpoint(line, model); });
  EXPECT_NE(message.find("no undo file next to the weights"), std::string::npos) << message;
}

// FNV-1a 64 over bytes, written out here so that the test does not share kshard's code.
std::uint64_t fnv1a64(const std::byte* data, std::size_t size) {
  std::uint64_t hash = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < size; ++i)
    hash = (hash ^ std::to_integer<std::uint64_t>(data[i])) * 1099511628211ull;
  return hash;
}

TEST_F(CheckpointFolder, TensorHashesAreTheFnv1aOfEachTensorsBytes) {
  std::map<std::string, std::uint64_t> expected;
  for (const auto& file : model.files()) {
    const auto bytes = read_file(file.path());
    for (const auto& entry : file.header().tensors)
      expected[entry.name] = fnv1a64(bytes.data() + file.file_offset(entry), entry.bytes());
  }
  ASSERT_EQ(expected.size(), 5U);
  EXPECT_EQ(io::tensor_hashes(line, model), expected);
}

std::vector<std::string> described(const std::vector<io::NamedPath>& paths) {
  std::vector<std::string> texts;
  for (const auto& p : paths) texts.push_back(p.role + ": " + p.path.string());
  return texts;
}

TEST_F(CheckpointFolder, PathsARunReadsAndMakes) {
  const std::string in = folder.path.string() + "/";
  const fs::path out = scratch / "out";
  const std::string to = out.string() + "/";
  const auto inputs = io::checkpoint_inputs(model, true);
  EXPECT_EQ(described(inputs),
            (std::vector<std::string>{"checkpoint file: " + in + first_shard,
                                      "undo file: " + in + first_shard + ".kshard-undo",
                                      "checkpoint file: " + in + second_shard,
                                      "undo file: " + in + second_shard + ".kshard-undo",
                                      "checkpoint file: " + in + "config.json",
                                      "checkpoint file: " + in + "model.safetensors.index.json"}));
  EXPECT_EQ(described(io::checkpoint_outputs(model, out)),
            (std::vector<std::string>{
                "output: " + to + first_shard,
                "output's temporary: " + to + first_shard + ".kshard-partial",
                "output: " + to + second_shard,
                "output's temporary: " + to + second_shard + ".kshard-partial",
                "copy: " + to + "config.json", "copy: " + to + "model.safetensors.index.json"}));
  EXPECT_EQ(described(io::undo_outputs(model)),
            (std::vector<std::string>{
                "undo file: " + in + first_shard + ".kshard-undo",
                "undo file's temporary: " + in + first_shard + ".kshard-undo.kshard-partial",
                "undo file: " + in + second_shard + ".kshard-undo",
                "undo file's temporary: " + in + second_shard + ".kshard-undo.kshard-partial"}));

  EXPECT_EQ(collective_error(
                [&] { io::refuse_clashes(line.group(), io::rewrite_paths(model, out), "x"); }),
            "");
  // The output folder is the checkpoint's, spelled through a subfolder and `..`.
  const std::string message = collective_error([&] {
    io::refuse_clashes(line.group(), io::rewrite_paths(model, folder.path / "1_Pooling/.."),
                       "nothing was written");
  });
  EXPECT_NE(message.find("is the checkpoint file '" + in + first_shard +
                         "' (one file); nothing "
                         "was written"),
            std::string::npos)
      << message;
}

}  // namespace
