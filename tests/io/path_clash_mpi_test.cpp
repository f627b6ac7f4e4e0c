// No write of kshard::io touches its own input, however the paths are spelled: a generated
// table of every writing operation x every path it creates or removes x every spelling that
// makes that path name an input (the same text, a spelling through `..`, a symbolic link, a
// hard link). Each case hashes every file of its folder before and after, and expects the same
// error on every rank, naming both paths. Then the undo file's record of what the in-place
// write left behind (identity, size, row hashes), and stale temporaries.

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kshard/distribute.hpp"
#include "kshard/io/safetensors.hpp"
#include "kshard_test.hpp"
#include "safetensors_mpi_support.hpp"

namespace {

using namespace kshard_io_mpi_test;  // fs, io, index_t, ExecSpace, MemSpace and the helpers

enum class Spelling { same, dotdot, symlink, hardlink };
constexpr std::array spellings{Spelling::same, Spelling::dotdot, Spelling::symlink,
                               Spelling::hardlink};

std::string to_string(Spelling s) {
  switch (s) {
    case Spelling::same:
      return "the same path";
    case Spelling::dotdot:
      return "a path through ..";
    case Spelling::symlink:
      return "a symbolic link";
    case Spelling::hardlink:
      return "a hard link";
  }
  return "?";
}

// One folder per case, with a subfolder for the spellings through `..`.
struct Place {
  fs::path folder;
  // `name` in the folder, spelled through sub/.. when `dotdot`.
  [[nodiscard]] fs::path at(const std::string& name, bool dotdot = false) const {
    return dotdot ? folder / "sub" / ".." / name : folder / name;
  }
};

// Rank 0 makes `made` name the file `input` (which exists): a symbolic or a hard link there.
void link(Spelling spelling, const fs::path& input, const fs::path& made) {
  if (kshard::test::world_rank() == 0) {
    if (spelling == Spelling::symlink) fs::create_symlink(input, made);
    if (spelling == Spelling::hardlink) fs::create_hard_link(input, made);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// The paths of one case: where the operation's argument points, and where its input lies, so
// that made_of(argument) names the input.
struct Paths {
  fs::path argument;  // the output or undo path passed to the operation
  fs::path input;     // the input file, written by the case
  fs::path made;      // the path the operation would create: made_of(argument)
};

// `made_of` gives the created path from the argument ("o" -> "o" or "o.kshard-partial"). Same
// text and `..`: the input is written at the created path itself. Links: the input lies
// elsewhere, and a link at the created path names it.
Paths spell(const Place& place, Spelling spelling,
            const std::function<fs::path(const fs::path&)>& made_of,
            const std::function<void(const fs::path&)>& write_input) {
  Paths p;
  const bool dotdot = spelling == Spelling::dotdot;
  p.argument = place.at("o.bin", dotdot);
  p.made = made_of(p.argument);
  if (spelling == Spelling::same || dotdot) {
    p.input = made_of(place.at("o.bin"));
    write_input(p.input);
  } else {
    p.input = place.at("in.safetensors");
    write_input(p.input);
    link(spelling, p.input, p.made);
  }
  return p;
}

// One generated case: `run` must refuse alike on every rank, naming both paths, with no
// file of the folder changed.
void expect_refused(const Place& place, const Paths& p, const std::string& phrase,
                    const std::function<void()>& run) {
  const std::int64_t before = folder_digest(place.folder);
  const std::string message = kshard::test::collective_error(run);
  EXPECT_NE(message.find(phrase), std::string::npos) << message;
  EXPECT_NE(message.find("'" + p.made.string() + "'"), std::string::npos) << message;
  EXPECT_NE(message.find("'" + p.input.string() + "'"), std::string::npos) << message;
  EXPECT_EQ(folder_digest(place.folder), before) << "a file changed: " << message;
}

using Image = std::vector<std::byte>;

// A 6 x 4 F32 checkpoint, `seed` choosing its values.
Image small_checkpoint(std::uint64_t seed) {
  return checkpoint_image(kshard::test::reference_matrix<float>(6, 4, seed));
}

fs::path same(const fs::path& p) { return p; }
fs::path temporary(const fs::path& p) { return kshard::detail::partial_path(p); }

// write_safetensors and write_rows_in_place against the output (undo file) and its temporary.
int library_writes(const kshard::Mesh<1>& line, const Scratch& scratch) {
  const kshard::Layout layout(kshard::Shard<0>{});
  const std::vector<std::pair<std::string, fs::path (*)(const fs::path&)>> made{
      {"output", same}, {"temporary", temporary}};
  int cases = 0;
  for (const bool in_place : {false, true})
    for (const auto& [role, made_of] : made)
      for (const Spelling spelling : spellings) {
        const std::string name = fmt::format("{} {} as {}", in_place ? "in-place" : "new file",
                                             role, to_string(spelling));
        SCOPED_TRACE(name);
        const Place place{scratch / fmt::format("case{}", cases++)};
        if (kshard::test::world_rank() == 0) fs::create_directories(place.folder / "sub");
        MPI_Barrier(MPI_COMM_WORLD);
        const Paths p = spell(place, spelling, made_of,
                              [](const fs::path& at) { write_file(at, small_checkpoint(3)); });
        const io::SafetensorsFile file(line, p.input);
        const auto matrix =
            io::read_matrix<float, ExecSpace, MemSpace>(file, "weight", line, layout);
        expect_refused(place, p, in_place ? "is the checkpoint" : "is the input", [&] {
          if (in_place)
            io::write_rows_in_place(line, file, {io::replace_rows("weight", matrix, {1})},
                                    p.argument);
          else
            io::write_safetensors(line, file, p.argument, {io::replace("weight", matrix)});
        });
      }
  return cases;
}

// `undo`'s metadata `key` set to `value` (rank 0 rewrites the file; the data stay).
void set_undo_field(const fs::path& undo, const std::string& key, const std::string& value) {
  if (kshard::test::world_rank() == 0) {
    const Image bytes = read_file(undo);
    std::array<std::byte, 8> prefix{};
    std::copy_n(bytes.begin(), 8, prefix.begin());
    const auto length = io::header_length_from_prefix(prefix, bytes.size());
    io::SafetensorsHeader header = io::parse_safetensors_header(
        std::span<const std::byte>(bytes).subspan(8, length), bytes.size());
    std::vector<io::TensorSpec> specs;
    for (const auto& t : header.tensors) specs.push_back({t.name, t.dtype, t.shape});
    header.metadata[key] = value;
    Image out =
        io::serialize_safetensors_header(io::make_safetensors_header(specs, header.metadata));
    out.insert(out.end(), bytes.begin() + static_cast<std::ptrdiff_t>(8 + length), bytes.end());
    fs::remove(undo);  // a new file: a hard link to it keeps the old bytes
    std::ofstream(undo, std::ios::binary)
        .write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// An in-place write of rows 1 and 4 of `checkpoint` (other values), its undo file `undo`.
void write_in_place(const kshard::Mesh<1>& line, const fs::path& checkpoint, const fs::path& undo) {
  const io::SafetensorsFile file(line, checkpoint);
  const auto other = kshard::test::reference_matrix<float>(6, 4, 99);
  const auto matrix = kshard::distribute<ExecSpace, MemSpace>(
      line, kshard::Layout(kshard::Shard<0>{}), kshard::HostMatrix<const float>(other));
  io::write_rows_in_place(line, file, {io::replace_rows("weight", matrix, {1, 4})}, undo);
}

// undo_in_place whose undo file names itself as the checkpoint to restore, spelled each way.
int undo_names_itself(const kshard::Mesh<1>& line, const Scratch& scratch) {
  int cases = 0;
  for (const Spelling spelling : spellings) {
    SCOPED_TRACE("undo of itself as " + to_string(spelling));
    const Place place{scratch / fmt::format("undo{}", cases++)};
    if (kshard::test::world_rank() == 0) fs::create_directories(place.folder / "sub");
    MPI_Barrier(MPI_COMM_WORLD);
    write_file(place.at("m.safetensors"), small_checkpoint(5));
    const fs::path undo = place.at("o.bin");
    write_in_place(line, place.at("m.safetensors"), undo);
    Paths p{undo, undo, undo};
    if (spelling == Spelling::dotdot) p.input = place.at("o.bin", true);
    if (spelling == Spelling::symlink || spelling == Spelling::hardlink)
      p.input = place.at("link.bin");
    set_undo_field(undo, "kshard.target", p.input.string());
    link(spelling, undo, p.input);  // after the rewrite: a hard link keeps the bytes it saw
    expect_refused(place, p, "is the checkpoint it restores",
                   [&] { io::undo_in_place(line, undo); });
  }
  return cases;
}

TEST(PathClash, NoWriteTouchesItsInputHoweverSpelled) {
  const Scratch scratch;
  const kshard::Mesh<1> line(MPI_COMM_WORLD, {kshard::test::world_size()});
  const int cases = library_writes(line, scratch) + undo_names_itself(line, scratch);
  EXPECT_EQ(cases, 2 * 2 * 4 + 4) << "operations x created paths x spellings";
}

// Rows 1 and 4 written in place, then the checkpoint replaced or changed: undo refuses, naming
// what differs, and changes no file.
TEST(PathClash, UndoRefusesAFileThatIsNotWhatTheWriteLeft) {
  const Scratch scratch;
  const kshard::Mesh<1> line(MPI_COMM_WORLD, {kshard::test::world_size()});
  const fs::path path = scratch / "m.safetensors";
  const fs::path undo = scratch / "m.undo";
  const fs::path kept = scratch / "m.undo.copy";
  const auto refused = [&](const std::string& phrase) {
    const std::int64_t before = folder_digest(scratch / "");
    const std::string message =
        kshard::test::collective_error([&] { io::undo_in_place(line, undo); });
    EXPECT_NE(message.find(phrase), std::string::npos) << message;
    EXPECT_EQ(folder_digest(scratch / ""), before) << message;
  };
  const auto fresh = [&] {
    if (kshard::test::world_rank() == 0) fs::remove(undo);
    write_file(path, small_checkpoint(7));
    write_in_place(line, path, undo);
  };
  // Another file of the same size and layout renamed over it: another inode.
  fresh();
  write_file(scratch / "other", small_checkpoint(8));
  if (kshard::test::world_rank() == 0) fs::rename(scratch / "other", path);
  MPI_Barrier(MPI_COMM_WORLD);
  refused("is not the file the undo file '" + undo.string() + "' was made for");
  // Its bytes overwritten in place (cp over it): the same inode and size, other rows.
  fresh();
  write_file(path, small_checkpoint(9));
  refused("the rows of tensor 'weight' in '" + path.string() + "' are not those");
  // A second undo, from a copy of the undo file kept after the first.
  fresh();
  if (kshard::test::world_rank() == 0) fs::copy_file(undo, kept);
  io::undo_in_place(line, undo);
  EXPECT_TRUE(kshard::test::all_ranks(read_file(path) == small_checkpoint(7)));
  if (kshard::test::world_rank() == 0) fs::rename(kept, undo);
  MPI_Barrier(MPI_COMM_WORLD);
  refused("undone since");
  // An undo file of the first format, which recorded neither.
  fresh();
  set_undo_field(undo, "kshard.undo", "1");
  refused("has format '1'");
}

// A file at a temporary name is replaced only when it carries kshard's marker; any other file
// there is refused and kept.
TEST(PathClash, RemovesOnlyItsOwnTemporaries) {
  const Scratch scratch;
  const kshard::Mesh<1> line(MPI_COMM_WORLD, {kshard::test::world_size()});
  const fs::path path = scratch / "m.safetensors";
  write_file(path, small_checkpoint(11));
  const io::SafetensorsFile file(line, path);
  const auto matrix = io::read_matrix<float, ExecSpace, MemSpace>(
      file, "weight", line, kshard::Layout(kshard::Shard<0>{}));
  Image leftover(kshard::detail::temporary_marker.size());
  std::memcpy(leftover.data(), kshard::detail::temporary_marker.data(), leftover.size());
  leftover.resize(100, std::byte{7});  // a killed run's: the marker, then anything
  const Image foreign = small_checkpoint(12);
  const fs::path out = scratch / "out.safetensors";
  const fs::path undo = scratch / "m.undo";
  const auto write_out = [&] {
    io::write_safetensors(line, file, out, {io::replace("weight", matrix)});
  };
  const auto in_place = [&] {
    io::write_rows_in_place(line, file, {io::replace_rows("weight", matrix, {2})}, undo);
  };
  for (const auto& [target, write] : {std::pair{out, std::function<void()>(write_out)},
                                      std::pair{undo, std::function<void()>(in_place)}}) {
    const fs::path partial = kshard::detail::partial_path(target);
    write_file(partial, foreign);
    const std::string message = kshard::test::collective_error(write);
    EXPECT_NE(message.find("'" + partial.string() +
                           "', the temporary name of this write, holds a "
                           "file that kshard did not write"),
              std::string::npos)
        << message;
    EXPECT_TRUE(kshard::test::all_ranks(read_file(partial) == foreign));
    EXPECT_FALSE(fs::exists(target));
    write_file(partial, leftover);
    write();
    EXPECT_FALSE(fs::exists(partial));
    EXPECT_TRUE(kshard::test::all_ranks(fs::exists(target)));
  }
  io::undo_in_place(line, undo);
  EXPECT_TRUE(kshard::test::all_ranks(read_file(path) == small_checkpoint(11)));
}

}  // namespace
