#pragma once

/// \file
/// The header of a safetensors file (https://github.com/huggingface/safetensors): an 8-byte
/// little-endian length N, N bytes of JSON naming each tensor's dtype, shape and byte range,
/// then the data section. The reader is meant for files from anywhere: it checks everything the
/// reference implementation's `validate` checks, and more (duplicate names or fields, unknown
/// fields), trusts no size before comparing it with the file size, and holds only what it keeps
/// (the JSON is read as a stream, never as a document tree): peak memory stays under 10 times
/// the header length even for a header of millions of shape entries or metadata keys.
///
/// Reading takes two steps, so that a reader touches only the header of a large file:
///
///     std::array<std::byte, 8> prefix = read(file, 0, 8);
///     auto n = kshard::io::header_length_from_prefix(prefix, file_size);
///     auto header = kshard::io::parse_safetensors_header(read(file, 8, n), file_size);
///
/// Writing: `make_safetensors_header` lays tensors out back to back and
/// `serialize_safetensors_header` gives the bytes that start the file; the data section follows.

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kshard/error.hpp"
#include "kshard/io/model/dtype.hpp"
#include "kshard/io/model/messages.hpp"

namespace kshard::io {

/// The largest header length N the reference implementation reads (its MAX_HEADER_SIZE).
inline constexpr std::uint64_t max_safetensors_header_length = 100'000'000;

/// One tensor of a safetensors header.
struct TensorEntry {
  std::string name;                 ///< its key in the header
  Dtype dtype = Dtype::U8;          ///< element type
  std::vector<std::int64_t> shape;  ///< extents, row-major; empty for a scalar
  std::uint64_t begin = 0;          ///< first byte, relative to the start of the data section
  std::uint64_t end = 0;            ///< one past the last byte, relative to the data section

  /// The product of the shape (1 for a scalar); throws kshard::error for a negative entry or
  /// a product past INT64_MAX, which a parsed header never has.
  [[nodiscard]] std::int64_t elements() const { return detail::element_count(name, shape); }
  /// elements() times dtype_size(dtype); equals end - begin in a parsed header.
  [[nodiscard]] std::uint64_t bytes() const { return detail::byte_count(name, dtype, shape); }
  /// Equal when every field is.
  friend bool operator==(const TensorEntry&, const TensorEntry&) = default;
};

/// A validated safetensors header: where the data section lies in the file and which tensor
/// owns each of its bytes.
struct SafetensorsHeader {
  std::uint64_t header_length = 0;  ///< N: bytes of JSON after the 8-byte prefix, padding included
  std::uint64_t data_offset = 8;    ///< where the data section begins in the file: 8 + N
  std::uint64_t data_size = 0;      ///< bytes in the data section: file size - data_offset
  std::map<std::string, std::string> metadata;  ///< the "__metadata__" object, if any
  /// Sorted by begin (ties, which only empty tensors can have, by end, then header order);
  /// each begins where the previous one ends, the first at 0, the last ends at data_size.
  std::vector<TensorEntry> tensors;

  /// The tensor called `name`, or nullptr; a linear search.
  [[nodiscard]] const TensorEntry* find(std::string_view name) const {
    const auto it = std::find_if(tensors.begin(), tensors.end(),
                                 [name](const TensorEntry& tensor) { return tensor.name == name; });
    return it == tensors.end() ? nullptr : &*it;
  }
  /// Equal when every field is.
  friend bool operator==(const SafetensorsHeader&, const SafetensorsHeader&) = default;
};

/// A tensor to lay out in a new file (make_safetensors_header).
struct TensorSpec {
  std::string name;                 ///< its key in the header
  Dtype dtype = Dtype::U8;          ///< element type
  std::vector<std::int64_t> shape;  ///< extents, row-major; empty for a scalar
};

}  // namespace kshard::io

