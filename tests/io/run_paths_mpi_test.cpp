// The guard of every path an operation writes (io/run_paths.hpp), generated over every form of
// checkpoint (a single file, an indexed Hugging Face folder, per-rank shards, a PyTorch DCP
// folder, each with its side files) x every file in it x every spelling of a path that names
// that file (the same text, through `..`, a symbolic link, a hard link): a report beside a
// conversion, a conversion's output and a rewrite's output named there are refused alike on
// every rank, and no byte of the checkpoint changes. An output inside a folder the run copies is
// refused, however that folder is spelled. Then node-local copies that differ on the last rank
// (each rank reads its own copy through a relative path): a size, a byte that describes the
// contents, refused alike; a tensor byte, accepted as the docs say. Then the kinds of file that
// are not regular files, refused at once.

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kshard/io/convert.hpp"
#include "kshard/io/rewrite.hpp"
#include "kshard/io/run_paths.hpp"
#include "kshard/io/verify.hpp"
#include "kshard_test.hpp"
#include "safetensors_mpi_support.hpp"
#include "shard_job.hpp"

namespace {

using namespace kshard_io_mpi_test;
using kshard::test::all_ranks;
using kshard::test::collective_error;

kshard::Mesh<1> line() { return kshard::Mesh<1>(MPI_COMM_WORLD, {kshard::test::world_size()}); }

enum class Spelling { same, dotdot, symlink, hardlink };
constexpr std::array spellings{Spelling::same, Spelling::dotdot, Spelling::symlink,
                               Spelling::hardlink};

// Rank 0 writes `text` to `path`; everyone waits.
void write_text(const fs::path& path, const std::string& text) {
  write_file(path,
             std::vector<std::byte>(reinterpret_cast<const std::byte*>(text.data()),
                                    reinterpret_cast<const std::byte*>(text.data()) + text.size()));
}

// A path that names `target` (a file, or a folder without hard links) spelled `how`; the links
// go into `links` (rank 0 makes them). Nothing when a folder cannot be hard-linked.
fs::path spelled(Spelling how, const fs::path& target, const fs::path& links, int& count) {
  const fs::path link = links / fmt::format("link{}", count++);
  switch (how) {
    case Spelling::same:
      return target;
    case Spelling::dotdot:  // up from its folder and back down
      return target.parent_path() / ".." / target.parent_path().filename() / target.filename();
    case Spelling::symlink:
      if (kshard::test::world_rank() == 0) fs::create_symlink(fs::absolute(target), link);
      break;
    case Spelling::hardlink:
      if (kshard::test::world_rank() == 0) fs::create_hard_link(target, link);
      break;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return link;
}

// Every regular file under `folder`: what a run over the checkpoint there reads or copies.
std::vector<fs::path> files_under(const fs::path& folder) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::recursive_directory_iterator(folder))
    if (entry.is_regular_file()) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

// The four forms, each with side files, made from a 4-rank job's shards by kshard (whose
// conversions the other io tests check against serial references).
class EveryForm : public ::testing::Test {
 protected:
  void SetUp() override {
    const JobCheckpoint job;
    job.write(scratch / "shards");
    if (kshard::test::world_rank() == 0) fs::create_directories(scratch / "shards/.hf_metadata");
    write_text(scratch / "shards/.hf_metadata/config.json", R"({"pad_token_id": 3})");
    write_text(scratch / "shards/.hf_metadata/tokenizer.json", R"({"version": "1.0"})");
    const io::Checkpoint shards(mesh, scratch / "shards");
    io::ConvertOptions dcp;
    dcp.form = io::OutputForm::dcp;
    io::convert_checkpoint(mesh, shards, scratch / "dcp", dcp);
    io::ConvertOptions split;
    split.max_shard_bytes = 600;  // several files and an index
    io::convert_checkpoint(mesh, shards, scratch / "indexed", split);
    if (kshard::test::world_rank() == 0) fs::create_directories(scratch / "indexed/1_Pooling");
    write_text(scratch / "indexed/1_Pooling/config.json", R"({"word_embedding_dimension": 8})");
    io::convert_checkpoint(mesh, shards, scratch / "single", {});
    if (kshard::test::world_rank() == 0) fs::create_directories(scratch / "links");
    MPI_Barrier(MPI_COMM_WORLD);
  }

