#pragma once

// The `.metadata` file of a PyTorch Distributed Checkpoint (torch.distributed.checkpoint), and
// the per-rank `__<rank>.metadata` of a save without collectives: a pickle of
// `Metadata(state_dict_metadata, planner_data, storage_data, storage_meta, version)`, read into
// each tensor's dtype, global size and chunks, each chunk with the byte range of the file that
// holds it (`storage_data`, keyed by MetadataIndex(fqn, offset)), and each bytes item with its
// byte range. Accepts what torch writes from 2.0 to 2.15 on Python 3.8 to 3.14 (see
// checkpoint_formats.md 1.2 and 1.8). Whether the chunks tile each tensor is left to
// tiling.hpp. Pure parsing, no I/O: the fuzzer runs it as it is.

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kshard/io/model/dtype.hpp"
#include "kshard/io/model/messages.hpp"
#include "kshard/io/torch/data_pickle.hpp"
#include "kshard/io/torch/pickle.hpp"

namespace kshard::detail {

inline constexpr std::string_view dcp_metadata_module = "torch.distributed.checkpoint.metadata";
// Where TensorProperties and its enum lived before torch 2.3 (PR 116248).
inline constexpr std::string_view dcp_legacy_module =
    "torch.distributed._shard.sharded_tensor.metadata";
inline constexpr std::string_view dcp_filesystem_module = "torch.distributed.checkpoint.filesystem";

// The globals a `.metadata` may name.
inline constexpr std::array<PickleGlobalName, 23> dcp_metadata_classes{{
    {dcp_metadata_module, "Metadata"},
    {dcp_metadata_module, "TensorStorageMetadata"},
    {dcp_metadata_module, "BytesStorageMetadata"},
    {dcp_metadata_module, "ChunkStorageMetadata"},
    {dcp_metadata_module, "MetadataIndex"},
    {dcp_metadata_module, "StorageMeta"},
    {dcp_metadata_module, "TensorProperties"},
    {dcp_metadata_module, "_MEM_FORMAT_ENCODING"},
    {dcp_metadata_module, "MEM_FORMAT_ENCODING"},
    {dcp_legacy_module, "TensorProperties"},
    {dcp_legacy_module, "_MEM_FORMAT_ENCODING"},
    {dcp_legacy_module, "MEM_FORMAT_ENCODING"},
    {dcp_filesystem_module, "_StorageInfo"},
    {"torch", "Size"},
    {"torch.serialization", "_get_layout"},
    {"torch._utils", "_get_layout"},
    {"collections", "OrderedDict"},
    {"pathlib", "PosixPath"},
    {"pathlib", "WindowsPath"},
    {"pathlib", "PurePosixPath"},
    {"pathlib._local", "PosixPath"},
    {"pathlib._local", "WindowsPath"},
    {"pathlib._local", "PurePosixPath"},
}};
inline constexpr auto dcp_metadata_globals =
    joined_globals(dcp_metadata_classes, torch_dtype_globals);

// Where an item's bytes are: [offset, offset + length) of the file relative_path.
struct DcpStorage {
  std::string relative_path;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

// One saved box of a tensor: offsets and sizes per dimension, both in [0, 2^62].
struct DcpChunk {
  std::vector<std::int64_t> offsets;
  std::vector<std::int64_t> sizes;
  DcpStorage storage;
};

struct DcpTensorEntry {
  std::string fqn;
  io::Dtype dtype = io::Dtype::F32;
  std::vector<std::int64_t> size;  // the global shape
  std::vector<DcpChunk> chunks;    // in the order of the metadata; each of size's rank
};

// A non-tensor value (an int, a learning rate, ...): a torch.save archive of its own.
struct DcpBytesEntry {
  std::string fqn;
  DcpStorage storage;
};

// Tensors and bytes items in the order of state_dict_metadata.
struct DcpMetadata {
  std::vector<DcpTensorEntry> tensors;
  std::vector<DcpBytesEntry> bytes_items;
  std::optional<std::string> version;
};

inline constexpr std::int64_t dcp_limit = std::int64_t{1} << 62;

// Reads a `.metadata` pickle's values into DcpMetadata.
class DcpMetadataReader {
 public:
  DcpMetadataReader(const PickleDocument& document, std::string_view source)
      : document_(document),
        source_(source),
        // What the result may copy and the fields read may take: shared memo values would otherwise
        // multiply both.
        budget_(16 * static_cast<std::uint64_t>(document.input_bytes) + (1 << 16)) {}

