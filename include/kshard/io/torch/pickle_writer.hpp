#pragma once

// The pickles a torch writer emits, at protocol 2 (every torch reads it; spec section 1.8): a
// protocol-2 pickle opcode by opcode (`PickleWriter`: objects built as torch's own pickles build
// them, NEWOBJ then BUILD with the fields), and a torch.save archive's `data.pkl`
// (_rebuild_tensor_v2 over a typed storage, or _rebuild_tensor_v3 over an untyped one for dtypes
// without a typed storage class). No memo: repeated globals are written again, which every
// unpickler accepts.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kshard/io/engine/box_runs.hpp"
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

}  // namespace kshard::detail
