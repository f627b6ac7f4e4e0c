// The restricted unpickler of PyTorch DCP checkpoints (kshard/io/formats/dcp): torch's own
// `.metadata` and `data.pkl` of fixtures/dcp_example decoded to the values of
// checkpoint_formats.md 1.3, the pickles of fixtures/dcp_pickles (written by make_pickles.py with
// Python's pickle module and stand-ins for torch's classes) for protocols 2 to 5 and the version
// skew torch and Python show, and every hostile or broken input refused with a kshard::error
// that names what it refuses, never a crash and never a call.

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kshard/error.hpp"
#include "kshard/io/formats/dcp/metadata.hpp"
#include "kshard/io/safetensors/header.hpp"
#include "kshard/io/torch/data_pickle.hpp"
#include "kshard/io/torch/pickle.hpp"
#include "safetensors_test_support.hpp"

namespace {

namespace detail = kshard::detail;
namespace io = kshard::io;
using Shape = std::vector<std::int64_t>;

const std::filesystem::path fixtures = KSHARD_IO_FIXTURES_DIR;

std::string file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string example(std::string_view name) { return file_bytes(fixtures / "dcp_example" / name); }
std::string vector_file(std::string_view name) {
  return file_bytes(fixtures / "dcp_pickles" / name);
}

std::span<const std::byte> bytes_of(std::string_view text) {
  return std::as_bytes(std::span(text.data(), text.size()));
}

detail::DcpMetadata metadata(std::string_view pickle) {
  return detail::parse_dcp_metadata(bytes_of(pickle), "'.metadata'");
}
detail::TorchTensorRecord tensor(std::string_view pickle) {
  return detail::parse_torch_tensor_pickle(bytes_of(pickle), "data.pkl");
}
std::string item_text(std::string_view pickle) {
  return detail::parse_bytes_item_pickle(bytes_of(pickle), "data.pkl");
}

using kshard_io_test::error_of;

// The data.pkl of a torch.save archive: found crudely, from its entry name to its STOP (the ZIP
// reader is zip.hpp's; bytes after STOP are ignored).
std::string data_pkl_of(const std::string& archive) {
  const std::size_t name = archive.find("archive/data.pkl");
  const std::size_t start = archive.find("\x80\x02", name);
  EXPECT_NE(name, std::string::npos);
  EXPECT_NE(start, std::string::npos);
  return archive.substr(start);
}

// Checks the decoded metadata of checkpoint_formats.md 1.3 ('w', 8x4 float32, rows 0-3 in
// __0_0.distcp, rows 4-7 in __1_0.distcp, each a whole 1641-byte item).
void expect_example(const detail::DcpMetadata& decoded) {
  ASSERT_EQ(decoded.tensors.size(), 1u);
  EXPECT_TRUE(decoded.bytes_items.empty());
  const detail::DcpTensorEntry& w = decoded.tensors[0];
  EXPECT_EQ(w.fqn, "w");
  EXPECT_EQ(w.dtype, io::Dtype::F32);
  EXPECT_EQ(w.size, (Shape{8, 4}));
  ASSERT_EQ(w.chunks.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    const detail::DcpChunk& chunk = w.chunks[i];
    EXPECT_EQ(chunk.offsets, (Shape{4 * static_cast<std::int64_t>(i), 0}));
    EXPECT_EQ(chunk.sizes, (Shape{4, 4}));
    EXPECT_EQ(chunk.storage.relative_path, "__" + std::to_string(i) + "_0.distcp");
    EXPECT_EQ(chunk.storage.offset, 0u);
    EXPECT_EQ(chunk.storage.length, 1641u);
  }
}

TEST(DcpMetadata, TorchsExampleDecodesToItsValues) {
  const detail::DcpMetadata decoded = metadata(example(".metadata"));
  expect_example(decoded);
  EXPECT_EQ(decoded.version, "1.0.0");
}

TEST(DcpMetadata, ReadsProtocols2To5) {
  for (const char* name :
       {"metadata_p2.pkl", "metadata_p3.pkl", "metadata_p4.pkl", "metadata_p5.pkl"}) {
    SCOPED_TRACE(name);
    expect_example(metadata(vector_file(name)));
  }
}

TEST(DcpMetadata, ReadsTheVersionSkewOfTorchAndPython) {
  // A 5-tuple TensorProperties (before strides), the pre-2.3 module of TensorProperties and
  // MEM_FORMAT_ENCODING (no underscore), Python 3.13's pathlib._local, no optional fields.
  for (const char* name : {"metadata_5tuple.pkl", "metadata_legacy_module.pkl",
                           "metadata_py313_pathlib.pkl", "metadata_minimal.pkl"}) {
    SCOPED_TRACE(name);
    expect_example(metadata(vector_file(name)));
  }
  EXPECT_FALSE(metadata(vector_file("metadata_minimal.pkl")).version.has_value());
}

TEST(DcpMetadata, ReadsDtypesScalarsEmptyChunksBytesItemsAndLargeOffsets) {
  const detail::DcpMetadata decoded = metadata(vector_file("metadata_mixed.pkl"));
  ASSERT_EQ(decoded.tensors.size(), 4u);
  const std::vector<io::Dtype> dtypes{io::Dtype::BF16, io::Dtype::F8_E4M3, io::Dtype::I64,
                                      io::Dtype::BOOL};
  const std::vector<Shape> sizes{{3, 2}, {2}, {}, {0, 5}};
  std::uint64_t offset = std::uint64_t{3} << 31;  // LONG1 in the pickle
  for (std::size_t i = 0; i < 4; ++i) {
    const detail::DcpTensorEntry& entry = decoded.tensors[i];
    EXPECT_EQ(entry.dtype, dtypes[i]);
    EXPECT_EQ(entry.size, sizes[i]);
    ASSERT_EQ(entry.chunks.size(), 1u);
    EXPECT_EQ(entry.chunks[0].sizes, sizes[i]);
    EXPECT_EQ(entry.chunks[0].offsets, Shape(sizes[i].size(), 0));
    EXPECT_EQ(entry.chunks[0].storage.offset, offset);
    offset += 1200;
  }
  ASSERT_EQ(decoded.bytes_items.size(), 1u);
  EXPECT_EQ(decoded.bytes_items[0].fqn, "step");
  EXPECT_EQ(decoded.bytes_items[0].storage.relative_path, "__1_0.distcp");
  EXPECT_EQ(decoded.bytes_items[0].storage.length, 1100u);
}

TEST(DcpMetadata, RefusesWhatItCannotRead) {
  const std::vector<std::pair<const char*, const char*>> cases{
      {"metadata_complex64.pkl", "dtype torch.complex64"},
      {"metadata_sparse.pkl", "layout 'torch.sparse_coo'"},
      {"metadata_transform.pkl", "transforms 'stream.zstd/1'"},
      {"metadata_missing_storage.pkl", "no storage_data for 'w' at offset [4, 0]"},
      {"metadata_extra_storage.pkl", "storage_data for 'w' at offset [8, 0], which names no"},
      {"metadata_rank_mismatch.pkl", "offsets [4, 0, 0] and sizes [4, 4, 1]"},
      {"metadata_negative_size.pkl", "size -4; it must lie in [0, 2^62]"},
      {"metadata_path_escape.pkl", "relative_path '../../etc/passwd'; it must name a file inside"},
  };
  for (const auto& [name, expected] : cases) {
    SCOPED_TRACE(name);
    const std::string pickle = vector_file(name);
    EXPECT_NE(error_of([&] { metadata(pickle); }).find(expected), std::string::npos)
        << error_of([&] { metadata(pickle); });
  }
}

TEST(DcpMetadata, RefusesEveryPrefixOfTorchsExample) {
  const std::string whole = example(".metadata");
  for (std::size_t length = 0; length < whole.size(); ++length) {
    const std::string message = error_of([&] { metadata(whole.substr(0, length)); });
    EXPECT_NE(message.find("'.metadata'"), std::string::npos) << length;
  }
}

TEST(DcpMetadata, RefusesADataPickleAndItsGlobals) {
  const std::string message = error_of([&] { metadata(vector_file("data_v2_f32.pkl")); });
  EXPECT_NE(message.find("global torch._utils._rebuild_tensor_v2"), std::string::npos) << message;
}

TEST(DcpDataPickle, TorchsChunkRebuildsAFloatTensor) {
  for (const char* name : {"__0_0.distcp", "__1_0.distcp"}) {
    const detail::TorchTensorRecord record = tensor(data_pkl_of(example(name)));
    EXPECT_EQ(record.storage_key, "0");
    EXPECT_EQ(record.dtype, io::Dtype::F32);
    EXPECT_EQ(record.storage_bytes, 64u);
    EXPECT_EQ(record.storage_offset, 0);
    EXPECT_EQ(record.size, (Shape{4, 4}));
    EXPECT_EQ(record.stride, (Shape{4, 1}));
  }
}

TEST(DcpDataPickle, ReadsStridesEmptyTensorsAndUntypedStorages) {
  const detail::TorchTensorRecord transposed = tensor(vector_file("data_v2_transposed.pkl"));
  EXPECT_EQ(transposed.size, (Shape{4, 8}));
  EXPECT_EQ(transposed.stride, (Shape{1, 4}));
  EXPECT_EQ(transposed.storage_bytes, 128u);
  const detail::TorchTensorRecord empty = tensor(vector_file("data_v2_empty.pkl"));
  EXPECT_EQ(empty.size, (Shape{0, 4}));
  EXPECT_EQ(empty.storage_bytes, 0u);
  // _rebuild_tensor_v3: an UntypedStorage counts bytes, the dtype comes last.
  const detail::TorchTensorRecord fp8 = tensor(vector_file("data_v3_fp8.pkl"));
  EXPECT_EQ(fp8.dtype, io::Dtype::F8_E4M3);
  EXPECT_EQ(fp8.storage_bytes, 12u);
  EXPECT_EQ(fp8.storage_offset, 2);
  EXPECT_EQ(fp8.size, (Shape{2, 5}));
  EXPECT_EQ(fp8.stride, (Shape{5, 1}));
}

TEST(DcpDataPickle, RefusesTensorsOutsideTheirStorage) {
  const std::vector<std::pair<const char*, const char*>> cases{
      {"data_stride_past_storage.pkl",
       "size [4, 4] and stride [5, 1] at storage offset 0, which reaches past its storage '0' "
       "of 16 elements"},
      {"data_negative_stride.pkl", "stride -4; it must lie in [0, 2^62]"},
      {"data_v3_complex64.pkl", "dtype torch.complex64"},
      {"bytes_int.pkl", "holds an int, not a tensor"},
  };
  for (const auto& [name, expected] : cases) {
    SCOPED_TRACE(name);
    const std::string pickle = vector_file(name);
    EXPECT_NE(error_of([&] { tensor(pickle); }).find(expected), std::string::npos)
        << error_of([&] { tensor(pickle); });
  }
}

TEST(DcpDataPickle, RendersBytesItemsAsPythonPrintsThem) {
  EXPECT_EQ(item_text(vector_file("bytes_int.pkl")), "7");
  EXPECT_EQ(item_text(vector_file("bytes_lr.pkl")), "0.001");
  EXPECT_EQ(item_text(vector_file("bytes_group.pkl")),
            "{\"lr\": 0.001, \"betas\": (0.9, 0.999), \"foreach\": None, \"params\": [0, 1, 2], "
            "\"name\": \"adamw\", \"amsgrad\": False, \"eps\": 1.0}");
  EXPECT_EQ(detail::parse_bytes_item_pickle(bytes_of(vector_file("bytes_group.pkl")), "x", 10),
            "{\"lr\": 0.0...");
  // Protocol 2 pickles a set as __builtin__.set(list); protocol 4 with EMPTY_SET and ADDITEMS.
  EXPECT_NE(
      error_of([] { item_text(vector_file("bytes_set.pkl")); }).find("global __builtin__.set"),
      std::string::npos);
  EXPECT_NE(error_of([] { item_text("\x80\x04\x8f(K\x01\x90."); }).find("holds a set"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              item_text(vector_file("data_v2_f32.pkl"));
            }).find("holds an object of torch._utils._rebuild_tensor_v2"),
            std::string::npos);
}