  DcpMetadata read() {
    const auto fields = state_of(document_.root, "Metadata", {dcp_metadata_module});
    const auto entries = field(fields, "state_dict_metadata");
    const auto storage = field(fields, "storage_data");
    if (!entries || !storage) fail("has no state_dict_metadata or storage_data");
    read_storage_data(*storage);
    DcpMetadata metadata;
    for (const auto& [key, entry] : pairs(*entries, "state_dict_metadata"))
      read_entry(text(key, "a state_dict_metadata key"), entry, metadata);
    for (const auto& [index, stored] : storage_)
      if (!stored.used)
        fail("has storage_data for ", in_quotes(index.first),
             index.second ? " at offset " + io::shape_text(*index.second) : std::string(),
             ", which names no chunk or bytes item");
    const auto version = field(fields, "version");
    if (version && !document_.get<PickleNone>(*version))
      metadata.version = copy(text(*version, "the version"));
    return metadata;
  }

 private:
  using Fields = std::vector<std::pair<std::string_view, PickleId>>;
  using Index = std::pair<std::string, std::optional<std::vector<std::int64_t>>>;
  struct Stored {
    DcpStorage storage;
    bool used = false;
  };

  const PickleDocument& document_;
  std::string_view source_;
  std::uint64_t budget_;
  std::map<Index, Stored> storage_;  // storage_data by MetadataIndex(fqn, offset)
  std::set<std::string> fqns_;       // the entries read so far

  template <class... Pieces>
  [[noreturn]] void fail(const Pieces&... pieces) const {
    throw_io_error(source_, " ", pieces...);
  }

  void spend(std::uint64_t cells) {
    if (cells > budget_)
      fail("shares values so often that its contents exceed ", 16,
           " times its size; kshard refuses such a metadata file");
    budget_ -= cells;
  }

  std::string copy(std::string_view text) {
    spend(text.size() + 1);
    return std::string(text);
  }

  const std::string& text(PickleId id, std::string_view what) const {
    const auto* value = document_.get<std::string>(id);
    if (value == nullptr) fail("has ", pickle_value_kind(document_, id), " for ", what);
    return *value;
  }

  std::int64_t number(PickleId id, std::string_view what) const {
    const auto* value = document_.get<std::int64_t>(id);
    if (value == nullptr) fail("has ", pickle_value_kind(document_, id), " for ", what);
    if (*value < 0 || *value > dcp_limit)
      fail("has ", what, " ", *value, "; it must lie in [0, 2^62]");
    return *value;
  }

  // Whether `global` is class `name` of one of `modules`.
  static bool is_class(const PickleGlobal& global, std::string_view name,
                       std::initializer_list<std::string_view> modules) {
    for (const std::string_view module : modules)
      if (global.name == name && global.module == module) return true;
    return false;
  }

  const PickleObject* object_of(PickleId id, std::string_view name,
                                std::initializer_list<std::string_view> modules) const {
    const auto* object = document_.get<PickleObject>(id);
    if (object == nullptr || !is_class(object_global(document_, *object), name, modules))
      return nullptr;
    return object;
  }

  // A dict's pairs, or an OrderedDict's.
  const std::vector<std::pair<PickleId, PickleId>>& pairs(PickleId id, std::string_view what) {
    if (const auto* dict = document_.get<PickleDict>(id)) return dict->items;
    if (const auto* ordered = object_of(id, "OrderedDict", {"collections"})) return ordered->items;
    fail("has ", pickle_value_kind(document_, id), " for ", what, "; it needs a dict");
  }

  // The state a dataclass of class `name` was built with: its __dict__ as (name, value) pairs,
  // also where slots make it (None or __dict__, slots).
  Fields state_of(PickleId id, std::string_view name,
                  std::initializer_list<std::string_view> modules) {
    const PickleObject* object = object_of(id, name, modules);
    if (object == nullptr)
      fail("has ", pickle_value_kind(document_, id), " where it needs a ", name);
    Fields fields;
    if (!object->state) return fields;
    std::vector<PickleId> parts{*object->state};
    if (const auto* tuple = document_.get<PickleTuple>(*object->state);
        tuple && tuple->items.size() == 2)
      parts = tuple->items;
    for (const PickleId part : parts) {
      if (document_.get<PickleNone>(part)) continue;
      const auto& items = pairs(part, std::string(name) + "'s state");
      spend(items.size());  // a state shared by many objects is read once per object
      for (const auto& [key, value] : items) fields.emplace_back(text(key, "a field name"), value);
    }
    return fields;
  }

  static std::optional<PickleId> field(const Fields& fields, std::string_view name) {
    for (const auto& [key, value] : fields)
      if (key == name) return value;
    return std::nullopt;
  }