  // Each form: the path it is opened by, and the folder of its files.
  [[nodiscard]] std::vector<std::pair<fs::path, fs::path>> forms() const {
    return {{scratch / "single/model.safetensors", scratch / "single"},
            {scratch / "indexed", scratch / "indexed"},
            {scratch / "shards", scratch / "shards"},
            {scratch / "dcp", scratch / "dcp"}};
  }

  const Scratch scratch{};
  const kshard::Mesh<1> mesh = line();
};

// Refused alike on every rank (collective_error checks it), naming `phrase`.
void expect_refused(const std::string& message, const std::string& phrase,
                    const std::string& what) {
  EXPECT_NE(message.find(phrase), std::string::npos) << what << ": " << message;
}

TEST_F(EveryForm, NoWrittenPathNamesAFileTheCheckpointReadsOrCopies) {
  int links = 0;
  for (const auto& [path, folder] : forms()) {
    const io::Checkpoint model(mesh, path);
    const std::int64_t before = folder_digest(folder);
    for (const fs::path& file : files_under(folder)) {
      if (!model.is_folder() && file.filename() == "tokenizer.json") {  // neither read nor copied
        io::RunPaths paths = io::conversion_paths(model, scratch / "out");
        paths.makes.push_back({"report", file});
        EXPECT_EQ(collective_error([&] { io::refuse_clashes(mesh.group(), paths, "x"); }), "");
        continue;
      }
      for (const Spelling how : spellings) {
        const fs::path made = spelled(how, file, scratch / "links", links);
        const std::string what = fmt::format("{} as {}", file.string(), made.string());
        io::RunPaths paths = io::conversion_paths(model, scratch / "out");
        paths.makes.push_back({"report", made});
        expect_refused(collective_error([&] { io::refuse_clashes(mesh.group(), paths, "x"); }),
                       "the report '" + made.string() + "'", what);
        paths = io::rewrite_paths(model, scratch / "out");
        paths.makes.push_back({"report", made});
        EXPECT_NE(collective_error([&] { io::convert_checkpoint(mesh, model, made, {}); }), "")
            << what;
        if (model.form() == io::CheckpointForm::dcp) continue;  // written by conversions only
        expect_refused(collective_error([&] { io::refuse_clashes(mesh.group(), paths, "x"); }),
                       "the report '" + made.string() + "'", what);
        EXPECT_NE(collective_error([&] { io::write_checkpoint(mesh, model, made, {}); }), "")
            << what;
      }
    }
    EXPECT_EQ(folder_digest(folder), before) << path.string();
  }
}

TEST_F(EveryForm, NoOutputLiesInsideAFolderTheRunCopies) {
  int links = 0;
  for (const auto& [path, folder] : forms()) {
    const io::Checkpoint model(mesh, path);
    const std::int64_t before = folder_digest(folder);
    for (const io::NamedPath& copied : io::copied_folders(model))
      for (const Spelling how : {Spelling::same, Spelling::dotdot, Spelling::symlink})
        for (const char* inside : {"new", "deeper/new"}) {
          const fs::path out = spelled(how, copied.path, scratch / "links", links) / inside;
          if (kshard::test::world_rank() == 0)
            fs::create_directories(out.parent_path());  // "deeper" exists: only the guard stops it
          MPI_Barrier(MPI_COMM_WORLD);
          expect_refused(collective_error([&] { io::convert_checkpoint(mesh, model, out, {}); }),
                         "lies inside the " + copied.role, out.string());
          EXPECT_TRUE(all_ranks(!fs::exists(out)));
          if (kshard::test::world_rank() == 0) fs::remove_all(copied.path / "deeper");
        }
    EXPECT_EQ(folder_digest(folder), before) << path.string();
  }
  // A DCP or shards folder is not copied whole: a conversion may go inside it (NeMo
  // AutoModel's consolidated/).
  const io::Checkpoint dcp(mesh, scratch / "dcp");
  EXPECT_EQ(io::convert_checkpoint(mesh, dcp, scratch / "dcp/consolidated", {}).size(), 1U);
}

TEST_F(EveryForm, UnusablePathsAreRefusedBeforeAnythingIsRead) {
  const auto refuse = [&](const io::NamedPath& given, const std::string& phrase) {
    expect_refused(collective_error([&] { io::refuse_unusable_paths(mesh.group(), {given}); }),
                   phrase, given.path.string());
  };
  refuse({"output folder", "", true}, "the output folder is an empty path");
  refuse({"report", scratch / "no/such/file"}, "of the report '");
  refuse({"report", scratch / "dcp"}, "exists and is not a regular file");
  refuse({"output folder", scratch / "single/model.safetensors", true}, "is not a folder");
  if (kshard::test::world_rank() == 0) ::mkfifo((scratch / "fifo").c_str(), 0644);
  MPI_Barrier(MPI_COMM_WORLD);
  refuse({"report", scratch / "fifo"}, "exists and is not a regular file");
  EXPECT_EQ(collective_error([&] {
              io::refuse_unusable_paths(mesh.group(), {{"report", scratch / "new.json"},
                                                       {"output folder", scratch / "out/", true}});
            }),
            "");
  const io::Checkpoint single(mesh, scratch / "single/model.safetensors");
  expect_refused(collective_error([&] { io::convert_checkpoint(mesh, single, "", {}); }),
                 "the output folder is an empty path", "convert_checkpoint");
  EXPECT_TRUE(all_ranks(!fs::exists(".kshard-partial")));
}

// Each rank works in its own folder holding a copy of the checkpoint, opened as "copy": what
// node-local storage gives each rank of a job.
class NodeLocalCopies : public EveryForm {
 protected:
  void SetUp() override {
    EveryForm::SetUp();
    mine = scratch / fmt::format("rank{}", kshard::test::world_rank());
    fs::create_directories(mine);
    home = fs::current_path();
  }
  void TearDown() override { fs::current_path(home); }