namespace kshard::detail {

/// The key under which a header keeps its string-to-string metadata.
inline constexpr std::string_view metadata_key = "__metadata__";

/// Refuses a header length over the cap or past the end of a file of `file_size` bytes.
inline void check_header_length(std::uint64_t length, std::uint64_t file_size) {
  if (file_size < 8)
    throw_io_error("the file has ", file_size,
                   " bytes, fewer than the 8 of the header length prefix");
  if (length > io::max_safetensors_header_length)
    throw_io_error("the header length is ", length, " bytes, over the limit of ",
                   io::max_safetensors_header_length);
  if (length > file_size - 8)
    throw_io_error("the header length is ", length, " bytes, but the file has ", file_size,
                   " bytes: only ", file_size - 8, " after the 8-byte prefix");
}

/// Which field of a tensor's object the reader is in.
enum class HeaderField : std::uint8_t { dtype, shape, data_offsets, none };

/// The keys of a tensor's fields, in HeaderField order.
inline constexpr std::array<std::string_view, 3> field_keys{"dtype", "shape", "data_offsets"};

/// The field called `key`; throws for anything but the three a tensor has.
inline HeaderField field_named(std::string_view tensor, std::string_view key) {
  const auto it = std::find(field_keys.begin(), field_keys.end(), key);
  if (it != field_keys.end()) return static_cast<HeaderField>(it - field_keys.begin());
  throw_io_error("tensor ", in_quotes(tensor), " has an unknown field ", in_quotes(key),
                 "; a tensor has exactly dtype, shape and data_offsets");
}

/// The JSON as a stream of nlohmann SAX events, checked against the header's schema at each
/// event: the reader never holds more than the header's own values, and stops at the first
/// value out of place, whatever follows it.
class HeaderReader {
 public:
  using json = nlohmann::json;

  /// Reads `text` (the N header bytes); throws kshard::error at the first flaw.
  void read(std::span<const char> text) {
    // Every handler returns true or throws, so sax_parse's result says nothing more.
    static_cast<void>(json::sax_parse(text.data(), text.data() + text.size(), this,
                                      json::input_format_t::json,
                                      /*strict: nothing but whitespace after the object*/ true,
                                      /*ignore_comments*/ false));
  }
  /// The metadata, once read.
  std::map<std::string, std::string>& metadata() { return metadata_; }
  /// The tensors in header order, once read.
  std::vector<io::TensorEntry>& tensors() { return tensors_; }

  // The SAX interface nlohmann::json::sax_parse calls.
  bool null() { unexpected("null"); }
  bool boolean(bool) { unexpected("a boolean"); }
  bool number_integer(json::number_integer_t value);
  bool number_unsigned(json::number_unsigned_t value);
  bool number_float(json::number_float_t, const json::string_t& text);
  bool string(json::string_t& value);
  bool binary(json::binary_t&) { unexpected("binary data"); }
  bool start_object(std::size_t);
  bool key(json::string_t& key);
  bool end_object();
  bool start_array(std::size_t);
  bool end_array();
  bool parse_error(std::size_t position, const std::string&, const json::exception& error);

 private:
  // Where the reader is: the states nest as the header's schema does.
  enum class Where : std::uint8_t { start, header, metadata, tensor, shape, data_offsets, end };

  [[noreturn]] void unexpected(std::string_view what) const;
  [[noreturn]] void non_negative_integer_expected(std::string_view what) const;
  void start_tensor();
  void finish_tensor();
  void add_number(std::uint64_t value);

