#pragma once

// The pickles a DCP writer emits, at protocol 2 (every torch reads it; spec section 1.8): a
// checkpoint's `.metadata` (Metadata with its TensorStorageMetadata, ChunkStorageMetadata,
// MetadataIndex and _StorageInfo objects, built as torch's own pickles build them: NEWOBJ then
// BUILD with the fields) and a piece's `data.pkl` (_rebuild_tensor_v2 over a typed storage, or
// _rebuild_tensor_v3 over an untyped one for dtypes without a typed storage class). No memo:
// repeated globals are written again, which every unpickler accepts.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kshard/io/detail/box_runs.hpp"
#include "kshard/io/detail/dcp/metadata.hpp"
#include "kshard/io/torch/data_pickle.hpp"

namespace kshard::detail {

// A protocol-2 pickle, opcode by opcode.
class PickleWriter {
 public:
  PickleWriter() { op(0x80, 2); }  // PROTO 2

  void global(std::string_view module, std::string_view name) {
    bytes_.push_back(std::byte{'c'});
    text(module);
    bytes_.push_back(std::byte{'\n'});
    text(name);
    bytes_.push_back(std::byte{'\n'});
  }
  void integer(std::int64_t value) {
    if (value >= 0 && value < 256) return op('K', static_cast<std::uint8_t>(value));  // BININT1
    if (value >= INT32_MIN && value <= INT32_MAX) {
      op('J');  // BININT: 4 bytes, signed
      return little_endian(static_cast<std::uint64_t>(value), 4);
    }
    op(0x8a, 8);  // LONG1 of 8 bytes, two's complement
    little_endian(static_cast<std::uint64_t>(value), 8);
  }
  void string(std::string_view value) {
    op('X');  // BINUNICODE
    little_endian(value.size(), 4);
    text(value);
  }
  void boolean(bool value) { op(value ? 0x88 : 0x89); }
  void none() { op('N'); }
  void mark() { op('('); }
  void tuple_from_mark() { op('t'); }
  void empty_tuple() { op(')'); }
  void empty_dict() { op('}'); }
  void empty_list() { op(']'); }
  void set_items_from_mark() { op('u'); }
  void append_from_mark() { op('e'); }
  void new_object() { op(0x81); }    // NEWOBJ: cls args -> cls.__new__(cls, *args)
  void build() { op('b'); }          // BUILD: obj state -> obj with state
  void reduce() { op('R'); }         // REDUCE: callable args -> callable(*args)
  void persistent_id() { op('Q'); }  // BINPERSID

  // A tuple of integers (MARK ... TUPLE).
  void integers(std::span<const std::int64_t> values) {
    mark();
    for (const std::int64_t v : values) integer(v);
    tuple_from_mark();
  }
  // `torch.Size(values)`.
  void size(std::span<const std::int64_t> values) {
    global("torch", "Size");
    integers(values);
    op(0x85);  // TUPLE1: the constructor's one argument
    reduce();
  }
  // An object of class `module.name` whose fields `fill` pushes as key, value pairs.
  template <class Fill>
  void object(std::string_view module, std::string_view name, Fill&& fill) {
    global(module, name);
    empty_tuple();
    new_object();
    empty_dict();
    mark();
    fill();
    set_items_from_mark();
    build();
  }
  // The finished pickle.
  std::vector<std::byte> finish() {
    op('.');  // STOP
    return std::move(bytes_);
  }

 private:
  void op(int code) { bytes_.push_back(static_cast<std::byte>(code)); }
  void op(int code, std::uint8_t argument) {
    op(code);
    bytes_.push_back(static_cast<std::byte>(argument));
  }
  void text(std::string_view value) {
    for (const char c : value) bytes_.push_back(static_cast<std::byte>(c));
  }
  void little_endian(std::uint64_t value, int width) {
    for (int i = 0; i < width; ++i) bytes_.push_back(static_cast<std::byte>(value >> (8 * i)));
  }

