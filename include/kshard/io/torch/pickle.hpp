#pragma once

// A restricted unpickler for the pickles of PyTorch checkpoints: DCP's `.metadata` and the
// `data.pkl` of a torch.save archive (protocols 2 to 5). It runs pickle's stack machine but never
// calls anything: GLOBAL and STACK_GLOBAL push a token naming the global (after checking it
// against the caller's allow-list), REDUCE, NEWOBJ and BUILD record an object holding that token,
// its arguments and its state, and BINPERSID records the persistent id. A typed pass
// (metadata.hpp, data_pickle.hpp) then recognises the few classes it expects.
//
// Input from anywhere is safe to give it: memory stays linear in the input (a value is stored
// once, and the memo and every container refer to it by index), the nesting of values and of
// MARKs is capped, a length is compared with the bytes left before anything is taken, integers
// wider than 8 bytes are refused, and a container is never changed once it sits inside another
// one, so that the values form no cycle and each value's recorded depth stays true.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "kshard/io/model/dtype.hpp"
#include "kshard/io/model/messages.hpp"

namespace kshard::detail {

// The index of a value in its PickleDocument.
using PickleId = std::uint32_t;

struct PickleNone {};
struct PickleBytes {
  std::string data;
};
struct PickleTuple {
  std::vector<PickleId> items;
};
struct PickleList {
  std::vector<PickleId> items;
};
// A dict as its pairs in pickle order: keys may be objects (DCP's MetadataIndex).
struct PickleDict {
  std::vector<std::pair<PickleId, PickleId>> items;
};
struct PickleSet {
  std::vector<PickleId> items;
  bool frozen = false;
};
// The token GLOBAL or STACK_GLOBAL pushes: a name, never looked up.
struct PickleGlobal {
  std::string module;
  std::string name;
};
// What REDUCE (callable(*args)), NEWOBJ (cls.__new__(cls, *args)) or NEWOBJ_EX made, with the
// state a BUILD gave it and the pairs SETITEMS gave it (an OrderedDict's items).
struct PickleObject {
  PickleId callable = 0;  // always a PickleGlobal
  PickleId args = 0;      // always a PickleTuple
  std::optional<PickleId> kwargs;
  std::optional<PickleId> state;
  std::vector<std::pair<PickleId, PickleId>> items;
};
struct PicklePersistentId {
  PickleId value = 0;
};

using PickleData =
    std::variant<PickleNone, bool, std::int64_t, double, std::string, PickleBytes, PickleTuple,
                 PickleList, PickleDict, PickleSet, PickleGlobal, PickleObject, PicklePersistentId>;

struct PickleValue {
  PickleData data;
  std::uint32_t depth = 1;  // 1 for a leaf, 1 + the deepest item for a container
  bool contained = false;   // inside another value: frozen from then on
};

// The result of unpickle: every value, the one STOP returned, and the input's size (the typed
// passes size their copy budgets by it).
struct PickleDocument {
  std::vector<PickleValue> values;
  PickleId root = 0;
  std::size_t input_bytes = 0;

