#pragma once

// The `data.pkl` of a torch.save archive, as DCP writes one per item of a `.distcp` file: a
// tensor item rebuilds one tensor from a storage of the archive
// (`torch._utils._rebuild_tensor_v2(PERSID(('storage', torch.FloatStorage, '0', 'cpu', numel)),
// offset, size, stride, requires_grad, OrderedDict())`, or `_rebuild_tensor_v3` with a
// `torch.storage.UntypedStorage` of NBYTES and the dtype last for dtypes without a typed storage
// class); a bytes item holds a plain Python value. Pure parsing, no I/O: the fuzzer runs it as it
// is. Also the torch dtype names both this and DCP's `.metadata` use.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kshard/io/model/dtype.hpp"
#include "kshard/io/model/messages.hpp"
#include "kshard/io/torch/pickle.hpp"

namespace kshard::detail {

// A torch dtype kshard reads: its name after "torch.", its kshard dtype, and its legacy typed
// storage class in module torch (empty where torch has none and writes _rebuild_tensor_v3).
struct TorchDtype {
  std::string_view name;
  io::Dtype dtype;
  std::string_view storage;
};
inline constexpr std::array<TorchDtype, 16> torch_dtypes{{
    {"float64", io::Dtype::F64, "DoubleStorage"},
    {"float32", io::Dtype::F32, "FloatStorage"},
    {"float16", io::Dtype::F16, "HalfStorage"},
    {"bfloat16", io::Dtype::BF16, "BFloat16Storage"},
    {"int64", io::Dtype::I64, "LongStorage"},
    {"int32", io::Dtype::I32, "IntStorage"},
    {"int16", io::Dtype::I16, "ShortStorage"},
    {"int8", io::Dtype::I8, "CharStorage"},
    {"uint8", io::Dtype::U8, "ByteStorage"},
    {"bool", io::Dtype::BOOL, "BoolStorage"},
    {"float8_e4m3fn", io::Dtype::F8_E4M3, ""},
    {"float8_e5m2", io::Dtype::F8_E5M2, ""},
    {"uint16", io::Dtype::U16, ""},
    {"uint32", io::Dtype::U32, ""},
    {"uint64", io::Dtype::U64, ""},
    {"float8_e8m0fnu", io::Dtype::F8_E8M0, ""},
}};

// Torch dtypes kshard has no dtype for: a pickle may name them (so that the refusal names the
// dtype, not an unknown global), the typed pass refuses them.
inline constexpr std::array<std::string_view, 13> torch_other_dtypes{
    "complex32",        "complex64", "complex128", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "float4_e2m1fn_x2", "qint8",     "quint8",     "qint32",          "quint4x2",
    "quint2x4",         "bits8",     "bits16"};

// The globals `torch.<dtype>` of both lists.
inline constexpr std::array<PickleGlobalName, 29> torch_dtype_globals = [] {
  std::array<PickleGlobalName, 29> globals{};
  std::size_t next = 0;
  for (const TorchDtype& dtype : torch_dtypes) globals[next++] = {"torch", dtype.name};
  for (const std::string_view name : torch_other_dtypes) globals[next++] = {"torch", name};
  return globals;
}();

// `first` then `second`: allow-lists made of parts.
template <std::size_t A, std::size_t B>
constexpr std::array<PickleGlobalName, A + B> joined_globals(
    const std::array<PickleGlobalName, A>& first, const std::array<PickleGlobalName, B>& second) {
  std::array<PickleGlobalName, A + B> globals{};
  for (std::size_t i = 0; i < A; ++i) globals[i] = first[i];
  for (std::size_t i = 0; i < B; ++i) globals[A + i] = second[i];
  return globals;
}

// The entry of torch_dtypes for `torch.<name>`, or nullptr.
inline const TorchDtype* find_torch_dtype(std::string_view name) {
  for (const TorchDtype& dtype : torch_dtypes)
    if (dtype.name == name) return &dtype;
  return nullptr;
}

// The entry of torch_dtypes whose typed storage class is `storage`, or nullptr.
inline const TorchDtype* storage_dtype(const PickleGlobal& storage) {
  for (const TorchDtype& dtype : torch_dtypes)
    if (storage.module == "torch" && !dtype.storage.empty() && dtype.storage == storage.name)
      return &dtype;
  return nullptr;
}

// The kshard dtype of the torch dtype `torch.<name>`; refuses any other, naming it.
inline io::Dtype torch_dtype(std::string_view name, std::string_view source) {
  if (const TorchDtype* dtype = find_torch_dtype(name)) return dtype->dtype;
  throw_io_error(
      source, " has a tensor of dtype torch.", printable(name, 64),
      ", which kshard does not read (it reads float64, float32, float16, bfloat16, "
      "int64, int32, int16, int8, uint8, bool, float8_e4m3fn, float8_e5m2, float8_e8m0fnu "
      "and "
      "uint16/32/64)");
}

// The globals a data.pkl may name.
inline constexpr std::array<PickleGlobalName, 14> torch_save_classes{{
    {"torch._utils", "_rebuild_tensor_v2"},
    {"torch._utils", "_rebuild_tensor_v3"},
    {"torch.storage", "UntypedStorage"},
    {"collections", "OrderedDict"},
    {"torch", "DoubleStorage"},
    {"torch", "FloatStorage"},
    {"torch", "HalfStorage"},
    {"torch", "BFloat16Storage"},
    {"torch", "LongStorage"},
    {"torch", "IntStorage"},
    {"torch", "ShortStorage"},
    {"torch", "CharStorage"},
    {"torch", "ByteStorage"},
    {"torch", "BoolStorage"},
}};
inline constexpr auto torch_save_globals = joined_globals(torch_save_classes, torch_dtype_globals);

// One tensor of a torch.save archive: its elements are those of `dtype` at
// storage_offset + sum(i_d * stride[d]) in the archive's entry `data/<storage_key>`.
struct TorchTensorRecord {
  std::string storage_key;
  io::Dtype dtype = io::Dtype::F32;
  std::uint64_t storage_bytes = 0;  // the storage's length; holds every element the tensor reaches
  std::int64_t storage_offset = 0;  // in elements
  std::vector<std::int64_t> size;
  std::vector<std::int64_t> stride;  // in elements, each >= 0
};

// What a value may be in a tensor record: an int in [0, 2^62].
inline constexpr std::int64_t torch_save_limit = std::int64_t{1} << 62;

// Reads a rebuild call's arguments into a TorchTensorRecord.
class TorchTensorReader {
 public:
  TorchTensorReader(const PickleDocument& document, std::string_view source)
      : document_(document), source_(source) {}

