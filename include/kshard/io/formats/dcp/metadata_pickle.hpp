#pragma once

// The `.metadata` pickle of a DCP checkpoint: Metadata with its TensorStorageMetadata,
// ChunkStorageMetadata, MetadataIndex and _StorageInfo objects, as torch's own writer pickles
// them (spec section 1.8), read back by io/formats/dcp/metadata.hpp.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kshard/io/formats/dcp/metadata.hpp"
#include "kshard/io/torch/pickle_writer.hpp"

namespace kshard::detail {

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
