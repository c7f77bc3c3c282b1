// src/diagnose/pickle.hpp: a reader for the plain-values pickles of torch.cuda.memory._dump_snapshot.
//
// Accepted: protocols 2-5 built only from dict, list, tuple, int (up to 64 bits, signed or not),
// float, str, bytes, bool and None, with the memo (MEMOIZE, BINPUT, BINGET and their long forms)
// and FRAME. Anything else (GLOBAL, REDUCE, sets, protocol 0/1 text opcodes) is rejected.
//
// The input is hostile until proven otherwise. Every failure is an Error(parse) naming the byte
// offset and the opcode: lengths past the end, unknown opcodes, stack underflow, a memo index never
// stored, a missing STOP, nesting deeper than kMaxDepth, a stack taller than kMaxStack, or a value
// that would expand (through shared memo references) to more than max(1e7, 64 x input) nodes.
// Recursive structures are refused: a container cannot be changed once placed in another, nor be
// placed in itself, so the value graph is acyclic and every container's depth is final.
// No recursion on the input; every container lives in one arena, so destruction is flat.
//
// Strings and bytes are views into the document's copy of the input: a 10 MB snapshot parses in
// one pass with one allocation per container.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace membudget::diagnose {

struct PickleContainer;

class PickleValue {
 public:
  enum class Type { none, boolean, integer, floating, string, bytes, list, tuple, dict };

  PickleValue() = default;  // None
  static PickleValue boolean(bool b);
  static PickleValue integer(std::int64_t i);
  static PickleValue uinteger(std::uint64_t u);  // integer; values >= 2^63 are kept exactly
  static PickleValue floating(double d);
  static PickleValue string(std::string_view s);  // the caller keeps the bytes alive
  static PickleValue bytes(std::string_view s);
  static PickleValue container(const PickleContainer* c);

  Type type() const { return type_; }
  bool is_none() const { return type_ == Type::none; }
  bool is_int() const { return type_ == Type::integer; }
  bool is_string() const { return type_ == Type::string; }
  bool is_list() const { return type_ == Type::list; }
  bool is_tuple() const { return type_ == Type::tuple; }
  bool is_dict() const { return type_ == Type::dict; }
  bool is_sequence() const { return type_ == Type::list || type_ == Type::tuple; }

  // Typed access; a wrong type (or an int out of range) throws Error(parse) naming `what`.
  bool as_bool(std::string_view what = "value") const;
  std::int64_t as_int(std::string_view what = "value") const;
  std::uint64_t as_uint(std::string_view what = "value") const;  // rejects negatives
  double as_double(std::string_view what = "value") const;       // floats and ints
  std::string_view as_string(std::string_view what = "value") const;
  std::string_view as_bytes(std::string_view what = "value") const;

  // Lists and tuples.
  const std::vector<PickleValue>& items(std::string_view what = "value") const;
  // Dicts, in insertion order. A key set twice appears twice; find() returns the last (Python's
  // value for that key).
  const std::vector<std::pair<PickleValue, PickleValue>>& entries(std::string_view what = "value") const;
  const PickleValue* find(std::string_view key) const;  // nullptr if absent or not a dict
  const PickleValue& at(std::string_view key) const;    // throws Error(parse) if absent

  std::size_t size() const;  // elements of a container, bytes of a str/bytes, else 0

  // Structural equality (dict entries compared in order); ints compare by value.
  friend bool operator==(const PickleValue& a, const PickleValue& b);

  // Nesting depth: 0 for a scalar, 1 + the deepest element for a container.
  std::uint32_t depth() const;

  // Python-like text for messages and tests: {'a': [1, 2.5, None, True]}.
  std::string repr() const;

 private:
  friend struct PickleParser;
  Type type_ = Type::none;
  bool big_ = false;  // integer stored as u_ (>= 2^63)
  union {
    std::int64_t i_ = 0;
    bool b_;
    std::uint64_t u_;
    double d_;
    const PickleContainer* c_;
  };
  std::string_view s_;
};

struct PickleContainer {
  PickleValue::Type kind = PickleValue::Type::list;
  std::vector<PickleValue> items;                              // list, tuple
  std::vector<std::pair<PickleValue, PickleValue>> entries;    // dict
  bool sealed = false;       // placed in another container: contents final
  std::uint32_t depth = 1;
  std::uint64_t weight = 1;  // nodes if fully expanded (saturating)
};

// A parsed pickle: owns the input bytes (strings view into them) and every container.
class PickleDocument;
PickleDocument parse_pickle(std::string bytes, const std::string& where);

class PickleDocument {
 public:
  PickleDocument() = default;
  PickleDocument(PickleDocument&&) noexcept = default;
  PickleDocument& operator=(PickleDocument&&) noexcept = default;

  const PickleValue& root() const { return root_; }
  int protocol() const { return protocol_; }

 private:
  friend PickleDocument parse_pickle(std::string bytes, const std::string& where);
  std::unique_ptr<std::string> bytes_;
  std::unique_ptr<std::deque<PickleContainer>> arena_;
  PickleValue root_;
  int protocol_ = 0;
};

inline constexpr std::uint32_t kMaxPickleDepth = 1000;      // snapshots nest 5 deep
inline constexpr std::size_t kMaxPickleStack = 1u << 22;    // values + marks on the stack

// A compressed file or an archive, told by its opening bytes: snapshots are often stored compressed
// (tests/data keeps them gzipped), and torch.save writes a zip archive. The readers name it and the
// command that unpacks it, rather than failing on its first byte as a pickle opcode or a CSV column.
struct PackedFormat {
  const char* name;       // "gzip"
  const char* described;  // "gzip-compressed"
  std::string_view magic;
  const char* magic_hex;  // "1f 8b"
  const char* unpack;     // "gunzip -k FILE"
};
const PackedFormat* packed_format(std::string_view head) noexcept;  // null: none of them

// `where` prefixes error messages (a file name).
PickleDocument parse_pickle(std::string bytes, const std::string& where = "pickle");
PickleDocument read_pickle_file(const std::string& path);  // Error(io) if unreadable

}  // namespace membudget::diagnose
