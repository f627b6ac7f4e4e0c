// Reading and writing safetensors checkpoints with MPI-IO, at any rank count: every layout of
// one and two mesh dimensions, each rank's bytes read and written counted, the written file
// compared byte for byte with one built serially, and bad files refused alike on every rank.

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/ranges.h>

#include "kshard/distribute.hpp"
#include "kshard/format.hpp"
#include "kshard/io/checkpoint.hpp"
#include "kshard/io/safetensors.hpp"
#include "kshard/rowwise.hpp"
#include "kshard_test.hpp"
#include "safetensors_mpi_support.hpp"

namespace {

using namespace kshard_io_mpi_test;  // fs, io, index_t, ExecSpace, MemSpace and the helpers

// A shard of a sharded checkpoint: `weight` alone, or zero-filled `specs` (no tensor is in two
// shards).
template <class T>
std::vector<std::byte> weight_file(const kshard::HostMatrix<T>& weight) {
  const std::vector<io::TensorSpec> specs{
      {"weight",
       io::dtype_of<T>(),
       {static_cast<std::int64_t>(weight.extent(0)), static_cast<std::int64_t>(weight.extent(1))}}};
  const auto header = io::make_safetensors_header(specs, {});
  std::vector<std::byte> file = io::serialize_safetensors_header(header);
  const auto weight_bytes = bytes_of(weight);
  file.insert(file.end(), weight_bytes.begin(), weight_bytes.end());
  return file;
}

std::vector<std::byte> zero_file(const std::vector<io::TensorSpec>& specs) {
  const auto header = io::make_safetensors_header(specs, {});
  std::vector<std::byte> file = io::serialize_safetensors_header(header);
  file.resize(file.size() + header.data_size);
  return file;
}

// The bytes this rank must read or write for `matrix`: its shard when it holds a first copy.
template <class M>
std::int64_t first_copy_bytes(const M& matrix) {
  using L = typename M::layout_type;
  if (!L::is_first_copy(matrix.mesh().coords(), {0, 1})) return 0;
  return matrix.mapping().local_size() * static_cast<std::int64_t>(sizeof(typename M::value_type));
}

// The bytes of this rank's block of whole rows (rows split over every mesh dimension).
template <class M>
std::int64_t row_block_bytes(const M& matrix) {
  const auto& mesh = matrix.mesh();
  const auto blocks = kshard::map_layout(kshard::detail::row_blocks_t<M::mesh_rank>{}.actions(),
                                         mesh.shape(), mesh.coords(), matrix.rows(), matrix.cols());
  return blocks.local_size() * static_cast<std::int64_t>(sizeof(typename M::value_type));
}

template <class T, class M>
void expect_holds(const M& matrix, const kshard::HostMatrix<T>& full) {
  const auto local = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), matrix.local());
  const auto& map = matrix.mapping();
  bool same = true;
  for (index_t i = 0; i < map.rows.local_extent(); ++i)
    for (index_t j = 0; j < map.cols.local_extent(); ++j)
      same = same && std::memcmp(&local(i, j), &full(map.rows.to_global(i), map.cols.to_global(j)),
                                 sizeof(T)) == 0;
  EXPECT_TRUE(same);
}