TEST(DcpPickle, RefusesGlobalsThatWouldRunCode) {
  const std::vector<std::pair<const char*, const char*>> cases{
      {"evil_os_system.pkl", "names the global os.system"},
      {"evil_builtins_eval.pkl", "names the global builtins.eval"},
      {"evil_subprocess_popen.pkl", "names the global subprocess.Popen"},
  };
  for (const auto& [name, expected] : cases) {
    SCOPED_TRACE(name);
    const std::string pickle = vector_file(name);
    EXPECT_NE(error_of([&] { metadata(pickle); }).find(expected), std::string::npos);
    EXPECT_NE(error_of([&] { tensor(pickle); }).find(expected), std::string::npos);
    EXPECT_NE(error_of([&] { item_text(pickle); }).find(expected), std::string::npos);
  }
  EXPECT_FALSE(std::filesystem::exists("/tmp/kshard-pwn"));
}

TEST(DcpPickle, RefusesHostileAndBrokenPickles) {
  const std::vector<std::pair<const char*, const char*>> cases{
      {"deep_tuples.pkl", "nests values 257 deep; kshard reads at most 256"},
      {"deep_marks.pkl", "opens MARK number 257"},
      {"deep_lists.pkl", "nests values 257 deep"},
      {"memo_miss.pkl", "gets memo entry 16777216, which was never put"},
      {"long4_2g.pkl", "0x8b (LONG4) at byte 2 holds an integer of 2147483648 bytes"},
      {"long1_9_bytes.pkl", "integer of 9 bytes"},
      {"unicode_past_end.pkl", "needs 1099511627776 more bytes; the input has 4"},
      {"unknown_opcode_int.pkl", "opcode 0x49 (INT) at byte 2"},
      {"unknown_opcode_ff.pkl", "opcode 0xff at byte 3"},
      {"protocol_1.pkl", "asks for protocol 1"},
      {"recursive_list.pkl", "puts a value inside itself"},
      {"no_stop.pkl", "ends at byte 3 without a STOP opcode"},
  };
  for (const auto& [name, expected] : cases) {
    SCOPED_TRACE(name);
    const std::string pickle = vector_file(name);
    const std::string message = error_of([&] { item_text(pickle); });
    EXPECT_NE(message.find(expected), std::string::npos) << message;
  }
}

TEST(DcpPickle, AHugeMemoIndexTakesNoMemory) {
  const std::string pickle = vector_file("huge_memo.pkl");
  EXPECT_EQ(item_text(pickle), "None");
}

TEST(DcpPickle, SharedValuesStayShared) {
  // A tuple of two references to one tuple, 200 times over: 2^200 leaves as a tree, 201 values.
  std::string pickle = "\x80\x04N\x85";
  for (int i = 0; i < 200; ++i) pickle += "\x94h" + std::string(1, static_cast<char>(i)) + "\x86";
  pickle += '.';
  const detail::PickleDocument document =
      detail::unpickle(bytes_of(pickle), detail::torch_save_globals, "shared");
  EXPECT_LE(document.values.size(), 202u);
  EXPECT_EQ(document.values[document.root].depth, 202u);
  EXPECT_EQ(detail::parse_bytes_item_pickle(bytes_of(pickle), "shared", 12), "((((((((((((...");
}

}  // namespace