  const PickleData& at(PickleId id) const { return values.at(id).data; }
  template <class T>
  const T* get(PickleId id) const {
    return std::get_if<T>(&at(id));
  }
};

// A global the caller allows, e.g. {"torch", "Size"}.
struct PickleGlobalName {
  std::string_view module;
  std::string_view name;
};

struct PickleLimits {
  std::uint32_t max_depth = 256;                  // nesting of values, and of open MARKs
  std::size_t max_values = std::size_t{1} << 26;  // values created (about 64 bytes each)
};

// "a tuple", "an int", ...: what a value is, for messages.
inline std::string_view pickle_kind(const PickleData& data) {
  constexpr std::array<std::string_view, std::variant_size_v<PickleData>> kinds{
      "None",   "a bool", "an int", "a float",  "a str",     "a bytes",        "a tuple",
      "a list", "a dict", "a set",  "a global", "an object", "a persistent id"};
  return kinds[data.index()];
}

// "module.name" of a global, printable, for messages.
inline std::string global_text(const PickleGlobal& global) {
  return printable(global.module, 80) + "." + printable(global.name, 80);
}

// The global that made `object` (unpickle lets only globals be called).
inline const PickleGlobal& object_global(const PickleDocument& document,
                                         const PickleObject& object) {
  return std::get<PickleGlobal>(document.at(object.callable));
}

// What the value `id` is, naming an object's class and a global: "a tuple", "an object of
// torch.Size", "the global torch.float32".
inline std::string pickle_value_kind(const PickleDocument& document, PickleId id) {
  const PickleData& data = document.at(id);
  if (const auto* object = std::get_if<PickleObject>(&data))
    return "an object of " + global_text(object_global(document, *object));
  if (const auto* global = std::get_if<PickleGlobal>(&data))
    return "the global " + global_text(*global);
  return std::string(pickle_kind(data));
}

// The items of a tuple or a list; nullptr for any other value.
inline const std::vector<PickleId>* pickle_sequence(const PickleDocument& document, PickleId id) {
  if (const auto* tuple = document.get<PickleTuple>(id)) return &tuple->items;
  if (const auto* list = document.get<PickleList>(id)) return &list->items;
  return nullptr;
}

// The opcodes of pickle protocols 0 to 5 (CPython's Lib/pickletools.py), for messages.
struct PickleOpcodeName {
  std::uint8_t code;
  std::string_view name;
};
inline constexpr std::array<PickleOpcodeName, 68> pickle_opcode_names{{
    {'I', "INT"},
    {'J', "BININT"},
    {'K', "BININT1"},
    {'M', "BININT2"},
    {'L', "LONG"},
    {0x8a, "LONG1"},
    {0x8b, "LONG4"},
    {'S', "STRING"},
    {'T', "BINSTRING"},
    {'U', "SHORT_BINSTRING"},
    {'B', "BINBYTES"},
    {'C', "SHORT_BINBYTES"},
    {0x8e, "BINBYTES8"},
    {0x96, "BYTEARRAY8"},
    {0x97, "NEXT_BUFFER"},
    {0x98, "READONLY_BUFFER"},
    {'N', "NONE"},
    {0x88, "NEWTRUE"},
    {0x89, "NEWFALSE"},
    {'V', "UNICODE"},
    {0x8c, "SHORT_BINUNICODE"},
    {'X', "BINUNICODE"},
    {0x8d, "BINUNICODE8"},
    {'F', "FLOAT"},
    {'G', "BINFLOAT"},
    {']', "EMPTY_LIST"},
    {'a', "APPEND"},
    {'e', "APPENDS"},
    {'l', "LIST"},
    {')', "EMPTY_TUPLE"},
    {'t', "TUPLE"},
    {0x85, "TUPLE1"},
    {0x86, "TUPLE2"},
    {0x87, "TUPLE3"},
    {'}', "EMPTY_DICT"},
    {'d', "DICT"},
    {'s', "SETITEM"},
    {'u', "SETITEMS"},
    {0x8f, "EMPTY_SET"},
    {0x90, "ADDITEMS"},
    {0x91, "FROZENSET"},
    {'0', "POP"},
    {'2', "DUP"},
    {'(', "MARK"},
    {'1', "POP_MARK"},
    {'g', "GET"},
    {'h', "BINGET"},
    {'j', "LONG_BINGET"},
    {'p', "PUT"},
    {'q', "BINPUT"},
    {'r', "LONG_BINPUT"},
    {0x94, "MEMOIZE"},
    {0x82, "EXT1"},
    {0x83, "EXT2"},
    {0x84, "EXT4"},
    {'c', "GLOBAL"},
    {0x93, "STACK_GLOBAL"},
    {'R', "REDUCE"},
    {'b', "BUILD"},
    {'i', "INST"},
    {'o', "OBJ"},
    {0x81, "NEWOBJ"},
    {0x92, "NEWOBJ_EX"},
    {0x80, "PROTO"},
    {'.', "STOP"},
    {0x95, "FRAME"},
    {'P', "PERSID"},
    {'Q', "BINPERSID"},
}};

// "0x63 (GLOBAL)": an opcode byte with its name where it has one.
inline std::string opcode_text(std::uint8_t code) {
  for (const PickleOpcodeName& known : pickle_opcode_names)
    if (known.code == code) return fmt::format("0x{:02x} ({})", code, known.name);
  return fmt::format("0x{:02x}", code);
}

// Runs the stack machine over one pickle; see unpickle below.
class Unpickler {
 public:
  Unpickler(std::span<const std::byte> input, std::span<const PickleGlobalName> allowed,
            std::string_view source, const PickleLimits& limits)
      : input_(input), allowed_(allowed), source_(source), limits_(limits) {}