  TorchTensorRecord read() {
    const auto* call = document_.get<PickleObject>(document_.root);
    const PickleGlobal* rebuild = call ? &object_global(document_, *call) : nullptr;
    const bool v3 = rebuild && rebuild->name == "_rebuild_tensor_v3";
    if (rebuild == nullptr || rebuild->module != "torch._utils" ||
        (rebuild->name != "_rebuild_tensor_v2" && !v3))
      fail("holds ", pickle_value_kind(document_, document_.root),
           ", not a tensor rebuilt by torch._utils._rebuild_tensor_v2 or _v3");
    const auto& args = document_.get<PickleTuple>(call->args)->items;
    const std::size_t needed = v3 ? 7 : 6;
    if (args.size() != needed && args.size() != needed + 1)
      fail("calls ", global_text(*rebuild), " with ", args.size(), " arguments; it takes ", needed,
           " or ", needed + 1);
    TorchTensorRecord record;
    const std::string_view dtype_name = v3 ? dtype_argument(args[6]) : std::string_view{};
    read_storage(args[0], dtype_name, record);
    record.storage_offset = number(args[1], "storage offset");
    record.size = numbers(args[2], "size");
    record.stride = numbers(args[3], "stride");
    check_extent(record);
    return record;
  }

 private:
  const PickleDocument& document_;
  std::string_view source_;

  template <class... Pieces>
  [[noreturn]] void fail(const Pieces&... pieces) const {
    throw_io_error(source_, " ", pieces...);
  }

  std::int64_t number(PickleId id, std::string_view what) const {
    const auto* value = document_.get<std::int64_t>(id);
    if (value == nullptr) fail("has ", pickle_value_kind(document_, id), " for its ", what);
    if (*value < 0 || *value > torch_save_limit)
      fail("has the ", what, " ", *value, "; it must lie in [0, 2^62]");
    return *value;
  }

  std::vector<std::int64_t> numbers(PickleId id, std::string_view what) const {
    const auto* items = document_.get<PickleTuple>(id);
    if (items == nullptr) fail("has ", pickle_value_kind(document_, id), " for its ", what);
    std::vector<std::int64_t> values;
    for (const PickleId item : items->items) values.push_back(number(item, what));
    return values;
  }