// Reads "weight" with `layout` on `mesh`, checks values and bytes read, then writes it back
// scaled into a new file, which must equal the serially built image byte for byte.
template <class T, std::size_t N, class L>
void round_trip(const Scratch& scratch, const kshard::Mesh<N>& mesh, const L& layout, index_t rows,
                index_t cols) {
  SCOPED_TRACE(fmt::format("{} x {} on mesh ({}), layout {}", rows, cols,
                           fmt::join(mesh.shape(), ", "), layout));
  const auto full = kshard::test::reference_matrix<T>(rows, cols, 17);
  const fs::path source = scratch / "in.safetensors";
  const fs::path target = scratch / "out.safetensors";
  write_file(source, checkpoint_image(full));

  const io::SafetensorsFile file(mesh, source);
  io::reset_io_stats();
  auto matrix = io::read_matrix<T, ExecSpace, MemSpace>(file, "weight", mesh, layout);
  expect_holds(matrix, full);
  // Every byte of the tensor is read once: a rank reads its first copies, or, where the layout
  // splits columns over more than one rank (pieces of every row), its block of whole rows.
  std::int64_t read = io::io_stats().bytes_read;
  EXPECT_EQ(read, kshard::detail::holds_pieces_of_rows(matrix) ? row_block_bytes(matrix)
                                                               : first_copy_bytes(matrix));
  MPI_Allreduce(MPI_IN_PLACE, &read, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(read, rows * cols * static_cast<std::int64_t>(sizeof(T)));

  kshard::HostMatrix<T> scaled("scaled", full.extent(0), full.extent(1));
  for (std::size_t r = 0; r < full.extent(0); ++r)
    for (std::size_t c = 0; c < full.extent(1); ++c)
      scaled(r, c) = static_cast<T>(-2.0 * static_cast<double>(full(r, c)));
  auto replacement =
      kshard::distribute<ExecSpace, MemSpace>(mesh, layout, kshard::HostMatrix<const T>(scaled));
  io::reset_io_stats();
  io::write_safetensors(mesh, file, target, {io::replace("weight", replacement)});
  std::int64_t written = io::io_stats().bytes_written;
  MPI_Allreduce(MPI_IN_PLACE, &written, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(written, static_cast<std::int64_t>(file.file_size() + marker_bytes))
      << "each byte once, and the temporary's marker";
  const auto expected = checkpoint_image(scaled);
  EXPECT_TRUE(kshard::test::all_ranks(read_file(target) == expected));
  EXPECT_FALSE(fs::exists(kshard::detail::partial_path(target)));
}

TEST(SafetensorsMpi, ReadsAndWritesEveryLayout) {
  const Scratch scratch;
  const int size = kshard::test::world_size();
  std::uint64_t seed = 900;
  const kshard::Mesh<1> line(MPI_COMM_WORLD, {size});
  for (const auto shape : kshard::test::mesh_shapes<2>(size)) {
    const kshard::Mesh<2> mesh(MPI_COMM_WORLD, shape);
    kshard::test::for_each_layout(
        seed, [&](const auto& layout) { round_trip<float>(scratch, line, layout, 7, 5); },
        [&](const auto& layout) { round_trip<float>(scratch, mesh, layout, 9, 6); });
  }
}

TEST(SafetensorsMpi, ReadsEveryElementType) {
  const Scratch scratch;
  const kshard::Mesh<2> mesh = kshard::test::dp_tp_mesh();
  const kshard::Layout layout(kshard::Replicate{}, kshard::Shard<0>{});
  round_trip<double>(scratch, mesh, layout, 11, 3);
  round_trip<kshard::bf16>(scratch, mesh, layout, 5, 8);
  round_trip<kshard::f16>(scratch, mesh, layout, 6, 7);
  // Split columns: read as row blocks and redistributed, for every element type.
  const kshard::Layout columns(kshard::Shard<1>{}, kshard::Shard<1>{});
  round_trip<double>(scratch, mesh, columns, 11, 7);
  round_trip<kshard::bf16>(scratch, mesh, columns, 5, 9);
  round_trip<kshard::f16>(scratch, mesh, columns, 4, 9);
  // Empty shards (more ranks than rows) and an empty matrix.
  round_trip<float>(scratch, mesh, kshard::Layout(kshard::Shard<1>{}, kshard::Shard<0>{}), 1, 1);
  round_trip<float>(scratch, mesh, layout, 0, 4);
}

// Replicas receive their block by broadcast instead of reading it again.
TEST(SafetensorsMpi, ReplicasDoNotReadTheFile) {
  const Scratch scratch;
  const kshard::Mesh<1> line(MPI_COMM_WORLD, {kshard::test::world_size()});
  const auto full = kshard::test::reference_matrix<float>(64, 16, 3);
  write_file(scratch / "r.safetensors", checkpoint_image(full));
  const io::SafetensorsFile file(line, scratch / "r.safetensors");
  io::reset_io_stats();
  const auto matrix = io::read_matrix<float, ExecSpace, MemSpace>(
      file, "weight", line, kshard::Layout(kshard::Replicate{}));
  expect_holds(matrix, full);
  std::int64_t total = io::io_stats().bytes_read;
  MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(total, 64 * 16 * 4);
}

// Files that lie, and requests that do not fit them: the same error everywhere, nothing
// written.
TEST(SafetensorsMpi, RefusesBadFilesAndRequestsAlike) {
  const Scratch scratch;
  const kshard::Mesh<1> line(MPI_COMM_WORLD, {kshard::test::world_size()});
  const kshard::Layout layout(kshard::Shard<0>{});
  const auto full = kshard::test::reference_matrix<float>(6, 4, 5);
  const auto good = checkpoint_image(full);
  const fs::path path = scratch / "bad.safetensors";
  const fs::path target = scratch / "never.safetensors";

  auto refused = [&](const std::vector<std::byte>& image, const std::string& phrase) {
    write_file(path, image);
    const std::string message = kshard::test::collective_error([&] {
      const io::SafetensorsFile file(line, path);
      static_cast<void>(io::read_matrix<float, ExecSpace, MemSpace>(file, "weight", line, layout));
    });
    EXPECT_NE(message.find(phrase), std::string::npos) << message;
  };
  auto truncated = good;
  truncated.pop_back();
  refused(truncated, "end");
  auto long_header = good;
  long_header[0] = std::byte{0xff};
  long_header[1] = std::byte{0xff};
  refused(long_header, "header");
  auto invalid_json = good;
  invalid_json[9] = std::byte{'x'};
  refused(invalid_json, "JSON");
  refused(std::vector<std::byte>(5), "fewer than the 8");

  write_file(path, good);
  const io::SafetensorsFile file(line, path);
  auto read_as = [&](auto element, const std::string& name, const std::string& phrase) {
    const std::string message = kshard::test::collective_error([&] {
      static_cast<void>(
          io::read_matrix<decltype(element), ExecSpace, MemSpace>(file, name, line, layout));
    });
    EXPECT_NE(message.find(phrase), std::string::npos) << message;
  };
  read_as(float{}, "missing", "has no tensor 'missing'");
  read_as(double{}, "weight", "is F32, but the matrix holds double");
  read_as(double{}, "odd", "is U8, but the matrix holds double");
  read_as(double{}, "after", "has shape [4]; a matrix needs 2 dimensions");
  kshard::test::expect_collective_refusal(
      "the tensor name differs", {"the tensor name differs between ranks"},
      [&](bool here) {
        static_cast<void>(io::read_matrix<float, ExecSpace, MemSpace>(
            file, here ? "twin" : "weight", line, layout));
      },
      {}, /*one_rank_only=*/true);
  kshard::test::expect_collective_refusal(
      "the path differs", {"the file path differs between ranks", "cannot open"}, [&](bool here) {
        static_cast<void>(io::SafetensorsFile(line, here ? scratch / "none" : path));
      });

  const auto matrix = io::read_matrix<float, ExecSpace, MemSpace>(file, "weight", line, layout);
  const auto wide =
      kshard::DistMatrix<float, kshard::Layout<kshard::Shard<0>>, ExecSpace, MemSpace>(line, layout,
                                                                                       6, 5);
  auto write_refused = [&](const fs::path& to, std::vector<io::TensorUpdate> updates,
                           const std::string& phrase) {
    const std::string message =
        kshard::test::collective_error([&] { io::write_safetensors(line, file, to, updates); });
    EXPECT_NE(message.find(phrase), std::string::npos) << message;
    EXPECT_FALSE(fs::exists(to)) << to;
    EXPECT_FALSE(fs::exists(kshard::detail::partial_path(to)));
  };
  write_refused(target, {io::replace("weight", wide)}, "[6, 4], but the matrix replacing it");
  write_refused(target, {io::replace("nothing", matrix)}, "has no tensor 'nothing' to replace");
  write_refused(target, {io::replace("weight", matrix), io::replace("weight", matrix)},
                "replaced twice");
  write_refused(scratch / "no" / "such.safetensors", {io::replace("weight", matrix)},
                "does not exist");
  const std::string same = kshard::test::collective_error(
      [&] { io::write_safetensors(line, file, path, {io::replace("weight", matrix)}); });
  EXPECT_NE(same.find("is the input '" + path.string() + "' (one file)"), std::string::npos)
      << same;
  EXPECT_TRUE(kshard::test::all_ranks(read_file(path) == good)) << "the input is unchanged";
}

// `full` with rows `ids` negated: what an in-place write of those rows leaves.
template <class T>
kshard::HostMatrix<T> with_rows_negated(const kshard::HostMatrix<T>& full,
                                        const std::vector<index_t>& ids) {
  kshard::HostMatrix<T> changed("changed", full.extent(0), full.extent(1));
  Kokkos::deep_copy(changed, full);
  for (const index_t id : ids)
    for (std::size_t c = 0; c < full.extent(1); ++c)
      changed(static_cast<std::size_t>(id), c) =
          static_cast<T>(-full(static_cast<std::size_t>(id), c));
  return changed;
}

std::int64_t sum_over_ranks(std::int64_t value) {
  MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return value;
}

// Rows written in place: exactly those bytes plus the undo file; undo restores every byte.
template <std::size_t N, class L>
void in_place(const Scratch& scratch, const kshard::Mesh<N>& mesh, const L& layout) {
  const index_t rows = 10;
  const index_t cols = 6;
  const auto full = kshard::test::reference_matrix<float>(rows, cols, 23);
  const fs::path path = scratch / "model.safetensors";
  const fs::path undo = scratch / "model.undo";
  const auto original = checkpoint_image(full);
  write_file(path, original);
  const std::vector<index_t> ids{rows - 1, 0, 4, 5, 4};  // unsorted, repeated: 3 distinct + 0
  const auto changed = with_rows_negated(full, {0, 4, 5, rows - 1});
  const io::SafetensorsFile file(mesh, path);
  const auto matrix = kshard::distribute<ExecSpace, MemSpace>(
      mesh, layout, kshard::HostMatrix<const float>(changed));

  io::reset_io_stats();
  io::write_rows_in_place(mesh, file, {io::replace_rows("weight", matrix, ids)}, undo);
  // Rank 0 writes the undo file (and its marker), then marks it written: a few header bytes.
  const std::int64_t undo_bytes =
      kshard::test::world_rank() == 0
          ? static_cast<std::int64_t>(fs::file_size(undo)) + marker_bytes
          : 0;
  const std::int64_t bookkeeping =
      sum_over_ranks(io::io_stats().bytes_written - undo_bytes) - 4 * cols * 4;
  EXPECT_GT(bookkeeping, 0) << "the undo file is marked written";
  EXPECT_LT(bookkeeping, 200) << "only the rows, the undo file and its state";
  EXPECT_TRUE(kshard::test::all_ranks(read_file(path) == checkpoint_image(changed)));

  io::undo_in_place(mesh, undo);
  EXPECT_TRUE(kshard::test::all_ranks(read_file(path) == original));
  EXPECT_FALSE(fs::exists(undo));
}

// A file that shrinks after it was opened (its header read) is refused on every rank, whichever
// ranks' blocks lie past the new end: a collective read may report every byte read where it
// filled zeros, and a rank whose read came up short must still reach the collective close.
TEST(SafetensorsMpi, RefusesAFileThatShrankAfterItWasOpened) {
  const Scratch scratch;
  const int size = kshard::test::world_size();
  const kshard::Mesh<1> line(MPI_COMM_WORLD, {size});
  const kshard::Mesh<2> grid(MPI_COMM_WORLD, {size, 1});
  const auto full = kshard::test::reference_matrix<float>(12, 4, 3);
  const fs::path path = scratch / "shrinks.safetensors";
  auto refused = [&](const auto& mesh, const auto& layout, double kept) {
    write_file(path, checkpoint_image(full));
    const io::SafetensorsFile file(mesh, path);
    const io::TensorEntry& weight = *file.header().find("weight");
    const auto cut = file.file_offset(weight) +
                     static_cast<std::uint64_t>(kept * static_cast<double>(weight.bytes()));
    if (kshard::test::world_rank() == 0) fs::resize_file(path, cut);
    MPI_Barrier(MPI_COMM_WORLD);
    const std::string message = kshard::test::collective_error([&] {
      static_cast<void>(io::read_matrix<float, ExecSpace, MemSpace>(file, "weight", mesh, layout));
    });
    EXPECT_NE(message.find("shorter than"), std::string::npos) << message;
    EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  };
  for (const double kept : {0.0, 0.4, 0.99, 1.0}) {
    refused(line, kshard::Layout(kshard::Shard<0>{}), kept);
    refused(line, kshard::Layout(kshard::Shard<1>{}), kept);
    refused(line, kshard::Layout(kshard::Replicate{}), kept);
    refused(grid, kshard::Layout(kshard::Replicate{}, kshard::Shard<0>{}), kept);
  }
}

TEST(SafetensorsMpi, WritesRowsInPlaceAndUndoes) {
  const Scratch scratch;
  const int size = kshard::test::world_size();
  const kshard::Mesh<1> line(MPI_COMM_WORLD, {size});
  in_place(scratch, line, kshard::Layout(kshard::Shard<0>{}));
  in_place(scratch, line, kshard::Layout(kshard::Shard<1>{}));
  in_place(scratch, line, kshard::Layout(kshard::Replicate{}));
  in_place(scratch, line, kshard::Layout(kshard::StridedShard<0>{2}));
  const kshard::Mesh<2> mesh = kshard::test::dp_tp_mesh();
  in_place(scratch, mesh, kshard::Layout(kshard::Replicate{}, kshard::Shard<0>{}));
  in_place(scratch, mesh, kshard::Layout(kshard::StridedShard<0>{2}, kshard::Shard<0>{}));
}

// A rows update to a new file lands on the copied tensor: the rows change, nothing else.
TEST(SafetensorsMpi, WritesRowsToANewFile) {
  const Scratch scratch;
  const kshard::Mesh<2> mesh = kshard::test::dp_tp_mesh();
  const kshard::Layout layout(kshard::Shard<1>{}, kshard::Shard<0>{});
  const auto full = kshard::test::reference_matrix<double>(9, 4, 29);
  write_file(scratch / "a.safetensors", checkpoint_image(full));
  const io::SafetensorsFile file(mesh, scratch / "a.safetensors");
  const auto changed = with_rows_negated(full, {2, 8});
  const auto matrix = kshard::distribute<ExecSpace, MemSpace>(
      mesh, layout, kshard::HostMatrix<const double>(changed));
  io::write_safetensors(mesh, file, scratch / "b.safetensors",
                        {io::replace_rows("weight", matrix, {8, 2})});
  EXPECT_TRUE(
      kshard::test::all_ranks(read_file(scratch / "b.safetensors") == checkpoint_image(changed)));
}

TEST(SafetensorsMpi, RefusesInPlaceWritesAlike) {
  const Scratch scratch;
  const kshard::Mesh<1> line(MPI_COMM_WORLD, {kshard::test::world_size()});
  const kshard::Layout layout(kshard::Shard<0>{});
  const auto full = kshard::test::reference_matrix<float>(6, 4, 31);
  const fs::path path = scratch / "m.safetensors";
  const fs::path undo = scratch / "m.undo";
  const auto original = checkpoint_image(full);
  write_file(path, original);
  const io::SafetensorsFile file(line, path);
  const auto matrix = io::read_matrix<float, ExecSpace, MemSpace>(file, "weight", line, layout);
  auto refused = [&](std::vector<io::TensorUpdate> updates, const std::string& phrase) {
    const std::string message =
        kshard::test::collective_error([&] { io::write_rows_in_place(line, file, updates, undo); });
    EXPECT_NE(message.find(phrase), std::string::npos) << message;
    EXPECT_TRUE(kshard::test::all_ranks(read_file(path) == original));
  };
  refused({io::replace("weight", matrix)}, "has no rows");
  refused({io::replace_rows("weight", matrix, {6})},
          "row id 6 of tensor 'weight' is outside [0, 6)");
  refused({io::replace_rows("weight", matrix, {-1})}, "row id -1");
  EXPECT_FALSE(fs::exists(undo));
  kshard::test::expect_collective_refusal(
      "rows differ", {"the rows of 'weight' to replace differs between ranks"},
      [&](bool here) {
        io::write_rows_in_place(
            line, file, {io::replace_rows("weight", matrix, {here ? index_t{1} : 2})}, undo);
      },
      {}, /*one_rank_only=*/true);
  EXPECT_FALSE(fs::exists(undo));

  if (kshard::test::world_rank() == 0) fs::permissions(path, fs::perms::owner_read);
  MPI_Barrier(MPI_COMM_WORLD);
  refused({io::replace_rows("weight", matrix, {1})}, "is read-only");
  EXPECT_FALSE(fs::exists(undo));
  MPI_Barrier(MPI_COMM_WORLD);  // every rank has looked before rank 0 makes one
  if (kshard::test::world_rank() == 0)
    fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write);
  write_file(undo, original);  // not an undo file
  refused({io::replace_rows("weight", matrix, {1})}, "exists already");
  const std::string message =
      kshard::test::collective_error([&] { io::undo_in_place(line, undo); });
  EXPECT_NE(message.find("is not a kshard undo file"), std::string::npos) << message;
}

// Rank 0 writes `text` to `path`; everyone waits for it.
void write_text(const fs::path& path, const std::string& text) {
  std::vector<std::byte> bytes(text.size());
  if (!text.empty()) std::memcpy(bytes.data(), text.data(), text.size());
  write_file(path, bytes);
}

// A sharded checkpoint folder: "weight" in the second file, the config's fields read, and
// indexes and configs that lie refused alike on every rank.
TEST(SafetensorsMpi, OpensShardedCheckpointFolders) {
  const Scratch scratch;
  const kshard::Mesh<1> line(MPI_COMM_WORLD, {kshard::test::world_size()});
  const fs::path folder = scratch / "model";
  if (kshard::test::world_rank() == 0) fs::create_directories(folder);
  const auto full = kshard::test::reference_matrix<float>(5, 3, 37);
  write_file(folder / "a.safetensors",
             zero_file({{"odd", io::Dtype::U8, {3}}, {"after", io::Dtype::F64, {4}}}));
  write_file(folder / "b.safetensors", weight_file(full));
  const std::string index = R"({"metadata": {}, "weight_map": {"weight": "b.safetensors",
      "odd": "a.safetensors", "after": "a.safetensors"}})";
  write_text(folder / "model.safetensors.index.json", index);
  write_text(folder / "config.json", R"({"pad_token_id": 3, "tie_word_embeddings": false,
      "vocab_size": 5, "hidden_size": 3})");

  const io::Checkpoint model(line, folder);
  EXPECT_TRUE(model.is_folder());
  EXPECT_EQ(model.files().size(), 2u);
  EXPECT_EQ(model.file_of("weight").path(), folder / "b.safetensors");
  EXPECT_EQ(model.tensor_names(), (std::vector<std::string>{"after", "odd", "weight"}));
  EXPECT_EQ(model.config().pad_token_id, 3);
  EXPECT_EQ(model.config().tie_word_embeddings, false);
  EXPECT_EQ(model.config().vocab_size, 5);
  const auto matrix = io::read_matrix<float, ExecSpace, MemSpace>(
      model.file_of("weight"), "weight", line, kshard::Layout(kshard::Shard<0>{}));
  expect_holds(matrix, full);

  auto refused = [&](const std::string& file, const std::string& text, const std::string& phrase) {
    write_text(folder / file, text);
    const std::string message =
        kshard::test::collective_error([&] { static_cast<void>(io::Checkpoint(line, folder)); });
    EXPECT_NE(message.find(phrase), std::string::npos) << message;
  };
  refused("model.safetensors.index.json", R"({"weight_map": {"weight": "../b.safetensors"}})",
          "not a file name in the checkpoint's folder");
  refused("model.safetensors.index.json", R"({"weight_map": {"twin2": "b.safetensors"}})",
          "which has no such tensor");
  refused("model.safetensors.index.json", R"({"weight_map": {"weight": "c.safetensors"}})",
          "cannot open");
  refused("model.safetensors.index.json", R"({"weight_map": [1, 2]})", "no \"weight_map\"");
  refused("model.safetensors.index.json", "{", "not valid JSON");
  write_text(folder / "model.safetensors.index.json", index);
  refused("config.json", R"({"pad_token_id": "zero"})",
          "\"pad_token_id\" is \"zero\", not an integer");
  refused("config.json", R"({"tie_word_embeddings": 1})", "not true or false");
  const std::string missing = kshard::test::collective_error(
      [&] { static_cast<void>(io::Checkpoint(line, scratch / "nothing")); });
  EXPECT_NE(missing.find("cannot open"), std::string::npos) << missing;
}