  // A torch.Size (or a plain tuple or list) of ints in [0, 2^62].
  std::vector<std::int64_t> extents(PickleId id, std::string_view what) {
    PickleId items = id;
    if (const PickleObject* size = object_of(id, "Size", {"torch"})) {
      const auto& args = document_.get<PickleTuple>(size->args)->items;
      if (args.size() != 1) fail("has a torch.Size of ", args.size(), " arguments for ", what);
      items = args[0];
    }
    const std::vector<PickleId>* values = pickle_sequence(document_, items);
    if (values == nullptr) fail("has ", pickle_value_kind(document_, items), " for ", what);
    spend(values->size());
    std::vector<std::int64_t> result;
    for (const PickleId value : *values) result.push_back(number(value, what));
    return result;
  }

  // One MetadataIndex -> _StorageInfo pair of storage_data.
  void read_storage_pair(PickleId key, PickleId value) {
    const Fields index = state_of(key, "MetadataIndex", {dcp_metadata_module});
    const auto fqn = field(index, "fqn");
    if (!fqn) fail("has a MetadataIndex without an fqn");
    const std::string& name = text(*fqn, "a MetadataIndex's fqn");
    const auto offset = field(index, "offset");
    std::optional<std::vector<std::int64_t>> offsets;
    if (offset && !document_.get<PickleNone>(*offset))
      offsets = extents(*offset, "a MetadataIndex's offset");
    Index where{copy(name), std::move(offsets)};
    const bool added =
        storage_.try_emplace(std::move(where), Stored{storage_info(value), false}).second;
    if (!added) fail("has two storage_data entries for ", in_quotes(name), " at one offset");
  }

  void read_storage_data(PickleId id) {
    for (const auto& [key, value] : pairs(id, "storage_data")) read_storage_pair(key, value);
  }

  // A _StorageInfo: where the bytes are; refuses transforms (compression, ...) it cannot undo.
  DcpStorage storage_info(PickleId id) {
    std::optional<std::string> path;
    std::optional<std::int64_t> offset, length;
    for (const auto& [name, value] : state_of(id, "_StorageInfo", {dcp_filesystem_module})) {
      if (name == "relative_path")
        path = copy(relative_path(value));
      else if (name == "offset")
        offset = number(value, "a storage offset");
      else if (name == "length")
        length = number(value, "a storage length");
      else if (name == "transform_descriptors")
        refuse_transforms(value);
      else
        fail("has a _StorageInfo field ", in_quotes(name), ", which kshard does not know");
    }
    if (!path || !offset || !length)
      fail("has a _StorageInfo without relative_path, offset or length");
    return {std::move(*path), static_cast<std::uint64_t>(*offset),
            static_cast<std::uint64_t>(*length)};
  }

  // A file name inside the checkpoint folder: no absolute path, no "..", no NUL.
  const std::string& relative_path(PickleId id) const {
    const std::string& path = text(id, "a relative_path");
    const bool climbs = path == ".." || path.starts_with("../") || path.ends_with("/..") ||
                        path.find("/../") != std::string::npos;
    if (path.empty() || path.starts_with('/') || climbs || path.find('\0') != std::string::npos)
      fail("has the relative_path ", in_quotes(path),
           "; it must name a file inside the checkpoint folder");
    return path;
  }

  void refuse_transforms(PickleId id) const {
    if (document_.get<PickleNone>(id)) return;
    const std::vector<PickleId>* names = pickle_sequence(document_, id);
    if (names == nullptr) fail("has ", pickle_value_kind(document_, id), " for transforms");
    if (names->empty()) return;
    std::string listed;
    for (const PickleId name : *names)
      listed += (listed.empty() ? "" : ", ") + in_quotes(text(name, "a transform"));
    fail("has an item stored through the transforms ", listed,
         " (torch's stream extensions); kshard reads untransformed items only");
  }

  // The storage of `fqn` at `offsets` (nullopt: a bytes item), marked used.
  DcpStorage take_storage(const std::string& fqn,
                          const std::optional<std::vector<std::int64_t>>& offsets) {
    const auto found = storage_.find(Index{fqn, offsets});
    const std::string where = offsets ? " at offset " + io::shape_text(*offsets) : std::string();
    if (found == storage_.end()) fail("has no storage_data for ", in_quotes(fqn), where);
    if (found->second.used) fail("has two chunks of ", in_quotes(fqn), where);
    found->second.used = true;
    spend(found->second.storage.relative_path.size());
    return found->second.storage;
  }

  DcpChunk chunk(PickleId id, const DcpTensorEntry& tensor) {
    const Fields fields = state_of(id, "ChunkStorageMetadata", {dcp_metadata_module});
    const auto offsets = field(fields, "offsets");
    const auto sizes = field(fields, "sizes");
    if (!offsets || !sizes)
      fail("has a chunk of ", in_quotes(tensor.fqn), " without offsets or sizes");
    DcpChunk result{extents(*offsets, "a chunk's offsets"), extents(*sizes, "a chunk's sizes"), {}};
    if (result.offsets.size() != tensor.size.size() || result.sizes.size() != tensor.size.size())
      fail("has a chunk of ", in_quotes(tensor.fqn), " of size ", io::shape_text(tensor.size),
           " with offsets ", io::shape_text(result.offsets), " and sizes ",
           io::shape_text(result.sizes), "; both need the tensor's rank ", tensor.size.size());
    result.storage = take_storage(tensor.fqn, result.offsets);
    return result;
  }