  // Every rank copies `form` to its folder as "copy"; the last rank then lets `change` alter
  // file `file` (relative) of its copy; every rank goes into its folder.
  template <class Change>
  void copy_and_change(const fs::path& form, const fs::path& file, Change&& change) {
    fs::current_path(home);
    fs::remove_all(mine / "copy");
    fs::copy(form, mine / "copy", fs::copy_options::recursive);
    if (kshard::test::world_rank() == kshard::test::world_size() - 1) change(mine / "copy" / file);
    MPI_Barrier(MPI_COMM_WORLD);
    fs::current_path(mine);
  }

  fs::path mine, home;
};

// `path` with one more byte at the end, or its byte at `at` flipped.
void append_byte(const fs::path& path) {
  auto bytes = read_file(path);
  bytes.push_back(std::byte{0});
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}
void flip_byte(const fs::path& path, std::uint64_t at) {
  auto bytes = read_file(path);
  bytes.at(at) ^= std::byte{1};
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

TEST_F(NodeLocalCopies, ACopyThatDiffersOnTheLastRankIsRefusedAlike) {
  if (kshard::test::world_size() == 1) GTEST_SKIP() << "one rank reads one copy";
  const int last = kshard::test::world_size() - 1;
  for (const auto& [path, folder] : forms()) {
    const fs::path relative = path.lexically_relative(folder);  // "." or the file's name
    const fs::path opened = relative == "." ? fs::path("copy") : "copy" / relative;
    for (const fs::path& file : files_under(folder)) {
      const fs::path name = file.lexically_relative(folder);
      const io::Checkpoint model(mesh, path);
      const auto read = io::checkpoint_inputs(model, false);
      const bool described = std::any_of(read.begin(), read.end(), [&](const io::NamedPath& r) {
        return fs::equivalent(r.path, file);
      });
      if (!described) continue;  // side files: copied by rank 0, never read by the others
      copy_and_change(folder, name, append_byte);
      const std::string message = collective_error([&] { io::Checkpoint(mesh, opened); });
      EXPECT_NE(message, "") << "a longer " << name.string();
      if (name.extension() != ".safetensors")  // a header's file: its own agreement says it
        expect_refused(message, fmt::format("rank {}'s copy of", last), name.string());
      // The first byte rank 0 read to learn the layout: the JSON, the header, the pickle.
      const std::uint64_t at = name.extension() == ".safetensors" ? 8 : 0;
      copy_and_change(folder, name, [&](const fs::path& p) { flip_byte(p, at); });
      EXPECT_NE(collective_error([&] { io::Checkpoint(mesh, opened); }), "")
          << "a changed byte of " << name.string();
    }
  }
}

TEST_F(NodeLocalCopies, ATensorByteThatDiffersIsLeftToTheChecksums) {
  if (kshard::test::world_size() == 1) GTEST_SKIP() << "one rank reads one copy";
  // One tensor of 128 KiB: its first bytes lie before the 68 KiB the reader reads at the end of
  // its archive (small tensors' bytes are inside it, so compared like the descriptions).
  std::map<std::string, Tensor> tensors{{"big", make_tensor(io::Dtype::F32, {256, 128}, 3)}};
  write_file(scratch / "big.safetensors", consolidated_file(tensors));
  io::ConvertOptions dcp;
  dcp.form = io::OutputForm::dcp;
  io::convert_checkpoint(mesh, io::Checkpoint(mesh, scratch / "big.safetensors"), scratch / "big",
                         dcp);
  const io::Checkpoint big(mesh, scratch / "big");
  const io::StoredChecksum& checksum = big.checksums().front();
  copy_and_change(scratch / "big", big.data_files()[checksum.file].path.filename(),
                  [&](const fs::path& p) { flip_byte(p, checksum.offset); });
  const io::Checkpoint opened(mesh, "copy");  // sizes and descriptions agree: accepted
  EXPECT_EQ(opened.tensor("big").shape, (std::vector<std::int64_t>{256, 128}));
}

TEST_F(EveryForm, NonRegularFilesAreRefusedAtOnce) {
  const auto replace = [&](const fs::path& file, const std::string& kind) {
    if (kshard::test::world_rank() != 0) return;
    fs::remove(file);
    if (kind == "fifo") ::mkfifo(file.c_str(), 0644);
    if (kind == "folder") fs::create_directory(file);
    if (kind == "device") fs::create_symlink("/dev/zero", file);
    if (kind == "socket") {
      const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
      sockaddr_un address{};
      address.sun_family = AF_UNIX;
      std::snprintf(address.sun_path, sizeof address.sun_path, "%s", file.c_str());
      ::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address);
      ::close(fd);
    }
  };
  const std::vector<std::pair<fs::path, fs::path>> cases{
      {scratch / "single", "model.safetensors"},
      {scratch / "single", "config.json"},
      {scratch / "indexed", "model.safetensors.index.json"},
      {scratch / "shards", shard_name(3)},
      {scratch / "shards", ".hf_metadata/config.json"},
      {scratch / "dcp", ".metadata"},
      {scratch / "dcp", "__3_0.distcp"}};
  for (const char* kind : {"fifo", "folder", "device", "socket"})
    for (const auto& [folder, name] : cases) {
      const fs::path copy = scratch / "broken";
      if (kshard::test::world_rank() == 0) fs::copy(folder, copy, fs::copy_options::recursive);
      replace(copy / name, kind);
      MPI_Barrier(MPI_COMM_WORLD);
      const auto start = std::chrono::steady_clock::now();
      const std::string message = collective_error([&] {
        const io::Checkpoint model(mesh, copy);
        io::convert_checkpoint(mesh, model, scratch / "out", {});
      });
      EXPECT_NE(message, "") << kind << " " << name.string();
      EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
      EXPECT_TRUE(all_ranks(!fs::exists(scratch / "out")));
      if (kshard::test::world_rank() == 0) fs::remove_all(copy);
      MPI_Barrier(MPI_COMM_WORLD);
    }
}

}  // namespace
