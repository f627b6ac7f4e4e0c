#pragma once

// A PyTorch Distributed Checkpoint folder (`.metadata` and `__<rank>_<k>.distcp` files) as the
// pieces of stored tensors. Rank 0 reads `.metadata` through the restricted unpickler and, for
// each tensor piece, the end of its torch.save archive (the ZIP directory), the local headers of
// `data.pkl` and of the storage, and `data.pkl` itself: a few small reads per piece, never the
// tensor's bytes. It checks what the files claim against each other (dtype and shape in
// `.metadata` and `data.pkl`, items inside their files, storages inside their entries, the
// pieces an exact tiling) and broadcasts the table as JSON with the log of every byte it read;
// every other rank reads those bytes of its own copy (io/engine/same_copies.hpp), so every rank
// then holds the same pieces of the same files, or throws the same error.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kshard/comm/agreement.hpp"
#include "kshard/comm/group.hpp"
#include "kshard/io/engine/box_runs.hpp"
#include "kshard/io/engine/collective.hpp"
#include "kshard/io/engine/posix.hpp"
#include "kshard/io/engine/same_copies.hpp"
#include "kshard/io/engine/tiling.hpp"
#include "kshard/io/formats/dcp/metadata.hpp"
#include "kshard/io/model/stored_tensor.hpp"
#include "kshard/io/torch/data_pickle.hpp"
#include "kshard/io/torch/zip.hpp"

namespace kshard::detail {

// The name torch gives a checkpoint's metadata (filesystem.py: `.metadata`).
inline constexpr std::string_view dcp_metadata_name = ".metadata";
// The most bytes `.metadata` and a `data.pkl` may have: torch writes ~100 bytes per chunk and
// ~200 per data.pkl.
inline constexpr std::uint64_t dcp_max_metadata_bytes = std::uint64_t{1} << 30;
inline constexpr std::uint64_t dcp_max_data_pickle_bytes = std::uint64_t{1} << 20;

// What a DCP folder holds: its data files (in first use), its tensors, and the names of its
// non-tensor items (bytes items: steps, learning rates, ...).
struct DcpContents {
  io::StoredContents stored;                          // data files (in first use), tensors, ...
  std::vector<FileReads> reads;                       // every byte rank 0 read, file by file
  std::vector<std::filesystem::path> metadata_files;  // .metadata, or each rank's
};

// Rank 0's reader of the data files: each one's size taken when first named, and only the file
// being read kept open (a DCP saved with single_file_per_rank=False has a file per item, more
// than a process may hold open; a file's pieces are read one after the other). Each read is
// logged in `log`, for the other ranks to compare their copies with.
class DcpFileReader {
 public:
  DcpFileReader(std::filesystem::path folder, ReadLog& log)
      : folder_(std::move(folder)), log_(log) {}

  // The index of the data file at `relative` (opened, and its size taken, on first use).
  std::size_t index_of(const std::string& relative) {
    const auto [it, added] = index_.emplace(relative, files_.size());
    if (added) {
      files_.push_back({folder_ / relative, 0});
      files_.back().size = open_file_size(fd_of(files_.size() - 1), files_.back().path);
    }
    return it->second;
  }
  // `size` bytes from byte `at` of file `file`.
  std::vector<std::byte> read(std::size_t file, std::uint64_t at, std::uint64_t size) {
    std::vector<std::byte> bytes(static_cast<std::size_t>(size));
    throw_if(pread_exactly(fd_of(file), bytes.data(), size, at, files_[file].path.string()));
    log_.add(log_.file(files_[file].path, files_[file].size), at, bytes);
    return bytes;
  }
  [[nodiscard]] const std::vector<DataFile>& files() const { return files_; }

