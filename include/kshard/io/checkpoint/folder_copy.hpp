#pragma once

// The internals of io/rewrite.hpp and io/convert.hpp: rank 0's copy of a checkpoint folder but its
// weights (and its removal after a failed write), the check that an undo file beside a weights
// file was made for it, and one tensor's bytes hashed.

#include <fcntl.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "kshard/detail/digest.hpp"
#include "kshard/io/checkpoint.hpp"
#include "kshard/io/engine/byte_mover.hpp"
#include "kshard/io/engine/paths.hpp"
#include "kshard/io/engine/posix.hpp"
#include "kshard/io/safetensors/file.hpp"
#include "kshard/io/safetensors/undo.hpp"

namespace kshard::detail {

// True for what a copy of `model`'s folder leaves out: the weights (the write makes them) and
// kshard's undo and temporary files.
inline bool left_out_of_copy(const io::Checkpoint& model, const std::filesystem::path& name) {
  for (const auto& file : model.files())
    if (file.path().filename() == name) return true;
  return name.string().find(".kshard-") != std::string::npos;
}

// Copies one entry of a checkpoint folder into `out`: a file, or a folder with everything in it
// (sentence-transformers keep 1_Pooling/ and the like next to the weights). Symbolic links are
// followed (a Hugging Face snapshot links to its blobs); other kinds are skipped.
inline void copy_entry(const std::filesystem::directory_entry& entry,
                       const std::filesystem::path& out, std::error_code& failed) {
  namespace fs = std::filesystem;
  const fs::file_status status = entry.status(failed);  // a link loop is an error, not a throw
  if (failed) return;
  const fs::path target = out / entry.path().filename();
  if (fs::is_directory(status))
    fs::copy(entry.path(), target,
             fs::copy_options::recursive | fs::copy_options::overwrite_existing, failed);
  else if (fs::is_regular_file(status))
    fs::copy_file(entry.path(), target, fs::copy_options::overwrite_existing, failed);
}

// Rank 0, best effort: removes what a failed write made (the error that brought it here is the
// one reported).
inline void remove_quietly(const std::vector<std::filesystem::path>& paths) {
  std::error_code ignored;
  for (const auto& path : paths) std::filesystem::remove_all(path, ignored);
}

// What rank 0's copy of a checkpoint folder made (for remove_quietly should the write fail
// later: the output folder, or the entries new to one that existed), or why it failed (what it
// made is removed then).
struct FolderCopy {
  std::vector<std::filesystem::path> made;
  std::optional<std::string> problem;
};

// Rank 0: makes `out` and copies `model`'s folder into it but the weights and kshard's files
// (config, tokenizer, index, subfolders; never `out` itself, when it lies inside). The file
// system reports through error codes: a throw on rank 0 alone would leave the others waiting.
inline FolderCopy copy_folder_but_weights(const io::Checkpoint& model,
                                          const std::filesystem::path& out) {
  namespace fs = std::filesystem;
  FolderCopy copy;
  std::error_code failed;
  fs::path where;  // the entry that failed, for the message
  const bool existed = fs::exists(out, failed);
  if (!existed && !failed && fs::create_directories(out, failed)) copy.made.push_back(out);
  for (fs::directory_iterator it(model.path(), failed), end; !failed && it != end;
       it.increment(failed)) {
    std::error_code differs;
    if (left_out_of_copy(model, it->path().filename()) || fs::equivalent(it->path(), out, differs))
      continue;
    std::error_code absent;
    if (existed && !fs::exists(out / it->path().filename(), absent))
      copy.made.push_back(out / it->path().filename());  // not what the folder had
    copy_entry(*it, out, failed);
    if (failed) {  // before increment(), which would clear it
      where = it->path();
      break;
    }
  }
  if (!failed) return copy;
  remove_quietly(copy.made);
  copy.problem = fmt::format(
      "kshard::io: cannot prepare the output folder '{}'{}: {}", out.string(),
      where.empty() ? std::string() : " (copying '" + where.string() + "')", failed.message());
  return copy;
}

// Rank 0: why the undo file `undo` (open on every rank) is not the one of the weights file
// `weights` beside it, or nothing. It records its checkpoint's absolute path: in a copied
// checkpoint it still names the original, which must not be restored. A file without that
// record is not kshard's: undo_in_place says so.
inline std::optional<std::string> undo_target_problem(const io::SafetensorsFile& undo,
                                                      const std::filesystem::path& weights) {
  const auto& metadata = undo.header().metadata;
  const auto target = metadata.find(std::string(undo_target));
  std::error_code ignored;  // a target that is gone is not this file either
  if (target == metadata.end() || std::filesystem::equivalent(target->second, weights, ignored))
    return std::nullopt;
  return fmt::format(
      "kshard::io: the undo file '{}' was made for '{}', not for '{}' next to it (a copied "
      "checkpoint?); nothing restored",
      undo.path().string(), target->second, weights.string());
}

// FNV-1a 64 of the bytes of tensor `entry` of `file`, read in pieces of `buffer`'s size.
inline std::uint64_t tensor_hash(const io::SafetensorsFile& file, const io::TensorEntry& entry,
                                 std::vector<char>& buffer) {
  const ScopedFd fd(open_or_throw(file.path(), O_RDONLY));
  Fnv1a64 hash;
  std::uint64_t at = file.file_offset(entry);
  for (std::uint64_t left = entry.bytes(); left > 0;) {
    const std::uint64_t n = std::min<std::uint64_t>(left, buffer.size());
    throw_if(pread_exactly(fd.get(), buffer.data(), n, at, file.path().string()));
    hash.add_bytes(buffer.data(), n);
    at += n;
    left -= n;
  }
  return hash.value();
}

// FNV-1a 64 of the bytes of `tensor` of `model` in row-major order: its file's slice for a
// tensor stored whole, else its pieces' runs gathered a buffer at a time.
inline std::uint64_t stored_tensor_hash(const io::Checkpoint& model, const io::StoredTensor& tensor,
                                        std::vector<char>& buffer) {
  if (tensor.pieces.size() == 1 && model.form() != io::CheckpointForm::dcp) {
    const io::SafetensorsFile& file = model.files()[tensor.pieces[0].file];
    return tensor_hash(file, *file.header().find(tensor.name), buffer);
  }
  const OutputTensor whole{&tensor, std::vector<std::int64_t>(tensor.shape.size(), 0),
                           tensor.shape};
  const std::uint64_t element_bytes = dtype_info(tensor.dtype).size;
  const auto step = static_cast<std::int64_t>(buffer.size() / element_bytes);
  const std::int64_t elements = element_count(tensor.name, tensor.shape);
  Fnv1a64 hash;
  for (std::int64_t a = 0; a < elements; a += step) {
    const std::int64_t b = std::min(elements, a + step);
    for (const auto& [source, runs] : fill_runs(whole, a, b, nullptr)) {
      const io::DataFile& file = model.data_files()[source];
      const ScopedFd fd(open_or_throw(file.path, O_RDONLY | O_CLOEXEC));
      for (const ByteRun& run : runs)
        throw_if(pread_exactly(fd.get(), buffer.data() + run.to, run.bytes, run.from,
                               file.path.string()));
    }
    hash.add_bytes(buffer.data(), static_cast<std::size_t>(b - a) * element_bytes);
  }
  return hash.value();
}

}  // namespace kshard::detail