  Where where_ = Where::start;
  std::string key_;  // the last key read in the header or metadata object
  bool metadata_seen_ = false;
  std::map<std::string, std::string> metadata_;
  std::vector<io::TensorEntry> tensors_;
  // The tensor being read: its fields so far and which of them were present.
  io::TensorEntry tensor_;
  std::array<bool, 3> has_field_{};
  HeaderField field_ = HeaderField::none;
  std::size_t offsets_read_ = 0;
};

inline void HeaderReader::unexpected(std::string_view what) const {
  switch (where_) {
    case Where::start:
      throw_io_error("the header is ", what, ", not a JSON object");
    case Where::header:
      if (key_ == metadata_key)
        throw_io_error("__metadata__ is ", what, ", not an object of strings");
      throw_io_error("tensor ", in_quotes(key_), " is ", what,
                     ", not an object with dtype, shape and data_offsets");
    case Where::metadata:
      throw_io_error("__metadata__ value ", in_quotes(key_), " is ", what, ", not a string");
    case Where::tensor:
      throw_io_error(
          "the ", field_keys[static_cast<std::size_t>(field_)], " of tensor ",
          in_quotes(tensor_.name), " is ", what, ", not ",
          field_ == HeaderField::dtype ? "a string" : "an array of non-negative integers");
    case Where::shape:
    case Where::data_offsets:
      non_negative_integer_expected(what);
    case Where::end:
      break;
  }
  throw_io_error("the header has ", what, " where no value belongs");
}

inline void HeaderReader::non_negative_integer_expected(std::string_view what) const {
  const bool shape = where_ == Where::shape;
  throw_io_error("tensor ", in_quotes(tensor_.name), " has ", shape ? "shape" : "data_offsets",
                 " entry ", shape ? tensor_.shape.size() : offsets_read_, " that is ", what,
                 ", not a non-negative integer");
}

inline bool HeaderReader::number_integer(json::number_integer_t value) {
  // nlohmann reports non-negative integers through number_unsigned, except "-0".
  if (value < 0 && (where_ == Where::shape || where_ == Where::data_offsets))
    non_negative_integer_expected(std::to_string(value));
  if (value < 0) unexpected("a number");
  return number_unsigned(static_cast<json::number_unsigned_t>(value));
}

inline bool HeaderReader::number_unsigned(json::number_unsigned_t value) {
  if (where_ != Where::shape && where_ != Where::data_offsets) unexpected("a number");
  add_number(value);
  return true;
}

inline bool HeaderReader::number_float(json::number_float_t, const json::string_t& text) {
  if (where_ != Where::shape && where_ != Where::data_offsets) unexpected("a number");
  // Integers past UINT64_MAX come here too: nlohmann reads them as floating point.
  non_negative_integer_expected(in_quotes(text, 24));
}

inline void HeaderReader::add_number(std::uint64_t value) {
  if (where_ == Where::data_offsets) {
    if (offsets_read_ == 2)
      throw_io_error("tensor ", in_quotes(tensor_.name),
                     " has more than 2 data_offsets; it needs [begin, end]");
    (offsets_read_++ == 0 ? tensor_.begin : tensor_.end) = value;
    return;
  }
  constexpr auto max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  if (value > max)
    throw_io_error("tensor ", in_quotes(tensor_.name), " has shape entry ", value, " at dimension ",
                   tensor_.shape.size(), ", over INT64_MAX = ", max);
  tensor_.shape.push_back(static_cast<std::int64_t>(value));
}

inline bool HeaderReader::string(json::string_t& value) {
  if (where_ == Where::metadata) {
    if (!metadata_.try_emplace(std::move(key_), std::move(value)).second)
      throw_io_error("__metadata__ has the key ", in_quotes(key_), " twice");
    return true;
  }
  if (where_ != Where::tensor || field_ != HeaderField::dtype) unexpected("a string");
  const DtypeInfo* info = find_dtype(value);
  if (info == nullptr)
    throw_io_error("tensor ", in_quotes(tensor_.name), " has ", unknown_dtype(value));
  tensor_.dtype = info->dtype;
  return true;
}

inline bool HeaderReader::start_object(std::size_t) {
  if (where_ == Where::start) {
    where_ = Where::header;
  } else if (where_ == Where::header && key_ == metadata_key) {
    if (metadata_seen_) throw_io_error("the header has __metadata__ twice");
    metadata_seen_ = true;
    where_ = Where::metadata;
  } else if (where_ == Where::header) {
    start_tensor();
  } else {
    unexpected("an object");
  }
  return true;
}

inline void HeaderReader::start_tensor() {
  tensor_ = io::TensorEntry{};
  tensor_.name = std::move(key_);
  has_field_ = {};
  field_ = HeaderField::none;
  offsets_read_ = 0;
  where_ = Where::tensor;
}

inline bool HeaderReader::key(json::string_t& key) {
  if (where_ != Where::tensor) {
    key_ = std::move(key);
    return true;
  }
  field_ = field_named(tensor_.name, key);
  auto& seen = has_field_[static_cast<std::size_t>(field_)];
  if (seen)
    throw_io_error("tensor ", in_quotes(tensor_.name), " has the field ", in_quotes(key), " twice");
  seen = true;
  return true;
}

inline bool HeaderReader::end_object() {
  if (where_ == Where::tensor) {
    finish_tensor();
  } else {
    // The reader is in the metadata or the header: start_object admits no other object.
    where_ = where_ == Where::metadata ? Where::header : Where::end;
  }
  return true;
}

inline void HeaderReader::finish_tensor() {
  for (std::size_t f = 0; f < field_keys.size(); ++f)
    if (!has_field_[f])
      throw_io_error("tensor ", in_quotes(tensor_.name), " has no ", field_keys[f],
                     "; a tensor has exactly dtype, shape and data_offsets");
  tensors_.push_back(std::move(tensor_));
  where_ = Where::header;
}

inline bool HeaderReader::start_array(std::size_t) {
  if (where_ != Where::tensor || field_ == HeaderField::dtype) unexpected("an array");
  where_ = field_ == HeaderField::shape ? Where::shape : Where::data_offsets;
  return true;
}

inline bool HeaderReader::end_array() {
  // Only the shape and data_offsets arrays get this far: start_array admits no other.
  if (where_ == Where::data_offsets && offsets_read_ != 2)
    throw_io_error("tensor ", in_quotes(tensor_.name), " has ", offsets_read_,
                   " data_offsets; it needs [begin, end]");
  where_ = Where::tensor;
  return true;
}

inline bool HeaderReader::parse_error(std::size_t position, const std::string&,
                                      const json::exception& error) {
  // nlohmann's message starts with "[json.exception.parse_error.101] " and may quote the bytes
  // it last read, whatever they are: keep its reason, escaped and bounded.
  std::string_view reason = error.what();
  reason.remove_prefix(std::min(reason.size(), reason.find("] ") + 2));
  throw_io_error("the header is not valid JSON (at byte ", 8 + position,
                 " of the file): ", printable(reason, 200));
}

/// Refuses the bytes nlohmann would let through but the reference rejects: a UTF-8 byte order
/// mark, which nlohmann skips, and NUL, at which nlohmann's lexer stops as at the end of input
/// (so "{}\0garbage" would pass).
inline void check_raw_bytes(std::span<const char> text) {
  const std::string_view bytes(text.data(), text.size());
  if (bytes.starts_with("\xEF\xBB\xBF"))
    throw_io_error(
        "the header starts with a UTF-8 byte order mark, which safetensors does not allow");
  const std::size_t nul = bytes.find('\0');
  if (nul != std::string_view::npos)
    throw_io_error("the header has a NUL byte at byte ", 8 + nul,
                   " of the file, which JSON does not allow (writers pad with spaces)");
}

/// Refuses two tensors of one name and a tensor called __metadata__ (a writer's mistake).
inline void check_names(const std::vector<io::TensorEntry>& tensors) {
  std::vector<std::string_view> names;
  names.reserve(tensors.size());
  for (const auto& tensor : tensors) names.emplace_back(tensor.name);
  std::sort(names.begin(), names.end());
  const auto twice = std::adjacent_find(names.begin(), names.end());
  if (twice != names.end()) throw_io_error("the tensor name ", in_quotes(*twice), " appears twice");
  if (std::binary_search(names.begin(), names.end(), metadata_key))
    throw_io_error("a tensor is called __metadata__, the key reserved for the metadata");
}

/// Refuses an entry whose offsets are reversed, leave the data section, or disagree with its
/// dtype and shape.
inline void check_entry(const io::TensorEntry& tensor, std::uint64_t data_size) {
  if (tensor.begin > tensor.end)
    throw_io_error("tensor ", in_quotes(tensor.name), " begins at byte ", tensor.begin,
                   " of the data section but ends at byte ", tensor.end);
  if (tensor.end > data_size)
    throw_io_error("tensor ", in_quotes(tensor.name), " ends at byte ", tensor.end,
                   " of the data section, which has ", data_size, " bytes");
  const std::uint64_t bytes = tensor.bytes();
  if (bytes != tensor.end - tensor.begin)
    throw_io_error("tensor ", in_quotes(tensor.name), " has shape ", io::shape_text(tensor.shape),
                   " of ", io::to_string(tensor.dtype), ", ", bytes,
                   " bytes, but its data_offsets [", tensor.begin, ", ", tensor.end, "] span ",
                   tensor.end - tensor.begin);
}

/// Refuses entries (sorted by begin) that do not tile [0, data_size) of the data section.
inline void check_layout(const std::vector<io::TensorEntry>& tensors, std::uint64_t data_size) {
  std::uint64_t covered = 0;  // the tensors so far own exactly [0, covered)
  for (const auto& tensor : tensors) {
    check_entry(tensor, data_size);
    if (tensor.begin > covered)
      throw_io_error("no tensor owns bytes [", covered, ", ", tensor.begin,
                     ") of the data section: the tensors before ", in_quotes(tensor.name),
                     " end at byte ", covered);
    if (tensor.begin < covered)
      throw_io_error("tensor ", in_quotes(tensor.name), " begins at byte ", tensor.begin,
                     " of the data section, inside the tensors before it, which end at byte ",
                     covered);
    covered = tensor.end;
  }
  if (covered != data_size)
    throw_io_error("no tensor owns bytes [", covered, ", ", data_size,
                   ") of the data section, which has ", data_size, " bytes");
}

/// The header JSON as the reference writer makes it: metadata first (when there is any), the
/// tensors in the given order, no whitespace, then spaces to a multiple of 8 bytes so that the
/// data section starts 8-byte aligned.
inline std::string header_json(const std::map<std::string, std::string>& metadata,
                               const std::vector<io::TensorEntry>& tensors) {
  nlohmann::ordered_json root = nlohmann::ordered_json::object();
  if (!metadata.empty()) root[std::string(metadata_key)] = metadata;
  for (const auto& tensor : tensors) {
    auto& entry = root[tensor.name];
    entry["dtype"] = io::to_string(tensor.dtype);
    entry["shape"] = tensor.shape;
    entry["data_offsets"] = {tensor.begin, tensor.end};
  }
  std::string text;
  try {
    text = root.dump();
  } catch (const nlohmann::json::type_error&) {
    throw_io_error("cannot write the header: a tensor name or metadata string is not valid UTF-8");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > io::max_safetensors_header_length)
    throw_io_error("the header would have ", text.size(), " bytes, over the limit of ",
                   io::max_safetensors_header_length);
  return text;
}

}  // namespace kshard::detail