  PickleDocument run() {
    document_.input_bytes = input_.size();
    for (;;) {
      op_position_ = position_;
      op_ = static_cast<std::uint8_t>(read(1)[0]);
      if (op_ == '.') break;
      if (!scalar_op() && !container_op() && !fill_op() && !memo_op() && !object_op())
        fail(
            "is not one kshard reads: it reads the opcodes of protocols 2 to 5 that build "
            "values, and calls nothing");
    }
    if (stack_.size() != 1 || !marks_.empty())
      fail("stops with ", stack_.size(), " values and ", marks_.size(),
           " open MARKs on the stack; a pickle stops with one value");
    document_.root = stack_.back();
    return std::move(document_);
  }

 private:
  std::span<const std::byte> input_;
  std::span<const PickleGlobalName> allowed_;
  std::string_view source_;
  PickleLimits limits_;
  PickleDocument document_;
  std::vector<PickleId> stack_;
  std::vector<std::size_t> marks_;  // stack sizes at each open MARK
  std::unordered_map<std::uint32_t, PickleId> memo_;
  std::size_t position_ = 0;
  std::size_t op_position_ = 0;
  std::uint8_t op_ = 0;

  template <class... Pieces>
  [[noreturn]] void fail(const Pieces&... pieces) const {
    throw_io_error(source_, ": opcode ", opcode_text(op_), " at byte ", op_position_, " ",
                   pieces...);
  }

  // The next `count` bytes of the input, refused if fewer remain.
  std::span<const std::byte> read(std::uint64_t count) {
    const std::size_t left = input_.size() - position_;
    if (count > left) {
      if (position_ == op_position_)
        throw_io_error(source_, ": the pickle ends at byte ", position_, " without a STOP opcode");
      fail("needs ", count, " more bytes; the input has ", left);
    }
    const std::span<const std::byte> bytes = input_.subspan(position_, count);
    position_ += count;
    return bytes;
  }

  std::uint64_t read_unsigned(std::size_t width) {
    const std::span<const std::byte> bytes = read(width);
    std::uint64_t value = 0;
    for (std::size_t i = width; i-- > 0;) value = value << 8 | static_cast<std::uint8_t>(bytes[i]);
    return value;
  }

  std::string read_text(std::uint64_t length) {
    const std::span<const std::byte> bytes = read(length);
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
  }

  // A line ending in '\n' (GLOBAL's operands), without the '\n'.
  std::string read_line() {
    const std::span<const std::byte> rest = input_.subspan(position_);
    const auto* begin = reinterpret_cast<const char*>(rest.data());
    const void* newline = std::memchr(begin, '\n', rest.size());
    if (newline == nullptr) fail("has no end of line in the ", rest.size(), " bytes left");
    std::string line = read_text(static_cast<const char*>(newline) - begin);
    position_ += 1;
    return line;
  }

  PickleId add(PickleData data) {
    if (document_.values.size() >= limits_.max_values)
      fail("makes value number ", document_.values.size() + 1, "; kshard reads at most ",
           limits_.max_values);
    PickleValue added;
    added.data = std::move(data);
    document_.values.push_back(std::move(added));
    return static_cast<PickleId>(document_.values.size() - 1);
  }

  void push(PickleData data) { stack_.push_back(add(std::move(data))); }

  PickleValue& value(PickleId id) { return document_.values[id]; }

  // The values on the stack above the last MARK (or all of them, without one).
  std::size_t frame_size() const { return stack_.size() - (marks_.empty() ? 0 : marks_.back()); }

  void need(std::size_t count) {
    if (frame_size() < count)
      fail("needs ", count, " values on the stack; it holds ", frame_size(),
           marks_.empty() ? "" : " above the last MARK");
  }