  std::string_view dtype_argument(PickleId id) const {
    const auto* global = document_.get<PickleGlobal>(id);
    if (global == nullptr || global->module != "torch")
      fail("has ", pickle_value_kind(document_, id), " for its dtype");
    return global->name;
  }

  // The persistent id ('storage', class, key, location, count): typed storages count elements,
  // torch.storage.UntypedStorage counts bytes and needs the dtype of _rebuild_tensor_v3.
  void read_storage(PickleId id, std::string_view dtype_name, TorchTensorRecord& record) const {
    const auto* pid = document_.get<PicklePersistentId>(id);
    const auto* fields = pid ? document_.get<PickleTuple>(pid->value) : nullptr;
    const auto* tag = fields && fields->items.size() == 5
                          ? document_.get<std::string>(fields->items[0])
                          : nullptr;
    const auto* key = tag ? document_.get<std::string>(fields->items[2]) : nullptr;
    const auto* storage = key ? document_.get<PickleGlobal>(fields->items[1]) : nullptr;
    if (storage == nullptr || *tag != "storage")
      fail("has ", pickle_value_kind(document_, id),
           " for its storage; it needs a persistent "
           "id ('storage', storage class, key, location, count)");
    const bool untyped = storage->module == "torch.storage";
    if (untyped && dtype_name.empty())
      fail("rebuilds a tensor of an untyped storage without a dtype");
    const TorchDtype* dtype = untyped ? find_torch_dtype(dtype_name) : storage_dtype(*storage);
    if (dtype == nullptr && untyped) torch_dtype(dtype_name, source_);  // refuses, naming it
    if (dtype == nullptr) fail("has the storage class ", global_text(*storage));
    if (!dtype_name.empty() && dtype->name != dtype_name)
      fail("rebuilds a torch.", printable(dtype_name, 64), " tensor of a ", global_text(*storage));
    const std::int64_t count = number(fields->items[4], "storage length");
    const std::uint64_t element = untyped ? 1 : io::dtype_size(dtype->dtype);
    if (static_cast<std::uint64_t>(count) > static_cast<std::uint64_t>(torch_save_limit) / element)
      fail("has a storage of ", count, " ", dtype->name, " elements; at most 2^62 bytes");
    record.storage_key = *key;
    record.dtype = dtype->dtype;
    record.storage_bytes = static_cast<std::uint64_t>(count) * element;
  }

  // Refuses a size and stride that reach outside the storage: the last element is
  // storage_offset + sum((size[d] - 1) * stride[d]); an empty tensor reaches none.
  void check_extent(const TorchTensorRecord& record) const {
    if (record.size.size() != record.stride.size())
      fail("rebuilds a tensor of size ", io::shape_text(record.size), " with stride ",
           io::shape_text(record.stride), " of another rank");
    const auto elements =
        static_cast<std::int64_t>(record.storage_bytes / io::dtype_size(record.dtype));
    const bool empty = std::find(record.size.begin(), record.size.end(), 0) != record.size.end();
    std::int64_t last = record.storage_offset;
    bool past = empty ? last > elements : last >= elements;
    for (std::size_t d = 0; d < record.size.size() && !past && !empty; ++d) {
      std::int64_t step = 0;
      past = __builtin_mul_overflow(record.size[d] - 1, record.stride[d], &step) ||
             __builtin_add_overflow(last, step, &last) || last >= elements;
    }
    if (past)
      fail("rebuilds a tensor of size ", io::shape_text(record.size), " and stride ",
           io::shape_text(record.stride), " at storage offset ", record.storage_offset,
           ", which reaches past its storage ", in_quotes(record.storage_key), " of ", elements,
           " elements");
  }
};

// The tensor the data.pkl pickle `input` rebuilds; `source` names it in messages. Throws
// kshard::error for anything else, and for a size and stride that reach outside the storage.
inline TorchTensorRecord parse_torch_tensor_pickle(std::span<const std::byte> input,
                                                   std::string_view source) {
  const PickleDocument document = unpickle(input, torch_save_globals, source);
  return TorchTensorReader(document, source).read();
}

// Renders a bytes item's value as Python would print it, at most `limit` characters of it
// (then "..."): None, bools, ints, floats, strs, and tuples, lists, dicts and OrderedDicts of
// them; anything else is refused.
class PickleValueText {
 public:
  PickleValueText(const PickleDocument& document, std::string_view source, std::size_t limit)
      : document_(document), source_(source), limit_(limit) {}

  std::string text() {
    check_all();
    render(document_.root);
    if (out_.size() > limit_) {
      out_.resize(limit_);
      out_ += "...";
    }
    return out_;
  }

