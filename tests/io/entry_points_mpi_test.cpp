// Generated, not listed: the table of kshard::io's collective entry points, each argument a
// rank-dependent `if` can change (paths, tensor names, element types, matrices by the shared
// generator, row ids) changed on the last rank only, at every rank count of the io suite: the
// same kshard::error on every rank, no file byte changed, no output created, the next
// collective working (tests/support/entry_points.hpp). IoEntryPoints.TableCoversTheHeaders
// compares the rows with the operations the io headers name. Paths that coincide with the
// files an operation makes are tests/io/path_clash_mpi_test.cpp.

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "entry_points.hpp"
#include "kshard/io/checkpoint.hpp"
#include "kshard/io/convert.hpp"
#include "kshard/io/read_checkpoint.hpp"
#include "kshard/io/rewrite.hpp"
#include "kshard/io/row_patch.hpp"
#include "kshard/io/safetensors.hpp"
#include "kshard/io/verify.hpp"
#include "kshard_test.hpp"
#include "safetensors_mpi_support.hpp"

namespace {

using namespace kshard::test;  // the generator's vocabulary (entry_points.hpp)
using namespace kshard_io_mpi_test;
using kshard::Layout;
using kshard::Replicate;
using kshard::Shard;

// The files every row works on: a checkpoint with a 6 x 4 float "weight", a copy of it under
// another name, and where each row's outputs go. Built before the table runs, removed after.
struct Files {
  const Scratch& scratch;
  fs::path checkpoint = scratch / "m.safetensors";
  fs::path copy = scratch / "copy.safetensors";
  fs::path output = scratch / "out.safetensors";
  fs::path undo = scratch / "m.undo";
};

// Every file of the scratch folder (folder_digest): a refusal must leave every byte as it was
// and make no file.
Watched files_unchanged(const Files& files) {
  return [folder = files.checkpoint.parent_path()] {
    return static_cast<std::uint64_t>(folder_digest(folder));
  };
}

// The weight's matrix argument: any layout over the usual mesh, the tensor's shape.
auto weight_argument() {
  auto arg = plain_matrix("the matrix");
  arg.rows = 6;
  arg.cols = 4;
  return arg;
}

// Cases whose argument is not one of `skipped` (changes an entry point cannot be given).
std::vector<Case> without(std::vector<Case> cases, const std::vector<std::string>& skipped) {
  std::erase_if(cases, [&](const Case& c) {
    return std::find(skipped.begin(), skipped.end(), c.argument) != skipped.end();
  });
  return cases;
}

// `c`, whose error may also name the rank's own finding `phrase` (which goes first).
Case or_finding(Case c, std::string phrase) {
  c.phrases.push_back(std::move(phrase));
  return c;
}

std::vector<Case> open_cases(const Files& files) {
  const Watched unchanged = files_unchanged(files);
  return {value_case("path", "the file path differs",
                     [=](bool here) {
                       (void)io::SafetensorsFile(meshes().usual,
                                                 here ? files.copy : files.checkpoint);
                     },
                     {unchanged})};
}

std::vector<Case> checkpoint_cases(const Files& files) {
  return {value_case("path", "the checkpoint path differs",
                     [=](bool here) {
                       (void)io::Checkpoint(meshes().usual, here ? files.copy : files.checkpoint);
                     },
                     {files_unchanged(files)})};
}

// read_matrix builds the matrix: every change of it but its shape (the file's) and the name.
std::vector<Case> read_matrix_cases(const Files& files) {
  const auto read = [path = files.checkpoint](auto type, const Mesh2& mesh, const auto& layout,
                                              index_t, index_t) {
    const io::SafetensorsFile file(mesh, path);
    using T = typename decltype(type)::type;
    return io::read_matrix<T, ExecSpace, MemSpace>(file, "weight", mesh, layout);
  };
  auto cases = without(building_cases<float, double>(weight_argument(), read),
                       {"the matrix: rows", "the matrix: columns"});
  for (Case& c : cases) {
    c.phrases.push_back("is F32, but the matrix holds double");  // a rank's own finding
    c.watched.push_back(files_unchanged(files));
  }
  cases.push_back(value_case("name", "the tensor name differs",
                             [path = files.checkpoint](bool here) {
                               const io::SafetensorsFile file(meshes().usual, path);
                               (void)io::read_matrix<float, ExecSpace, MemSpace>(
                                   file, here ? "twin" : "weight", meshes().usual,
                                   Layout(Replicate{}, Shard<0>{}));
                             },
                             {files_unchanged(files)}));
  return cases;
}

std::vector<Case> read_into_cases(const Files& files) {
  const io::SafetensorsFile file(meshes().usual, files.checkpoint);
  auto cases = matrix_cases<float, double>(
      weight_argument(), [file](const auto& m) { io::read_into(file, "weight", m); },
      {"but the matrix holds", "has shape"});
  const auto m = Distribute{}(Type<float>{}, meshes().usual, Layout(Replicate{}, Shard<0>{}), 6, 4);
  cases.push_back(or_finding(
      value_case("name", "the tensor name differs",
                 [file, m](bool here) { io::read_into(file, here ? "twin" : "weight", m); },
                 {watch_copy(m)}),
      "has shape [2, 2], but the matrix is 6 x 4"));
  return cases;
}

// A write of `updates(matrix)`-style arguments: the matrix changed by the generator, then the
// paths and names of the row itself.
template <class Write>
std::vector<Case> update_cases(const Files& files, Write write) {
  auto cases = matrix_cases<float, double>(
      weight_argument(), write,
      {"but the matrix replacing it is", "of 'weight' on mesh dimension",
       "the mesh of 'weight' differs"});
  for (Case& c : cases) c.watched.push_back(files_unchanged(files));
  return cases;
}

// A write of a new file or checkpoint, `write(mesh, output, updates)`: its matrix changed by
// the generator, then the output path (`output_phrase` names it) and the tensor name.
template <class Write>
std::vector<Case> new_file_cases(const Files& files, const std::string& output_phrase,
                                 Write write) {
  const auto weight =
      Distribute{}(Type<float>{}, meshes().usual, Layout(Replicate{}, Shard<0>{}), 6, 4);
  const Watched unchanged = files_unchanged(files);
  return joined(
      update_cases(files,
                   [write, output = files.output](const auto& m) {
                     write(m.mesh(), output, {io::replace("weight", m)});
                   }),
      std::vector{value_case("output path", output_phrase,
                             [=](bool here) {
                               write(meshes().usual, here ? files.copy : files.output,
                                     {io::replace("weight", weight)});
                             },
                             {unchanged}),
                  or_finding(value_case("tensor name", "the name of a tensor to replace differs",
                                        [=](bool here) {
                                          write(meshes().usual, files.output,
                                                {io::replace(here ? "twin" : "weight", weight)});
                                        },
                                        {unchanged}),
                             "is F32 [2, 2], but the matrix replacing it is")});
}

std::vector<Case> write_cases(const Files& files) {
  const io::SafetensorsFile source(meshes().usual, files.checkpoint);
  return new_file_cases(files, "the output file differs",
                        [source](const Mesh2& mesh, const fs::path& output,
                                 const std::vector<io::TensorUpdate>& updates) {
                          io::write_safetensors(mesh, source, output, updates);
                        });
}

// write_checkpoint writes a whole checkpoint, here the single file.
std::vector<Case> write_checkpoint_cases(const Files& files) {
  const io::Checkpoint model(meshes().usual, files.checkpoint);
  return new_file_cases(files, "the output path differs",
                        [model](const Mesh2& mesh, const fs::path& output,
                                const std::vector<io::TensorUpdate>& updates) {
                          io::write_checkpoint(mesh, model, output, updates);
                        });
}

std::vector<Case> in_place_cases(const Files& files) {
  const io::SafetensorsFile file(meshes().usual, files.checkpoint);
  const auto weight =
      Distribute{}(Type<float>{}, meshes().usual, Layout(Replicate{}, Shard<0>{}), 6, 4);
  const Watched unchanged = files_unchanged(files);
  return joined(update_cases(files,
                             [file, undo = files.undo](const auto& m) {
                               io::write_rows_in_place(m.mesh(), file,
                                                       {io::replace_rows("weight", m, {1})}, undo);
                             }),
                std::vector{value_case("undo path", "the undo file differs",
                                       [=](bool here) {
                                         io::write_rows_in_place(
                                             meshes().usual, file,
                                             {io::replace_rows("weight", weight, {1})},
                                             here ? files.output : files.undo);
                                       },
                                       {unchanged}),
                            value_case("rows", "the rows of 'weight' to replace differs",
                                       [=](bool here) {
                                         io::write_rows_in_place(
                                             meshes().usual, file,
                                             {io::replace_rows("weight", weight, {here ? 2 : 1})},
                                             files.undo);
                                       },
                                       {unchanged})});
}

// An undo file made for the checkpoint's copy (left in place, then undone at the end), and the
// undo changed on one rank to another existing file.
std::vector<Case> undo_cases(const Files& files) {
  const io::SafetensorsFile copy(meshes().usual, files.copy);
  const fs::path undo = files.copy.string() + ".undo";
  const auto weight =
      Distribute{}(Type<float>{}, meshes().usual, Layout(Replicate{}, Shard<0>{}), 6, 4);
  io::write_rows_in_place(meshes().usual, copy, {io::replace_rows("weight", weight, {1})}, undo);
  return {value_case(
      "undo path", "the file path differs",
      [=](bool here) { io::undo_in_place(meshes().usual, here ? files.checkpoint : undo); },
      {files_unchanged(files)})};
}

// The checkpoint an undo or a hash is of, another one on one rank.
template <class Call>
std::vector<Case> checkpoint_argument_cases(const Files& files, Call call) {
  const io::Checkpoint model(meshes().usual, files.checkpoint);
  const io::Checkpoint copy(meshes().usual, files.copy);
  return {value_case("checkpoint", "the checkpoint path differs",
                     [=](bool here) { call(here ? copy : model); }, {files_unchanged(files)})};
}

std::vector<Case> undo_checkpoint_cases(const Files& files) {
  return checkpoint_argument_cases(
      files, [](const io::Checkpoint& c) { (void)io::undo_checkpoint(meshes().usual, c); });
}

std::vector<Case> verify_checksums_cases(const Files& files) {
  return checkpoint_argument_cases(
      files, [](const io::Checkpoint& c) { (void)io::verify_checksums(meshes().usual, c); });
}

std::vector<Case> tensor_hashes_cases(const Files& files) {
  return checkpoint_argument_cases(
      files, [](const io::Checkpoint& c) { (void)io::tensor_hashes(meshes().usual, c); });
}

// A conversion: the output folder (two new names), the checkpoint and the options, each
// differing on one rank.
std::vector<Case> convert_cases(const Files& files) {
  const io::Checkpoint model(meshes().usual, files.checkpoint);
  const io::Checkpoint copy(meshes().usual, files.copy);
  const fs::path out = files.output.parent_path() / "converted";
  const Watched unchanged = files_unchanged(files);
  const auto convert = [](const io::Checkpoint& m, const fs::path& to, std::uint64_t max) {
    io::ConvertOptions options;
    options.max_shard_bytes = max;
    (void)io::convert_checkpoint(meshes().usual, m, to, options);
  };
  return {value_case(
              "output folder", "the output folder differs",
              [=](bool here) { convert(model, here ? fs::path(out.string() + "2") : out, 1000); },
              {unchanged}),
          value_case("checkpoint", "the checkpoint path differs",
                     [=](bool here) { convert(here ? copy : model, out, 1000); }, {unchanged}),
          value_case("options", "the options differ",
                     [=](bool here) { convert(model, out, here ? 7 : 1000); }, {unchanged})};
}

// The rows of a patch: the matrix changed by the generator, the tensor name, the rows.
std::vector<Case> patch_rows_cases(const Files&) {
  auto cases = matrix_cases<float, double>(
      weight_argument(), [](const auto& m) { (void)io::patch_rows("weight", m, {1}); }, {});
  const auto m = Distribute{}(Type<float>{}, meshes().usual, Layout(Replicate{}, Shard<0>{}), 6, 4);
  cases.push_back(value_case(
      "name", "the tensor name differs",
      [m](bool here) { (void)io::patch_rows(here ? "twin" : "weight", m, {1}); }, {watch_copy(m)}));
  cases.push_back(value_case("rows", "the rows of 'weight' to patch differs",
                             [m](bool here) { (void)io::patch_rows("weight", m, {here ? 2 : 1}); },
                             {watch_copy(m)}));
  return cases;
}

// A patch written in place: the checkpoint and the patch's rows, each differing on one rank.
std::vector<Case> patch_in_place_cases(const Files& files) {
  const io::Checkpoint model(meshes().usual, files.checkpoint);
  const io::Checkpoint copy(meshes().usual, files.copy);
  const auto m = Distribute{}(Type<float>{}, meshes().usual, Layout(Replicate{}, Shard<0>{}), 6, 4);
  const io::RowPatch one = io::patch_rows("weight", m, {1});
  const io::RowPatch two = io::patch_rows("weight", m, {2});
  const Watched unchanged = files_unchanged(files);
  return {value_case("checkpoint", "the checkpoint path differs",
                     [=](bool here) {
                       (void)io::write_patch_in_place(meshes().usual, here ? copy : model, one);
                     },
                     {unchanged}),
          value_case("rows", "the rows of 'weight' to patch differs",
                     [=](bool here) {
                       (void)io::write_patch_in_place(meshes().usual, model, here ? two : one);
                     },
                     {unchanged})};
}

// A tensor read from a checkpoint opened on another path on one rank.
std::vector<Case> read_checkpoint_cases(const Files& files) {
  const io::Checkpoint model(meshes().usual, files.checkpoint);
  const io::Checkpoint copy(meshes().usual, files.copy);
  return {value_case("checkpoint", "the checkpoint path differs",
                     [=](bool here) {
                       (void)io::read_matrix<float, ExecSpace, MemSpace>(
                           here ? copy : model, "weight", meshes().usual,
                           Layout(Replicate{}, Shard<0>{}));
                     },
                     {files_unchanged(files)})};
}

// Rows read from a checkpoint: the matrix changed by the generator, then the checkpoint, the
// name and the rows, each differing on one rank.
std::vector<Case> read_rows_cases(const Files& files) {
  const io::Checkpoint model(meshes().usual, files.checkpoint);
  const io::Checkpoint copy(meshes().usual, files.copy);
  auto cases = matrix_cases<float, double>(
      weight_argument(), [model](const auto& m) { io::read_rows_into(model, "weight", m, {1}); },
      {"but the matrix holds", "has shape"});
  const auto m = Distribute{}(Type<float>{}, meshes().usual, Layout(Replicate{}, Shard<0>{}), 6, 4);
  cases.push_back(
      value_case("checkpoint", "the checkpoint path differs",
                 [=](bool here) { io::read_rows_into(here ? copy : model, "weight", m, {1}); },
                 {watch_copy(m)}));
  cases.push_back(or_finding(
      value_case("name", "the tensor name differs",
                 [=](bool here) { io::read_rows_into(model, here ? "twin" : "weight", m, {1}); },
                 {watch_copy(m)}),
      "has shape [2, 2], but the matrix is 6 x 4"));
  cases.push_back(value_case(
      "rows", "the rows of 'weight' to read differs",
      [=](bool here) { io::read_rows_into(model, "weight", m, {here ? 2 : 1}); }, {watch_copy(m)}));
  return cases;
}

std::vector<EntryPoint> entry_points(const Files& files) {
  const auto with = [&files](auto cases) { return [&files, cases] { return cases(files); }; };
  return {{"io::SafetensorsFile", Kind::agreed, with(open_cases)},
          {"io::Checkpoint", Kind::agreed, with(checkpoint_cases)},
          {"io::read_matrix", Kind::agreed, with(read_matrix_cases)},
          {"io::read_matrix", Kind::agreed, with(read_checkpoint_cases)},
          {"io::read_into", Kind::agreed, with(read_into_cases)},
          {"io::read_rows_into", Kind::agreed, with(read_rows_cases)},
          {"io::write_safetensors", Kind::agreed, with(write_cases)},
          {"io::write_rows_in_place", Kind::agreed, with(in_place_cases)},
          {"io::undo_in_place", Kind::agreed, with(undo_cases)},
          {"io::write_checkpoint", Kind::agreed, with(write_checkpoint_cases)},
          {"io::undo_checkpoint", Kind::agreed, with(undo_checkpoint_cases)},
          {"io::tensor_hashes", Kind::agreed, with(tensor_hashes_cases)},
          {"io::verify_checksums", Kind::agreed, with(verify_checksums_cases)},
          {"io::convert_checkpoint", Kind::agreed, with(convert_cases)},
          {"io::patch_rows", Kind::agreed, with(patch_rows_cases)},
          {"io::write_patch_in_place", Kind::agreed, with(patch_in_place_cases)}};
}

TEST(IoEntryPoints, TableCoversTheHeaders) {
  const Scratch scratch;
  expect_rows_for_every_operation(entry_points(Files{scratch}), KSHARD_INCLUDE_DIR "/kshard/io");
}

TEST(IoEntryPoints, EveryArgumentDifferingOnOneRank) {
  const Scratch scratch;
  const Files files{scratch};
  const auto image = checkpoint_image(reference_matrix<float>(6, 4, 9));
  write_file(files.checkpoint, image);
  write_file(files.copy, image);
  for (const EntryPoint& entry : entry_points(files)) run(entry);
}

}  // namespace