  // Refuses a layout other than torch.strided, which torch pickles as
  // torch.serialization._get_layout('torch.strided').
  void check_strided(PickleId layout, const std::string& fqn) const {
    const PickleObject* get_layout =
        object_of(layout, "_get_layout", {"torch.serialization", "torch._utils"});
    const auto* args = get_layout ? &document_.get<PickleTuple>(get_layout->args)->items : nullptr;
    const auto* name =
        args && args->size() == 1 ? document_.get<std::string>(args->front()) : nullptr;
    if (name == nullptr || *name != "torch.strided")
      fail("has tensor ", in_quotes(fqn), " of layout ",
           name ? in_quotes(*name) : pickle_value_kind(document_, layout),
           "; kshard reads strided tensors only");
  }

  // A TensorProperties' dtype. Its state is the tuple (dtype, layout, requires_grad,
  // memory_format, pin_memory[, strides]) of its __getstate__, or a dict before torch had one.
  io::Dtype properties_dtype(PickleId id, const std::string& fqn) {
    const std::initializer_list<std::string_view> modules{dcp_metadata_module, dcp_legacy_module};
    const PickleObject* object = object_of(id, "TensorProperties", modules);
    const auto* tuple =
        object && object->state ? document_.get<PickleTuple>(*object->state) : nullptr;
    std::optional<PickleId> dtype, layout;
    if (tuple && (tuple->items.size() == 5 || tuple->items.size() == 6)) {
      dtype = tuple->items[0];
      layout = tuple->items[1];
    } else {
      const Fields named = state_of(id, "TensorProperties", modules);
      dtype = field(named, "dtype");
      layout = field(named, "layout");
    }
    const auto* dtype_global = dtype ? document_.get<PickleGlobal>(*dtype) : nullptr;
    if (!layout || dtype_global == nullptr || dtype_global->module != "torch")
      fail("has TensorProperties of ", in_quotes(fqn), " without a dtype and a layout");
    check_strided(*layout, fqn);
    return torch_dtype(dtype_global->name, source_);
  }

  DcpTensorEntry read_tensor(const std::string& fqn, const Fields& fields) {
    const auto properties = field(fields, "properties");
    const auto size = field(fields, "size");
    const auto chunks = field(fields, "chunks");
    if (!properties || !size || !chunks)
      fail("has tensor ", in_quotes(fqn), " without properties, size or chunks");
    DcpTensorEntry entry{
        copy(fqn), properties_dtype(*properties, fqn), extents(*size, "a tensor's size"), {}};
    const std::vector<PickleId>* items = pickle_sequence(document_, *chunks);
    if (items == nullptr)
      fail("has ", pickle_value_kind(document_, *chunks), " for the chunks of ", in_quotes(fqn));
    for (const PickleId item : *items) entry.chunks.push_back(chunk(item, entry));
    return entry;
  }

  void read_entry(const std::string& fqn, PickleId id, DcpMetadata& metadata) {
    if (!fqns_.insert(fqn).second) fail("has two entries for ", in_quotes(fqn));
    if (object_of(id, "BytesStorageMetadata", {dcp_metadata_module})) {
      metadata.bytes_items.push_back({copy(fqn), take_storage(fqn, std::nullopt)});
      return;
    }
    if (!object_of(id, "TensorStorageMetadata", {dcp_metadata_module}))
      fail("has ", pickle_value_kind(document_, id), " for ", in_quotes(fqn),
           "; it needs a TensorStorageMetadata or BytesStorageMetadata");
    metadata.tensors.push_back(
        read_tensor(fqn, state_of(id, "TensorStorageMetadata", {dcp_metadata_module})));
  }
};

// The DcpMetadata of the `.metadata` pickle `input`; `source` names it in messages. Throws
// kshard::error for input that is not such a pickle, names a global outside
// dcp_metadata_globals, has a dtype kshard does not read, a non-strided layout, a size or offset
// outside [0, 2^62], a chunk of another rank than its tensor's or without storage_data, storage
// data that names no chunk, or items stored through transforms.
inline DcpMetadata parse_dcp_metadata(std::span<const std::byte> input, std::string_view source) {
  const PickleDocument document = unpickle(input, dcp_metadata_globals, source);
  return DcpMetadataReader(document, source).read();
}

}  // namespace kshard::detail