 private:
  const PickleDocument& document_;
  std::string_view source_;
  std::size_t limit_;
  std::string out_;

  static bool is_scalar(const PickleData& data) {
    return std::holds_alternative<PickleNone>(data) || std::holds_alternative<bool>(data) ||
           std::holds_alternative<std::int64_t>(data) || std::holds_alternative<double>(data) ||
           std::holds_alternative<std::string>(data);
  }

  static bool is_ordered_dict(const PickleDocument& document, const PickleObject& object) {
    const PickleGlobal& global = object_global(document, object);
    return global.module == "collections" && global.name == "OrderedDict" &&
           document.get<PickleTuple>(object.args)->items.empty() && !object.state && !object.kwargs;
  }

  // Refuses the value if anything it holds is not a plain value; each value is looked at
  // once, however often the memo shares it.
  void check_all() const {
    std::vector<bool> seen(document_.values.size(), false);
    std::vector<PickleId> next{document_.root};
    const auto visit = [&](PickleId id) {
      if (!seen[id]) next.push_back(id);
      seen[id] = true;
    };
    while (!next.empty()) {
      const PickleId id = next.back();
      next.pop_back();
      const PickleData& data = document_.at(id);
      const auto* object = std::get_if<PickleObject>(&data);
      const auto* dict = std::get_if<PickleDict>(&data);
      const bool ordered_dict = object && is_ordered_dict(document_, *object);
      if (const auto* items = pickle_sequence(document_, id))
        for (const PickleId item : *items) visit(item);
      if (dict || ordered_dict)
        for (const auto& [key, value] : dict ? dict->items : object->items) {
          visit(key);
          visit(value);
        }
      if (!is_scalar(data) && !pickle_sequence(document_, id) && !dict && !ordered_dict)
        throw_io_error(source_, " holds ", pickle_value_kind(document_, id),
                       "; kshard lists bytes items of None, bool, int, float, str and tuples, "
                       "lists and dicts of them");
    }
  }

  void render_float(double value) {
    std::string text = fmt::format("{}", value);
    if (text.find_first_of(".eni") == std::string::npos) text += ".0";
    out_ += text;
  }

  void render_pairs(const std::vector<std::pair<PickleId, PickleId>>& pairs) {
    out_ += '{';
    for (std::size_t i = 0; i < pairs.size() && out_.size() <= limit_; ++i) {
      if (i > 0) out_ += ", ";
      render(pairs[i].first);
      out_ += ": ";
      render(pairs[i].second);
    }
    out_ += '}';
  }

  void render_items(const std::vector<PickleId>& items, bool tuple) {
    out_ += tuple ? '(' : '[';
    for (std::size_t i = 0; i < items.size() && out_.size() <= limit_; ++i) {
      if (i > 0) out_ += ", ";
      render(items[i]);
    }
    if (tuple && items.size() == 1) out_ += ',';
    out_ += tuple ? ')' : ']';
  }

  void render(PickleId id) {
    if (out_.size() > limit_) return;
    const PickleData& data = document_.at(id);
    if (std::holds_alternative<PickleNone>(data)) out_ += "None";
    if (const auto* flag = std::get_if<bool>(&data)) out_ += *flag ? "True" : "False";
    if (const auto* number = std::get_if<std::int64_t>(&data)) out_ += std::to_string(*number);
    if (const auto* number = std::get_if<double>(&data)) render_float(*number);
    if (const auto* str = std::get_if<std::string>(&data))
      out_ += nlohmann::json(str->substr(0, limit_))
                  .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (const auto* tuple = std::get_if<PickleTuple>(&data)) render_items(tuple->items, true);
    if (const auto* list = std::get_if<PickleList>(&data)) render_items(list->items, false);
    if (const auto* dict = std::get_if<PickleDict>(&data)) render_pairs(dict->items);
    if (const auto* object = std::get_if<PickleObject>(&data)) {
      out_ += "OrderedDict(";
      render_pairs(object->items);
      out_ += ')';
    }
  }
};

// The value of the bytes item whose data.pkl is `input`, as Python prints it (strings in double
// quotes), at most `limit` characters (then "..."); refuses anything but plain values.
inline std::string parse_bytes_item_pickle(std::span<const std::byte> input,
                                           std::string_view source, std::size_t limit = 256) {
  const PickleDocument document = unpickle(input, torch_save_globals, source);
  return PickleValueText(document, source, limit).text();
}

}  // namespace kshard::detail