  PickleId pop() {
    need(1);
    const PickleId id = stack_.back();
    stack_.pop_back();
    return id;
  }

  // The values above the last MARK, which is removed with them.
  std::vector<PickleId> pop_mark() {
    if (marks_.empty()) fail("has no MARK to pop to");
    const auto begin = stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back());
    std::vector<PickleId> items(begin, stack_.end());
    stack_.erase(begin, stack_.end());
    marks_.pop_back();
    return items;
  }

  // Records that `child` now sits inside `parent`: it is frozen, and the parent is deeper.
  void adopt(PickleId parent, PickleId child) {
    if (parent == child) fail("puts a value inside itself; kshard refuses recursive values");
    PickleValue& inner = value(child);
    inner.contained = true;
    const std::uint32_t depth = inner.depth + 1;
    if (depth > limits_.max_depth)
      fail("nests values ", depth, " deep; kshard reads at most ", limits_.max_depth);
    if (depth > value(parent).depth) value(parent).depth = depth;
  }

  // Pushes a new tuple or frozenset holding `container.items`.
  template <class Container>
  void push_container(Container container) {
    const PickleId id = add(std::move(container));
    for (const PickleId item : std::get<Container>(value(id).data).items) adopt(id, item);
    stack_.push_back(id);
  }

  void push_popped_tuple(std::size_t count) {
    need(count);
    std::vector<PickleId> items(stack_.end() - static_cast<std::ptrdiff_t>(count), stack_.end());
    stack_.resize(stack_.size() - count);
    push_container(PickleTuple{std::move(items)});
  }

  // An integer of `width` bytes, little-endian two's complement (LONG1, LONG4).
  std::int64_t read_long(std::uint64_t width) {
    if (width > 8)
      fail("holds an integer of ", width, " bytes; kshard reads integers of at most 8 bytes");
    const std::uint64_t raw = read_unsigned(static_cast<std::size_t>(width));
    if (width == 0 || width == 8) return static_cast<std::int64_t>(raw);
    const std::uint64_t sign = std::uint64_t{1} << (8 * width - 1);
    return static_cast<std::int64_t>((raw ^ sign) - sign);
  }

  double read_float() {
    const std::uint64_t big_endian = read_unsigned(8);
    std::uint64_t bits = 0;
    for (int i = 0; i < 8; ++i) bits = bits << 8 | (big_endian >> (8 * i) & 0xff);
    double number = 0;
    std::memcpy(&number, &bits, sizeof number);
    return number;
  }

  // PROTO, FRAME and the opcodes that push one value read from the input.
  bool scalar_op() {
    switch (op_) {
      case 0x80: {
        const std::uint64_t protocol = read_unsigned(1);
        if (protocol < 2 || protocol > 5)
          fail("asks for protocol ", protocol, "; kshard reads protocols 2 to 5");
        return true;
      }
      case 0x95:
        read(8);
        return true;  // FRAME: frames only group bytes
      case 'N':
        push(PickleNone{});
        return true;
      case 0x88:
        push(true);
        return true;
      case 0x89:
        push(false);
        return true;
      case 'K':
        push(static_cast<std::int64_t>(read_unsigned(1)));
        return true;
      case 'M':
        push(static_cast<std::int64_t>(read_unsigned(2)));
        return true;
      case 'J':
        push(std::int64_t{static_cast<std::int32_t>(read_unsigned(4))});
        return true;
      case 0x8a:
        push(read_long(read_unsigned(1)));
        return true;
      case 0x8b:
        push(read_long(read_unsigned(4)));
        return true;
      case 'G':
        push(read_float());
        return true;
      case 0x8c:
        push(read_text(read_unsigned(1)));
        return true;
      case 'X':
        push(read_text(read_unsigned(4)));
        return true;
      case 0x8d:
        push(read_text(read_unsigned(8)));
        return true;
      case 'C':
        push(PickleBytes{read_text(read_unsigned(1))});
        return true;
      case 'B':
        push(PickleBytes{read_text(read_unsigned(4))});
        return true;
      case 0x8e:
        push(PickleBytes{read_text(read_unsigned(8))});
        return true;
      default:
        return false;
    }
  }