  std::vector<std::byte> bytes_;
};

// torch's name and typed storage class of `dtype` (storage empty: untyped, _rebuild_tensor_v3).
inline const TorchDtype& torch_dtype_of(io::Dtype dtype) {
  const auto* found = std::find_if(torch_dtypes.begin(), torch_dtypes.end(),
                                   [&](const TorchDtype& t) { return t.dtype == dtype; });
  if (found == torch_dtypes.end())
    throw_io_error("PyTorch has no dtype for ", io::to_string(dtype));
  return *found;
}

// `data.pkl` of a torch.save archive holding one contiguous tensor of `dtype` and `size` in
// its entry `data/0` (row-major, from element 0).
inline std::vector<std::byte> tensor_data_pickle(io::Dtype dtype,
                                                 std::span<const std::int64_t> size) {
  const TorchDtype& torch = torch_dtype_of(dtype);
  const bool typed = !torch.storage.empty();
  std::int64_t elements = 1;
  for (const std::int64_t extent : size) elements *= extent;
  PickleWriter p;
  p.global("torch._utils", typed ? "_rebuild_tensor_v2" : "_rebuild_tensor_v3");
  p.mark();
  p.mark();  // the persistent id: ('storage', class, key, location, count)
  p.string("storage");
  if (typed)
    p.global("torch", torch.storage);
  else
    p.global("torch.storage", "UntypedStorage");
  p.string("0");
  p.string("cpu");
  p.integer(typed ? elements : elements * static_cast<std::int64_t>(io::dtype_size(dtype)));
  p.tuple_from_mark();
  p.persistent_id();
  p.integer(0);  // storage offset
  p.integers(size);
  p.integers(row_major_strides(size));
  p.boolean(false);  // requires_grad
  p.global("collections", "OrderedDict");
  p.empty_tuple();
  p.reduce();
  if (!typed) p.global("torch", torch.name);
  p.tuple_from_mark();
  p.reduce();
  return p.finish();
}

// `torch.Size`-keyed MetadataIndex(fqn, offset, index) (offset and index None for a bytes item).
inline void metadata_index(PickleWriter& p, const std::string& fqn,
                           const std::vector<std::int64_t>* offsets, std::int64_t index) {
  p.object(dcp_metadata_module, "MetadataIndex", [&] {
    p.string("fqn");
    p.string(fqn);
    p.string("offset");
    offsets != nullptr ? p.size(*offsets) : p.none();
    p.string("index");
    offsets != nullptr ? p.integer(index) : p.none();
  });
}

// _StorageInfo(relative_path, offset, length).
inline void storage_info(PickleWriter& p, const DcpStorage& storage) {
  p.object(dcp_filesystem_module, "_StorageInfo", [&] {
    p.string("relative_path");
    p.string(storage.relative_path);
    p.string("offset");
    p.integer(static_cast<std::int64_t>(storage.offset));
    p.string("length");
    p.integer(static_cast<std::int64_t>(storage.length));
  });
}

// TensorStorageMetadata of `tensor`: its properties as the 5-tuple every torch reads (dtype,
// strided layout, no grad, contiguous format, not pinned), its size and its chunks.
inline void tensor_metadata(PickleWriter& p, const DcpTensorEntry& tensor) {
  p.object(dcp_metadata_module, "TensorStorageMetadata", [&] {
    p.string("properties");
    p.global(dcp_metadata_module, "TensorProperties");
    p.empty_tuple();
    p.new_object();
    p.mark();
    p.global("torch", torch_dtype_of(tensor.dtype).name);
    p.global("torch.serialization", "_get_layout");
    p.mark();
    p.string("torch.strided");
    p.tuple_from_mark();
    p.reduce();
    p.boolean(false);
    p.global(dcp_metadata_module, "_MEM_FORMAT_ENCODING");
    p.mark();
    p.integer(0);
    p.tuple_from_mark();
    p.reduce();
    p.boolean(false);
    p.tuple_from_mark();
    p.build();
    p.string("size");
    p.size(tensor.size);
    p.string("chunks");
    p.empty_list();
    p.mark();
    for (const DcpChunk& chunk : tensor.chunks)
      p.object(dcp_metadata_module, "ChunkStorageMetadata", [&] {
        p.string("offsets");
        p.size(chunk.offsets);
        p.string("sizes");
        p.size(chunk.sizes);
      });
    p.append_from_mark();
  });
}

// The entries of `metadata` under its three dictionaries.
inline void metadata_fields(PickleWriter& p, const DcpMetadata& metadata) {
  p.string("state_dict_metadata");
  p.empty_dict();
  p.mark();
  for (const DcpTensorEntry& tensor : metadata.tensors) {
    p.string(tensor.fqn);
    tensor_metadata(p, tensor);
  }
  for (const DcpBytesEntry& item : metadata.bytes_items) {
    p.string(item.fqn);
    p.global(dcp_metadata_module, "BytesStorageMetadata");
    p.empty_tuple();
    p.new_object();
  }
  p.set_items_from_mark();
  p.string("planner_data");
  p.empty_dict();
  p.mark();
  const auto path = [&](const std::string& fqn) {
    p.string(fqn);
    p.mark();
    p.string(fqn);
    p.tuple_from_mark();
  };
  for (const DcpTensorEntry& tensor : metadata.tensors) path(tensor.fqn);
  for (const DcpBytesEntry& item : metadata.bytes_items) path(item.fqn);
  p.set_items_from_mark();
  p.string("storage_data");
  p.empty_dict();
  p.mark();
  for (const DcpTensorEntry& tensor : metadata.tensors)
    for (std::size_t i = 0; i < tensor.chunks.size(); ++i) {
      metadata_index(p, tensor.fqn, &tensor.chunks[i].offsets, static_cast<std::int64_t>(i));
      storage_info(p, tensor.chunks[i].storage);
    }
  for (const DcpBytesEntry& item : metadata.bytes_items) {
    metadata_index(p, item.fqn, nullptr, 0);
    storage_info(p, item.storage);
  }
  p.set_items_from_mark();
}

// The `.metadata` of `metadata`, as torch pickles it (storage_meta None, version "1.0.0").
inline std::vector<std::byte> dcp_metadata_pickle(const DcpMetadata& metadata) {
  PickleWriter p;
  p.object(dcp_metadata_module, "Metadata", [&] {
    metadata_fields(p, metadata);
    p.string("storage_meta");
    p.none();
    p.string("version");
    p.string("1.0.0");
  });
  return p.finish();
}

}  // namespace kshard::detail