// Checkpoints that lie in ways a header check alone does not see: JSON nested deeper than any
// message may render, ids past int64, a tensor in two shards, a FIFO in place of a file, and
// ranks that find different files under one path (node-local copies); each refused alike, and
// a single file's config.json read from its folder.
TEST(SafetensorsMpi, RefusesCheckpointsThatLieAlike) {
  const Scratch scratch;
  const kshard::Mesh<1> line(MPI_COMM_WORLD, {kshard::test::world_size()});
  const int rank = kshard::test::world_rank();
  const fs::path folder = scratch / "model";
  if (rank == 0) fs::create_directories(folder);
  const auto small = kshard::test::reference_matrix<float>(4, 2, 5);
  write_file(folder / "a.safetensors", weight_file(small));
  write_file(folder / "b.safetensors", checkpoint_image(small));  // "weight" again
  const auto refused = [&](const fs::path& path, const std::string& phrase) {
    const std::string message =
        kshard::test::collective_error([&] { static_cast<void>(io::Checkpoint(line, path)); });
    EXPECT_NE(message.find(phrase), std::string::npos) << message;
    EXPECT_LT(message.size(), 1000u) << "an error message must not echo the file";
  };

  write_text(folder / "model.safetensors.index.json",
             R"({"weight_map": {"weight": "a.safetensors", "twin": "b.safetensors"}})");
  refused(folder, "tensor 'weight' is in '" + (folder / "a.safetensors").string() + "' and in '" +
                      (folder / "b.safetensors").string() + "'");

  fs::remove(folder / "model.safetensors.index.json");
  write_file(folder / "model.safetensors", checkpoint_image(small));
  const std::string deep(200000, '[');  // recursing through it overflows the stack
  write_text(folder / "config.json", R"({"pad_token_id": )" + deep + "]}");
  refused(folder, "not valid JSON");
  write_text(folder / "config.json",
             R"({"pad_token_id": )" + deep + std::string(200000, ']') + "}");
  refused(folder, "\"pad_token_id\" is an array, not an integer");
  write_text(folder / "config.json", R"({"pad_token_id": 18446744073709551611})");
  refused(folder, "18446744073709551611, more than the largest id 9223372036854775807");
  write_text(folder / "config.json", R"({"pad_token_id": -1})");
  EXPECT_FALSE(io::Checkpoint(line, folder).config().pad_token_id.has_value());
  write_text(folder / "config.json", R"({"pad_token_id": 2})");
  EXPECT_EQ(io::Checkpoint(line, folder / "a.safetensors").config().pad_token_id, 2)
      << "a single file's config.json is its folder's";

  if (rank == 0) {
    EXPECT_EQ(::mkfifo((scratch / "fifo").c_str(), 0600), 0);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  refused(scratch / "fifo", "is not a regular file");  // not a wait for a writer

  // The same relative path names another file on rank 1 (its own working directory).
  const fs::path mine = scratch / fmt::format("rank{}", rank);
  fs::create_directories(mine);
  const auto other = kshard::test::reference_matrix<float>(rank == 1 ? 3 : 4, 2, 5);
  {
    std::ofstream out(mine / "m.safetensors", std::ios::binary);
    const auto bytes = checkpoint_image(other);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
  }
  const fs::path home = fs::current_path();
  fs::current_path(mine);
  const std::string message = kshard::test::collective_error(
      [&] { static_cast<void>(io::Checkpoint(line, "m.safetensors")); });
  fs::current_path(home);
  if (kshard::test::world_size() > 1) {
    EXPECT_NE(message.find("the size of 'm.safetensors' differs between ranks"), std::string::npos)
        << message;
  } else {
    EXPECT_EQ(message, "");
  }
}

}  // namespace