  // MARK, POP, POP_MARK and the opcodes that make a new container.
  bool container_op() {
    switch (op_) {
      case '(':
        if (marks_.size() >= limits_.max_depth)
          fail("opens MARK number ", marks_.size() + 1, "; kshard allows ", limits_.max_depth,
               " open at once");
        marks_.push_back(stack_.size());
        return true;
      case '0':
        if (frame_size() == 0 && !marks_.empty())
          marks_.pop_back();
        else
          pop();
        return true;
      case '1':
        pop_mark();
        return true;
      case ')':
        push(PickleTuple{});
        return true;
      case 0x85:
        push_popped_tuple(1);
        return true;
      case 0x86:
        push_popped_tuple(2);
        return true;
      case 0x87:
        push_popped_tuple(3);
        return true;
      case 't':
        push_container(PickleTuple{pop_mark()});
        return true;
      case ']':
        push(PickleList{});
        return true;
      case '}':
        push(PickleDict{});
        return true;
      case 0x8f:
        push(PickleSet{});
        return true;
      case 0x91:
        push_container(PickleSet{pop_mark(), true});
        return true;
      default:
        return false;
    }
  }

  // The value at stack_[index] as a container that may still change.
  PickleValue& target(std::size_t index, std::string_view wanted) {
    PickleValue& container = value(stack_[index]);
    if (container.contained)
      fail("changes ", pickle_kind(container.data),
           " that already sits inside another value; kshard refuses recursive values");
    if (wanted == "dict" && (std::holds_alternative<PickleDict>(container.data) ||
                             std::holds_alternative<PickleObject>(container.data)))
      return container;
    if (wanted == "list" && std::holds_alternative<PickleList>(container.data)) return container;
    if (wanted == "set" && std::holds_alternative<PickleSet>(container.data) &&
        !std::get<PickleSet>(container.data).frozen)
      return container;
    fail("adds items to ", pickle_kind(container.data), "; it needs a ", wanted);
  }

  void append_items(std::size_t at, std::span<const PickleId> items) {
    PickleValue& container = target(at, "list");
    for (const PickleId item : items) adopt(stack_[at], item);
    auto& list = std::get<PickleList>(container.data).items;
    list.insert(list.end(), items.begin(), items.end());
  }

  void set_items(std::size_t at, std::span<const PickleId> items) {
    if (items.size() % 2 != 0) fail("has ", items.size(), " values for key-value pairs");
    PickleValue& container = target(at, "dict");
    for (const PickleId item : items) adopt(stack_[at], item);
    auto& pairs = std::holds_alternative<PickleDict>(container.data)
                      ? std::get<PickleDict>(container.data).items
                      : std::get<PickleObject>(container.data).items;
    for (std::size_t i = 0; i < items.size(); i += 2) pairs.emplace_back(items[i], items[i + 1]);
  }

  // The opcodes that add items to the container below them.
  bool fill_op() {
    if (op_ != 'a' && op_ != 'e' && op_ != 's' && op_ != 'u' && op_ != 0x90) return false;
    std::vector<PickleId> items;
    if (op_ == 'a' || op_ == 's') {
      need(op_ == 'a' ? 2 : 3);
      items.assign(stack_.end() - (op_ == 'a' ? 1 : 2), stack_.end());
      stack_.resize(stack_.size() - items.size());
    } else {
      items = pop_mark();
      need(1);
    }
    const std::size_t at = stack_.size() - 1;
    if (op_ == 'a' || op_ == 'e')
      append_items(at, items);
    else if (op_ == 0x90) {
      target(at, "set");
      for (const PickleId item : items) adopt(stack_[at], item);
      auto& set = std::get<PickleSet>(value(stack_[at]).data).items;
      set.insert(set.end(), items.begin(), items.end());
    } else
      set_items(at, items);
    return true;
  }