namespace kshard::io {

/// The header length N from the file's first 8 bytes, checked against the reference's cap
/// (max_safetensors_header_length) and against `file_size` (8 + N bytes must fit): a reader may
/// then read N bytes at offset 8. Throws kshard::error naming the value and the limit.
[[nodiscard]] inline std::uint64_t header_length_from_prefix(std::span<const std::byte, 8> prefix,
                                                             std::uint64_t file_size) {
  std::uint64_t length = 0;
  for (std::size_t i = prefix.size(); i-- > 0;)
    length = length << 8 | std::to_integer<std::uint64_t>(prefix[i]);
  detail::check_header_length(length, file_size);
  return length;
}

/// Parses and validates the N header bytes `json` (file bytes [8, 8 + N)) of a file of
/// `file_size` bytes. Refused with kshard::error, naming the value and the limit it broke:
/// anything but one JSON object of valid UTF-8 with only whitespace after it; a tensor without
/// exactly the fields dtype, shape and data_offsets, or of an unknown dtype; shape entries that
/// are not non-negative integers, or whose product passes INT64_MAX; data_offsets not two
/// non-negative integers, or spanning other than elements x dtype size bytes; tensors that,
/// sorted by offset, leave a gap, overlap, or do not end exactly at the end of the file; a name
/// or field given twice; __metadata__ that is not an object of strings.
[[nodiscard]] inline SafetensorsHeader parse_safetensors_header(std::span<const std::byte> json,
                                                                std::uint64_t file_size) {
  detail::check_header_length(json.size(), file_size);
  const std::span<const char> text(reinterpret_cast<const char*>(json.data()), json.size());
  detail::check_raw_bytes(text);
  detail::HeaderReader reader;
  reader.read(text);

  SafetensorsHeader header;
  header.header_length = json.size();
  header.data_offset = 8 + header.header_length;
  header.data_size = file_size - header.data_offset;
  header.metadata = std::move(reader.metadata());
  header.tensors = std::move(reader.tensors());
  detail::check_names(header.tensors);
  // Stable: empty tensors that share an offset keep their header order, so that writing the
  // header back reproduces it.
  std::stable_sort(header.tensors.begin(), header.tensors.end(),
                   [](const TensorEntry& a, const TensorEntry& b) {
                     return std::pair(a.begin, a.end) < std::pair(b.begin, b.end);
                   });
  detail::check_layout(header.tensors, header.data_size);
  return header;
}

/// The header of a file holding `tensors` back to back in the given order, with `metadata`:
/// offsets, header length and data size filled in. Throws kshard::error for a duplicate name, a
/// tensor called __metadata__, a negative shape entry, or sizes that overflow.
[[nodiscard]] inline SafetensorsHeader make_safetensors_header(
    std::span<const TensorSpec> tensors, std::map<std::string, std::string> metadata = {}) {
  SafetensorsHeader header;
  header.metadata = std::move(metadata);
  header.tensors.reserve(tensors.size());
  for (const auto& spec : tensors) {
    TensorEntry entry{spec.name, spec.dtype, spec.shape, header.data_size, header.data_size};
    const std::uint64_t bytes = entry.bytes();
    if (bytes > std::numeric_limits<std::uint64_t>::max() - entry.begin)
      detail::throw_io_error("the tensors up to ", detail::in_quotes(entry.name),
                             " hold more bytes than a 64-bit size holds");
    entry.end = entry.begin + bytes;
    header.data_size = entry.end;
    header.tensors.push_back(std::move(entry));
  }
  detail::check_names(header.tensors);
  header.header_length = detail::header_json(header.metadata, header.tensors).size();
  header.data_offset = 8 + header.header_length;
  return header;
}

/// The first data_offset bytes of the file `header` describes: the 8-byte little-endian length
/// and the JSON, padded with spaces to a multiple of 8 bytes as the reference writer does. The
/// data section follows, data_size bytes. Throws kshard::error for a header that
/// parse_safetensors_header would refuse, or whose lengths are not those of its JSON (build
/// headers with make_safetensors_header).
[[nodiscard]] inline std::vector<std::byte> serialize_safetensors_header(
    const SafetensorsHeader& header) {
  detail::check_names(header.tensors);
  detail::check_layout(header.tensors, header.data_size);
  const std::string text = detail::header_json(header.metadata, header.tensors);
  if (header.header_length != text.size() || header.data_offset != 8 + text.size())
    detail::throw_io_error("the header says header_length ", header.header_length,
                           " and data_offset ", header.data_offset, ", but its JSON has ",
                           text.size(), " bytes");
  std::vector<std::byte> bytes(8 + text.size());
  for (std::size_t i = 0; i < 8; ++i)
    bytes[i] = static_cast<std::byte>(header.header_length >> (8 * i) & 0xff);
  std::transform(text.begin(), text.end(), bytes.begin() + 8,
                 [](char c) { return static_cast<std::byte>(c); });
  return bytes;
}

}  // namespace kshard::io
