// Fuzzes the restricted unpickler of PyTorch DCP checkpoints (kshard/io/formats/dcp): the first
// byte picks the reader (its value modulo 3: 0 the `.metadata` reader, parse_dcp_metadata; 1 the
// data.pkl tensor reader, parse_torch_tensor_pickle; 2 the bytes-item renderer,
// parse_bytes_item_pickle), the rest is the pickle. Any of them may throw kshard::error; any other
// exception aborts. What they return must keep its promises: a tensor's size and every chunk's
// offsets and sizes in [0, 2^62], each chunk of its tensor's rank, storage ranges in [0, 2^62];
// a rebuilt tensor's strides and offset non-negative, of its size's rank, every element it
// reaches inside its storage; a rendered value no longer than its limit and "...". Any other
// outcome traps; ASan, UBSan and libFuzzer's -malloc_limit_mb / -rss_limit_mb catch the rest
// (memory that grows faster than the input, a recursion that overflows the stack).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kshard/error.hpp"
#include "kshard/io/formats/dcp/metadata.hpp"
#include "kshard/io/safetensors/header.hpp"
#include "kshard/io/torch/data_pickle.hpp"

namespace {

namespace detail = kshard::detail;

constexpr std::int64_t limit = std::int64_t{1} << 62;
constexpr std::size_t text_limit = 64;

void require(bool ok) {
  if (!ok) __builtin_trap();
}

void check_extents(const std::vector<std::int64_t>& values) {
  for (const std::int64_t value : values) require(value >= 0 && value <= limit);
}

void check_storage(const detail::DcpStorage& storage) {
  require(!storage.relative_path.empty());
  require(storage.offset <= static_cast<std::uint64_t>(limit));
  require(storage.length <= static_cast<std::uint64_t>(limit));
}

void check_metadata(const detail::DcpMetadata& metadata) {
  for (const detail::DcpTensorEntry& tensor : metadata.tensors) {
    check_extents(tensor.size);
    for (const detail::DcpChunk& chunk : tensor.chunks) {
      require(chunk.offsets.size() == tensor.size.size());
      require(chunk.sizes.size() == tensor.size.size());
      check_extents(chunk.offsets);
      check_extents(chunk.sizes);
      check_storage(chunk.storage);
    }
  }
  for (const detail::DcpBytesEntry& item : metadata.bytes_items) check_storage(item.storage);
}

// Every element the tensor reaches lies inside its storage (checked in 128 bits).
void check_tensor(const detail::TorchTensorRecord& record) {
  require(record.size.size() == record.stride.size());
  require(record.storage_offset >= 0);
  check_extents(record.size);
  check_extents(record.stride);
  const auto elements =
      static_cast<__int128>(record.storage_bytes / kshard::io::dtype_size(record.dtype));
  __int128 last = record.storage_offset;
  bool empty = false;
  for (std::size_t d = 0; d < record.size.size(); ++d) {
    empty = empty || record.size[d] == 0;
    if (record.size[d] > 0) last += static_cast<__int128>(record.size[d] - 1) * record.stride[d];
    if (last >= elements) break;  // so that the sum never overflows
  }
  require(empty ? record.storage_offset <= elements : last < elements);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto input = std::as_bytes(std::span(data + 1, size - 1));
  try {
    switch (data[0] % 3) {
      case 0:
        check_metadata(detail::parse_dcp_metadata(input, "'.metadata'"));
        break;
      case 1:
        check_tensor(detail::parse_torch_tensor_pickle(input, "data.pkl"));
        break;
      default:
        require(detail::parse_bytes_item_pickle(input, "data.pkl", text_limit).size() <=
                text_limit + 3);
    }
  } catch (const kshard::error&) {
  }
  return 0;
}