  // MEMOIZE, BINPUT, LONG_BINPUT, BINGET, LONG_BINGET: the memo refers to values, never copies.
  bool memo_op() {
    switch (op_) {
      case 0x94:
        need(1);
        memo_[static_cast<std::uint32_t>(memo_.size())] = stack_.back();
        return true;
      case 'q':
        need(1);
        memo_[static_cast<std::uint32_t>(read_unsigned(1))] = stack_.back();
        return true;
      case 'r':
        need(1);
        memo_[static_cast<std::uint32_t>(read_unsigned(4))] = stack_.back();
        return true;
      case 'h':
      case 'j': {
        const auto index = static_cast<std::uint32_t>(read_unsigned(op_ == 'h' ? 1 : 4));
        const auto found = memo_.find(index);
        if (found == memo_.end()) fail("gets memo entry ", index, ", which was never put");
        stack_.push_back(found->second);
        return true;
      }
      default:
        return false;
    }
  }

  void check_allowed(const std::string& module, const std::string& name) {
    for (const PickleGlobalName& allowed : allowed_)
      if (allowed.module == module && allowed.name == name) return;
    fail("names the global ", global_text({module, name}),
         ", which is not on this pickle's allow-list (kshard calls nothing a pickle names)");
  }

  void push_global(std::string module, std::string name) {
    check_allowed(module, name);
    push(PickleGlobal{std::move(module), std::move(name)});
  }

  void push_stack_global() {
    const PickleId name = pop();
    const PickleId module = pop();
    const auto* module_text = document_.get<std::string>(module);
    const auto* name_text = document_.get<std::string>(name);
    if (module_text == nullptr || name_text == nullptr)
      fail("needs two str values; it finds ", pickle_kind(value(module).data), " and ",
           pickle_kind(value(name).data));
    push_global(*module_text, *name_text);
  }

  // REDUCE, NEWOBJ, NEWOBJ_EX: an object recording its class (a global) and arguments.
  void push_object(std::optional<PickleId> kwargs) {
    const PickleId args = pop();
    const PickleId callable = pop();
    if (document_.get<PickleGlobal>(callable) == nullptr)
      fail("calls ", pickle_kind(value(callable).data), "; kshard records only calls of globals");
    if (document_.get<PickleTuple>(args) == nullptr)
      fail("has ", pickle_kind(value(args).data), " for arguments; it needs a tuple");
    if (kwargs && document_.get<PickleDict>(*kwargs) == nullptr)
      fail("has ", pickle_kind(value(*kwargs).data), " for keyword arguments; it needs a dict");
    const PickleId id = add(PickleObject{callable, args, kwargs, std::nullopt, {}});
    adopt(id, callable);
    adopt(id, args);
    if (kwargs) adopt(id, *kwargs);
    stack_.push_back(id);
  }

  void build() {
    const PickleId state = pop();
    need(1);
    PickleValue& object = value(stack_.back());
    auto* built = std::get_if<PickleObject>(&object.data);
    if (built == nullptr) fail("sets the state of ", pickle_kind(object.data));
    if (built->state || object.contained)
      fail("sets the state of an object a second time or after it was used");
    built->state = state;
    adopt(stack_.back(), state);
  }

  // GLOBAL, STACK_GLOBAL, REDUCE, NEWOBJ, NEWOBJ_EX, BUILD, BINPERSID.
  bool object_op() {
    switch (op_) {
      case 'c': {
        std::string module = read_line();
        push_global(std::move(module), read_line());
        return true;
      }
      case 0x93:
        push_stack_global();
        return true;
      case 'R':
      case 0x81:
        push_object(std::nullopt);
        return true;
      case 0x92: {
        const PickleId kwargs = pop();
        push_object(kwargs);
        return true;
      }
      case 'b':
        build();
        return true;
      case 'Q': {
        const PickleId pid = pop();
        const PickleId id = add(PicklePersistentId{pid});
        adopt(id, pid);
        stack_.push_back(id);
        return true;
      }
      default:
        return false;
    }
  }
};

// The values of the pickle `input`; `source` names it in messages ("'ckpt/.metadata'"), and a
// GLOBAL or STACK_GLOBAL naming a global outside `allowed` is refused. Throws kshard::error for
// any input that is not such a pickle within `limits`. Bytes after STOP are ignored, as
// Python's pickle.load ignores them.
inline PickleDocument unpickle(std::span<const std::byte> input,
                               std::span<const PickleGlobalName> allowed, std::string_view source,
                               const PickleLimits& limits = {}) {
  return Unpickler(input, allowed, source, limits).run();
}

}  // namespace kshard::detail