 private:
  int fd_of(std::size_t file) {
    if (!open_ || open_file_ != file) {
      open_.reset();
      open_.emplace(open_or_throw(files_[file].path, O_RDONLY | O_CLOEXEC));
      open_file_ = file;
    }
    return open_->get();
  }
  std::filesystem::path folder_;
  ReadLog& log_;
  std::map<std::string, std::size_t> index_;
  std::vector<DataFile> files_;
  std::optional<ScopedFd> open_;  // the file being read
  std::size_t open_file_ = 0;
};

// One item (a torch.save archive) of a data file: where it lies, for reads and messages.
struct DcpItem {
  std::size_t file = 0;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  std::string name;  // "the item of tensor 'w' at bytes a..b of 'file'"
};

// The item `storage` of tensor `fqn` names, checked to lie inside its file.
inline DcpItem dcp_item(DcpFileReader& reader, const DcpStorage& storage, std::string_view fqn) {
  const std::size_t file = reader.index_of(storage.relative_path);
  const DataFile& data = reader.files()[file];
  std::string name =
      fmt::format("the item of {} at bytes {}..{} of '{}'", in_quotes(fqn), storage.offset,
                  storage.offset + storage.length, data.path.string());
  if (storage.offset > data.size || storage.length > data.size - storage.offset)
    throw_io_error(name, " lies past the end of the file (", data.size, " bytes)");
  return {file, storage.offset, storage.length, std::move(name)};
}

// The ZIP directory of `item`'s archive: its tail, and the directory when it lies before.
inline ZipListing read_item_listing(DcpFileReader& reader, const DcpItem& item) {
  const std::uint64_t tail_size = zip_tail_bytes(item.length);
  const std::vector<std::byte> tail =
      reader.read(item.file, item.offset + item.length - tail_size, tail_size);
  const ZipDirectory directory = find_zip_directory(tail, item.length, item.name);
  if (const auto in_tail = zip_directory_in_tail(tail, item.length, directory))
    return parse_zip_directory(*in_tail, directory, item.name);
  const auto bytes = reader.read(item.file, item.offset + directory.offset, directory.size);
  return parse_zip_directory(bytes, directory, item.name);
}

// Entry `record` of `item`'s archive, with its data offset read from its local header.
inline ZipEntry read_item_entry(DcpFileReader& reader, const DcpItem& item,
                                const ZipListing& listing, std::string_view record) {
  ZipEntry entry = zip_entry(listing, record, item.name);
  const auto local =
      reader.read(item.file, item.offset + entry.header_offset, zip_local_header_bytes(entry));
  entry.data_offset = zip_data_offset(entry, local, item.name);
  return entry;
}

// The `data.pkl` of `item`, parsed.
inline TorchTensorRecord read_tensor_record(DcpFileReader& reader, const DcpItem& item,
                                            const ZipListing& listing) {
  const ZipEntry pickle = read_item_entry(reader, item, listing, "data.pkl");
  if (pickle.size > dcp_max_data_pickle_bytes)
    throw_io_error("the data.pkl of ", item.name, " has ", pickle.size, " bytes, more than the ",
                   dcp_max_data_pickle_bytes, " a tensor's may have");
  const auto bytes = reader.read(item.file, item.offset + pickle.data_offset, pickle.size);
  return parse_torch_tensor_pickle(bytes, fmt::format("the data.pkl of {}", item.name));
}

// Refuses a `data.pkl` that says another dtype or shape than `.metadata` gives its chunk.
inline void check_record(const TorchTensorRecord& record, const DcpTensorEntry& tensor,
                         const DcpChunk& chunk, const DcpItem& item) {
  if (record.dtype != tensor.dtype)
    throw_io_error(item.name, " holds ", io::to_string(record.dtype), " elements; .metadata says ",
                   io::to_string(tensor.dtype));
  if (record.size != chunk.sizes)
    throw_io_error(item.name, " holds a tensor of shape ", io::shape_text(record.size),
                   "; .metadata gives its chunk the shape ", io::shape_text(chunk.sizes));
}

// The piece `chunk` of `tensor` makes: its storage's bytes in its data file, with strides
// where it is not row-major; the storage entry's CRC-32 is added to `checksums`.
inline io::StoredPiece dcp_piece(DcpFileReader& reader, const DcpTensorEntry& tensor,
                                 const DcpChunk& chunk,
                                 std::vector<io::StoredChecksum>& checksums) {
  const DcpItem item = dcp_item(reader, chunk.storage, tensor.fqn);
  const ZipListing listing = read_item_listing(reader, item);
  const TorchTensorRecord record = read_tensor_record(reader, item, listing);
  check_record(record, tensor, chunk, item);
  const ZipEntry storage = read_item_entry(reader, item, listing, "data/" + record.storage_key);
  if (record.storage_bytes > storage.size)
    throw_io_error(item.name, " gives its storage ", record.storage_bytes,
                   " bytes, but the archive holds ", storage.size);
  const std::uint64_t element_bytes = io::dtype_size(record.dtype);
  io::StoredPiece piece{item.file,
                        chunk.offsets,
                        chunk.sizes,
                        item.offset + storage.data_offset +
                            static_cast<std::uint64_t>(record.storage_offset) * element_bytes,
                        {}};
  if (record.stride != row_major_strides(record.size)) piece.strides = record.stride;
  checksums.push_back({item.file, item.offset + storage.data_offset, storage.size, storage.crc32,
                       fmt::format("the storage of {}", item.name)});
  return piece;
}

// Refuses pieces of `tensor` outside its shape, then sorts them and refuses overlaps and gaps.
inline void tile_dcp_tensor(io::StoredTensor& tensor, std::span<const std::string> files) {
  for (const io::StoredPiece& piece : tensor.pieces)
    for (std::size_t d = 0; d < piece.shape.size(); ++d)
      if (piece.offsets[d] > tensor.shape[d] - piece.shape[d])
        throw_io_error(".metadata places a chunk ", box_text(piece), " of tensor ",
                       in_quotes(tensor.name), " outside its shape ", io::shape_text(tensor.shape));
  tile_tensor(tensor, files);
}

// The metadata files of a DCP folder: `.metadata`, or else the `__<rank>.metadata` each rank
// writes under dcp.save(..., use_collectives=False), each naming that rank's items only. Empty
// for a folder of neither (rank 0 alone looks: it must not throw).
inline std::vector<std::filesystem::path> dcp_metadata_paths(const std::filesystem::path& folder) {
  std::error_code ec;  // a .metadata of another kind is refused when it is opened
  if (std::filesystem::exists(folder / dcp_metadata_name, ec)) return {folder / dcp_metadata_name};
  std::vector<std::filesystem::path> found;
  for (const auto& entry : std::filesystem::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() <= 11 || !name.starts_with("__") || !name.ends_with(".metadata")) continue;
    const auto rank = std::string_view(name).substr(2, name.size() - 11);
    if (std::all_of(rank.begin(), rank.end(), [](char c) { return c >= '0' && c <= '9'; }))
      found.push_back(entry.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

// The metadata file `path`, parsed (at most dcp_max_metadata_bytes), its read logged in `log`.
inline DcpMetadata read_dcp_metadata(const std::filesystem::path& path, ReadLog& log) {
  const ScopedFd fd(open_or_throw(path, O_RDONLY | O_CLOEXEC));
  const std::uint64_t size = open_file_size(fd.get(), path);
  if (size > dcp_max_metadata_bytes)
    throw_io_error("'", path.string(), "' has ", size, " bytes; a .metadata may have at most ",
                   dcp_max_metadata_bytes);
  std::vector<std::byte> bytes(static_cast<std::size_t>(size));
  throw_if(pread_exactly(fd.get(), bytes.data(), size, 0, path.string()));
  log.add(log.file(path, size), 0, bytes);
  return parse_dcp_metadata(bytes, path.string());
}

// Adds the tensors and bytes items of `part` (one rank's metadata) to `all`: a tensor both name
// must have the same dtype and size; a chunk both hold (a replicated tensor every rank saved) is
// kept once.
inline void merge_dcp_metadata(DcpMetadata& all, const DcpMetadata& part,
                               const std::filesystem::path& path) {
  for (const DcpTensorEntry& entry : part.tensors) {
    const auto same = std::find_if(all.tensors.begin(), all.tensors.end(),
                                   [&](const DcpTensorEntry& t) { return t.fqn == entry.fqn; });
    if (same == all.tensors.end()) {
      all.tensors.push_back(entry);
      continue;
    }
    if (same->dtype != entry.dtype || same->size != entry.size)
      throw_io_error("'", path.string(), "' gives tensor ", in_quotes(entry.fqn), " dtype ",
                     io::to_string(entry.dtype), " and size ", io::shape_text(entry.size),
                     "; another rank's metadata gives ", io::to_string(same->dtype), " and ",
                     io::shape_text(same->size));
    for (const DcpChunk& chunk : entry.chunks)
      if (std::none_of(same->chunks.begin(), same->chunks.end(), [&](const DcpChunk& c) {
            return c.offsets == chunk.offsets && c.sizes == chunk.sizes;
          }))
        same->chunks.push_back(chunk);
  }
  all.bytes_items.insert(all.bytes_items.end(), part.bytes_items.begin(), part.bytes_items.end());
}

// Rank 0: the metadata of `folder` (merged from every rank's file in the per-rank form) and
// what its pieces are, checked.
inline DcpContents dcp_contents(const std::filesystem::path& folder) {
  DcpMetadata metadata;
  ReadLog log;
  DcpContents contents;
  contents.metadata_files = dcp_metadata_paths(folder);
  for (const std::filesystem::path& path : contents.metadata_files)
    merge_dcp_metadata(metadata, read_dcp_metadata(path, log), path);
  DcpFileReader reader(folder, log);
  for (const DcpTensorEntry& entry : metadata.tensors) {
    io::StoredTensor tensor{entry.fqn, entry.dtype, entry.size, {}};
    for (const DcpChunk& chunk : entry.chunks)
      tensor.pieces.push_back(dcp_piece(reader, entry, chunk, contents.stored.checksums));
    contents.stored.tensors.emplace(entry.fqn, std::move(tensor));
  }
  for (const DcpBytesEntry& entry : metadata.bytes_items)
    if (std::none_of(contents.stored.other_items.begin(), contents.stored.other_items.end(),
                     [&](const io::StoredItem& known) { return known.name == entry.fqn; })) {
      const DcpItem item = dcp_item(reader, entry.storage, entry.fqn);  // each rank's may list it
      contents.stored.other_items.push_back({entry.fqn, item.file, item.offset, item.length});
    }
  contents.stored.data_files = reader.files();
  std::vector<std::string> paths;
  for (const DataFile& file : contents.stored.data_files) paths.push_back(file.path.string());
  for (auto& [name, tensor] : contents.stored.tensors) tile_dcp_tensor(tensor, paths);
  for (const DataFile& file : contents.stored.data_files)
    log.file(file.path, file.size);  // sizes too
  contents.reads = log.files();
  return contents;
}

// `contents` as JSON, to broadcast: [[path, size], ...], [name, dtype, shape, pieces], the
// other items, the checksums, the log of rank 0's reads and the metadata files.
inline std::string dcp_contents_text(const DcpContents& contents) {
  nlohmann::json files = nlohmann::json::array(), tensors = nlohmann::json::array();
  for (const DataFile& file : contents.stored.data_files)
    files.push_back({file.path.string(), file.size});
  for (const auto& [name, tensor] : contents.stored.tensors) {
    nlohmann::json pieces = nlohmann::json::array();
    for (const io::StoredPiece& p : tensor.pieces)
      pieces.push_back({p.file, p.offsets, p.shape, p.file_offset, p.strides});
    tensors.push_back({name, io::to_string(tensor.dtype), tensor.shape, std::move(pieces)});
  }
  nlohmann::json checksums = nlohmann::json::array();
  for (const io::StoredChecksum& c : contents.stored.checksums)
    checksums.push_back({c.file, c.offset, c.bytes, c.crc32, c.name});
  nlohmann::json items = nlohmann::json::array();
  for (const io::StoredItem& i : contents.stored.other_items)
    items.push_back({i.name, i.file, i.offset, i.bytes});
  std::vector<std::string> metadata_files;
  for (const auto& path : contents.metadata_files) metadata_files.push_back(path.string());
  return nlohmann::json{files,         tensors, items, checksums, reads_json(contents.reads),
                        metadata_files}
      .dump();
}

// What dcp_contents_text wrote (by rank 0 of this very program: trusted).
inline DcpContents dcp_contents_from_text(const std::string& text) {
  const nlohmann::json json = nlohmann::json::parse(text);
  DcpContents contents;
  for (const auto& file : json[0])
    contents.stored.data_files.push_back({file[0].get<std::string>(), file[1]});
  for (const auto& t : json[1]) {
    io::StoredTensor tensor{t[0], io::parse_dtype(t[1].get<std::string>()), t[2], {}};
    for (const auto& p : t[3]) tensor.pieces.push_back({p[0], p[1], p[2], p[3], p[4]});
    contents.stored.tensors.emplace(tensor.name, std::move(tensor));
  }
  for (const auto& i : json[2]) contents.stored.other_items.push_back({i[0], i[1], i[2], i[3]});
  for (const auto& c : json[3]) contents.stored.checksums.push_back({c[0], c[1], c[2], c[3], c[4]});
  contents.reads = reads_from_json(json[4]);
  for (const auto& path : json[5]) contents.metadata_files.emplace_back(path.get<std::string>());
  return contents;
}

// The contents of the DCP folder `folder`, read by rank 0 of `group` and broadcast, every other
// rank's copies of its files checked against rank 0's reads: the same on every rank, or the
// same error.
inline DcpContents read_dcp_folder(const comm::Group& group, const std::filesystem::path& folder) {
  std::string text;
  std::optional<std::string> problem;
  if (group.rank() == 0) problem = attempt([&] { text = dcp_contents_text(dcp_contents(folder)); });
  agree(group, problem);
  broadcast_text(text, group);
  DcpContents contents = dcp_contents_from_text(text);
  agree_on_copies(group, contents.reads);
  return contents;
}

}  // namespace kshard::detail
