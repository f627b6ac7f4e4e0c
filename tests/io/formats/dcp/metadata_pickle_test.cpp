// The pickles a DCP writer emits (kshard/io/torch/pickle_writer.hpp), read back by the
// restricted unpickler: `.metadata` with tensors, chunks, storage and bytes items, and
// `data.pkl` over a typed (v2) and an untyped (v3) storage. (That torch loads them is the
// writer's interop test.)

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kshard/io/formats/dcp/metadata_pickle.hpp"
#include "kshard/io/torch/data_pickle.hpp"
#include "kshard/io/torch/pickle_writer.hpp"

namespace {

namespace detail = kshard::detail;
namespace io = kshard::io;
using Shape = std::vector<std::int64_t>;

detail::DcpChunk chunk(Shape offsets, Shape sizes, const char* file, std::uint64_t at,
                       std::uint64_t length) {
  detail::DcpChunk c;
  c.offsets = std::move(offsets);
  c.sizes = std::move(sizes);
  c.storage.relative_path = file;
  c.storage.offset = at;
  c.storage.length = length;
  return c;
}

TEST(DcpPickleWriter, MetadataReadsBack) {
  detail::DcpMetadata written;
  detail::DcpTensorEntry w;
  w.fqn = "model.w";
  w.dtype = io::Dtype::BF16;
  w.size = {8, 4};
  w.chunks = {chunk({0, 0}, {4, 4}, "__0_0.distcp", 0, 1600),
              chunk({4, 0}, {4, 4}, "__1_0.distcp", 0, 1600)};
  detail::DcpTensorEntry step;
  step.fqn = "optim.state.model.w.step";
  step.dtype = io::Dtype::F32;
  step.chunks = {chunk({}, {}, "__1_0.distcp", 1600, 3000000000)};  // past 2^31: an 8-byte LONG1
  written.tensors = {w, step};
  detail::DcpBytesEntry lr;
  lr.fqn = "optim.param_groups.0.lr";
  lr.storage = chunk({}, {}, "__0_0.distcp", 1600, 900).storage;
  written.bytes_items = {lr};

  const detail::DcpMetadata read =
      detail::parse_dcp_metadata(detail::dcp_metadata_pickle(written), "the written .metadata");
  ASSERT_EQ(read.tensors.size(), 2u);
  for (std::size_t t = 0; t < 2; ++t) {
    const auto& [a, b] = std::tie(written.tensors[t], read.tensors[t]);
    EXPECT_EQ(b.fqn, a.fqn);
    EXPECT_EQ(b.dtype, a.dtype);
    EXPECT_EQ(b.size, a.size);
    ASSERT_EQ(b.chunks.size(), a.chunks.size());
    for (std::size_t c = 0; c < a.chunks.size(); ++c) {
      EXPECT_EQ(b.chunks[c].offsets, a.chunks[c].offsets);
      EXPECT_EQ(b.chunks[c].sizes, a.chunks[c].sizes);
      EXPECT_EQ(b.chunks[c].storage.relative_path, a.chunks[c].storage.relative_path);
      EXPECT_EQ(b.chunks[c].storage.offset, a.chunks[c].storage.offset);
      EXPECT_EQ(b.chunks[c].storage.length, a.chunks[c].storage.length);
    }
  }
  ASSERT_EQ(read.bytes_items.size(), 1u);
  EXPECT_EQ(read.bytes_items[0].fqn, lr.fqn);
  EXPECT_EQ(read.bytes_items[0].storage.offset, 1600u);
  EXPECT_EQ(read.version, "1.0.0");
}

TEST(DcpPickleWriter, DataPickleReadsBackTypedAndUntyped) {
  for (const io::Dtype dtype : {io::Dtype::F32, io::Dtype::BF16, io::Dtype::BOOL,
                                io::Dtype::F8_E4M3, io::Dtype::F8_E8M0, io::Dtype::U16}) {
    const Shape size{3, 5};
    const detail::TorchTensorRecord record = detail::parse_torch_tensor_pickle(
        detail::tensor_data_pickle(dtype, size), "the written data.pkl");
    EXPECT_EQ(record.dtype, dtype) << io::to_string(dtype);
    EXPECT_EQ(record.storage_key, "0");
    EXPECT_EQ(record.storage_bytes, 15 * io::dtype_size(dtype));
    EXPECT_EQ(record.storage_offset, 0);
    EXPECT_EQ(record.size, size);
    EXPECT_EQ(record.stride, (Shape{5, 1}));
  }
}

}  // namespace
