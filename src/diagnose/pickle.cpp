// The pickle reader: one pass over the bytes, an explicit value stack, no recursion on the input.
#include "pickle.hpp"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "membudget/error.hpp"
#include "membudget/input.hpp"

namespace membudget::diagnose {

namespace {

const char* type_name(PickleValue::Type t) {
  switch (t) {
    case PickleValue::Type::none: return "None";
    case PickleValue::Type::boolean: return "bool";
    case PickleValue::Type::integer: return "int";
    case PickleValue::Type::floating: return "float";
    case PickleValue::Type::string: return "str";
    case PickleValue::Type::bytes: return "bytes";
    case PickleValue::Type::list: return "list";
    case PickleValue::Type::tuple: return "tuple";
    case PickleValue::Type::dict: return "dict";
  }
  return "?";
}

[[noreturn]] void wrong_type(std::string_view what, const char* want, PickleValue::Type got) {
  throw Error(ErrorKind::parse, std::string(what) + ": expected " + want + ", found " + type_name(got));
}

// Opcodes (pickletools' names).
enum Op : unsigned char {
  MARK = '(',
  STOP = '.',
  EMPTY_TUPLE = ')',
  BINBYTES = 'B',
  SHORT_BINBYTES = 'C',
  BINFLOAT = 'G',
  BININT = 'J',
  BININT1 = 'K',
  BININT2 = 'M',
  NONE = 'N',
  BINUNICODE = 'X',
  EMPTY_LIST = ']',
  APPEND = 'a',
  APPENDS = 'e',
  BINGET = 'h',
  LONG_BINGET = 'j',
  BINPUT = 'q',
  LONG_BINPUT = 'r',
  SETITEM = 's',
  TUPLE = 't',
  SETITEMS = 'u',
  EMPTY_DICT = '}',
  PROTO = 0x80,
  TUPLE1 = 0x85,
  TUPLE2 = 0x86,
  TUPLE3 = 0x87,
  NEWTRUE = 0x88,
  NEWFALSE = 0x89,
  LONG1 = 0x8a,
  LONG4 = 0x8b,
  SHORT_BINUNICODE = 0x8c,
  BINUNICODE8 = 0x8d,
  BINBYTES8 = 0x8e,
  MEMOIZE = 0x94,
  FRAME = 0x95,
};

const char* op_name(unsigned char op) {
  switch (op) {
    case MARK: return "MARK";
    case STOP: return "STOP";
    case EMPTY_TUPLE: return "EMPTY_TUPLE";
    case BINBYTES: return "BINBYTES";
    case SHORT_BINBYTES: return "SHORT_BINBYTES";
    case BINFLOAT: return "BINFLOAT";
    case BININT: return "BININT";
    case BININT1: return "BININT1";
    case BININT2: return "BININT2";
    case NONE: return "NONE";
    case BINUNICODE: return "BINUNICODE";
    case EMPTY_LIST: return "EMPTY_LIST";
    case APPEND: return "APPEND";
    case APPENDS: return "APPENDS";
    case BINGET: return "BINGET";
    case LONG_BINGET: return "LONG_BINGET";
    case BINPUT: return "BINPUT";
    case LONG_BINPUT: return "LONG_BINPUT";
    case SETITEM: return "SETITEM";
    case TUPLE: return "TUPLE";
    case SETITEMS: return "SETITEMS";
    case EMPTY_DICT: return "EMPTY_DICT";
    case PROTO: return "PROTO";
    case TUPLE1: return "TUPLE1";
    case TUPLE2: return "TUPLE2";
    case TUPLE3: return "TUPLE3";
    case NEWTRUE: return "NEWTRUE";
    case NEWFALSE: return "NEWFALSE";
    case LONG1: return "LONG1";
    case LONG4: return "LONG4";
    case SHORT_BINUNICODE: return "SHORT_BINUNICODE";
    case BINUNICODE8: return "BINUNICODE8";
    case BINBYTES8: return "BINBYTES8";
    case MEMOIZE: return "MEMOIZE";
    case FRAME: return "FRAME";
    case 'c': return "GLOBAL (refused: only plain values are read)";
    case 0x93: return "STACK_GLOBAL (refused: only plain values are read)";
    case 'R': return "REDUCE (refused: only plain values are read)";
    case 0x81: return "NEWOBJ (refused: only plain values are read)";
    case 'b': return "BUILD (refused: only plain values are read)";
  }
  return "unknown opcode";
}

std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

}  // namespace

// ---- PickleValue ----

PickleValue PickleValue::boolean(bool b) {
  PickleValue v;
  v.type_ = Type::boolean;
  v.b_ = b;
  return v;
}
PickleValue PickleValue::integer(std::int64_t i) {
  PickleValue v;
  v.type_ = Type::integer;
  v.i_ = i;
  return v;
}
PickleValue PickleValue::uinteger(std::uint64_t u) {
  if (u <= static_cast<std::uint64_t>(INT64_MAX)) return integer(static_cast<std::int64_t>(u));
  PickleValue v;
  v.type_ = Type::integer;
  v.big_ = true;
  v.u_ = u;
  return v;
}
PickleValue PickleValue::floating(double d) {
  PickleValue v;
  v.type_ = Type::floating;
  v.d_ = d;
  return v;
}
PickleValue PickleValue::string(std::string_view s) {
  PickleValue v;
  v.type_ = Type::string;
  v.s_ = s;
  return v;
}
PickleValue PickleValue::bytes(std::string_view s) {
  PickleValue v;
  v.type_ = Type::bytes;
  v.s_ = s;
  return v;
}
PickleValue PickleValue::container(const PickleContainer* c) {
  PickleValue v;
  v.type_ = c->kind;
  v.c_ = c;
  return v;
}

bool PickleValue::as_bool(std::string_view what) const {
  if (type_ != Type::boolean) wrong_type(what, "bool", type_);
  return b_;
}
std::int64_t PickleValue::as_int(std::string_view what) const {
  if (type_ != Type::integer) wrong_type(what, "int", type_);
  if (big_) throw Error(ErrorKind::parse, std::string(what) + ": integer does not fit in 64-bit signed");
  return i_;
}
std::uint64_t PickleValue::as_uint(std::string_view what) const {
  if (type_ != Type::integer) wrong_type(what, "int", type_);
  if (big_) return u_;
  if (i_ < 0) throw Error(ErrorKind::parse, std::string(what) + ": expected a non-negative integer, found " + std::to_string(i_));
  return static_cast<std::uint64_t>(i_);
}
double PickleValue::as_double(std::string_view what) const {
  if (type_ == Type::floating) return d_;
  if (type_ == Type::integer) return big_ ? static_cast<double>(u_) : static_cast<double>(i_);
  wrong_type(what, "float", type_);
}
std::string_view PickleValue::as_string(std::string_view what) const {
  if (type_ != Type::string) wrong_type(what, "str", type_);
  return s_;
}
std::string_view PickleValue::as_bytes(std::string_view what) const {
  if (type_ != Type::bytes) wrong_type(what, "bytes", type_);
  return s_;
}
const std::vector<PickleValue>& PickleValue::items(std::string_view what) const {
  if (type_ != Type::list && type_ != Type::tuple) wrong_type(what, "list or tuple", type_);
  return c_->items;
}
const std::vector<std::pair<PickleValue, PickleValue>>& PickleValue::entries(std::string_view what) const {
  if (type_ != Type::dict) wrong_type(what, "dict", type_);
  return c_->entries;
}
const PickleValue* PickleValue::find(std::string_view key) const {
  if (type_ != Type::dict) return nullptr;
  const auto& e = c_->entries;
  for (auto it = e.rbegin(); it != e.rend(); ++it)
    if (it->first.type_ == Type::string && it->first.s_ == key) return &it->second;
  return nullptr;
}
const PickleValue& PickleValue::at(std::string_view key) const {
  if (type_ != Type::dict) wrong_type(key, "dict", type_);
  if (const PickleValue* v = find(key)) return *v;
  throw Error(ErrorKind::parse, "missing key '" + std::string(key) + "'");
}
std::size_t PickleValue::size() const {
  switch (type_) {
    case Type::string:
    case Type::bytes: return s_.size();
    case Type::list:
    case Type::tuple: return c_->items.size();
    case Type::dict: return c_->entries.size();
    default: return 0;
  }
}
std::uint32_t PickleValue::depth() const {
  return (type_ == Type::list || type_ == Type::tuple || type_ == Type::dict) ? c_->depth : 0;
}

bool operator==(const PickleValue& a, const PickleValue& b) {
  using T = PickleValue::Type;
  if (a.type_ != b.type_) return false;
  switch (a.type_) {
    case T::none: return true;
    case T::boolean: return a.b_ == b.b_;
    case T::integer: return a.big_ == b.big_ && a.i_ == b.i_;
    case T::floating: return a.d_ == b.d_;
    case T::string:
    case T::bytes: return a.s_ == b.s_;
    case T::list:
    case T::tuple: return a.c_ == b.c_ || a.c_->items == b.c_->items;
    case T::dict: return a.c_ == b.c_ || a.c_->entries == b.c_->entries;
  }
  return false;
}

std::string PickleValue::repr() const {
  switch (type_) {
    case Type::none: return "None";
    case Type::boolean: return b_ ? "True" : "False";
    case Type::integer: return big_ ? std::to_string(u_) : std::to_string(i_);
    case Type::floating: {
      char buf[40];
      std::snprintf(buf, sizeof buf, "%.17g", d_);
      return buf;
    }
    case Type::string:
    case Type::bytes: {
      std::string s(type_ == Type::bytes ? "b'" : "'");
      s.append(s_);
      s.push_back('\'');
      return s;
    }
    case Type::list:
    case Type::tuple: {
      std::string s = type_ == Type::list ? "[" : "(";
      for (std::size_t i = 0; i < c_->items.size(); ++i) {
        if (i) s += ", ";
        s += c_->items[i].repr();
      }
      if (type_ == Type::tuple && c_->items.size() == 1) s += ",";
      return s + (type_ == Type::list ? "]" : ")");
    }
    case Type::dict: {
      std::string s = "{";
      for (std::size_t i = 0; i < c_->entries.size(); ++i) {
        if (i) s += ", ";
        s += c_->entries[i].first.repr();
        s += ": ";
        s += c_->entries[i].second.repr();
      }
      return s + "}";
    }
  }
  return "?";
}

// ---- the parser ----

struct PickleParser {
  std::string_view in;
  const std::string& where;
  std::deque<PickleContainer>& arena;
  std::size_t pos = 0;
  std::size_t op_at = 0;
  unsigned char op = 0;
  std::vector<PickleValue> stack;
  std::vector<std::size_t> marks;
  std::vector<PickleValue> memo;
  std::unordered_map<std::uint64_t, PickleValue> sparse_memo;  // indices far past the end
  std::uint64_t max_weight;
  std::uint64_t values = 0;  // containers made and items placed: what the parse holds in memory
  int protocol = 0;

  PickleParser(std::string_view bytes, const std::string& w, std::deque<PickleContainer>& a)
      : in(bytes), where(w), arena(a), max_weight(std::max<std::uint64_t>(10'000'000, 64ull * bytes.size())) {}

  [[noreturn]] void fail(const std::string& what) const {
    char code[8];
    std::snprintf(code, sizeof code, "0x%02x", op);
    throw Error(ErrorKind::parse, where + ": byte " + std::to_string(op_at) + ", opcode " + code + " " +
                                      op_name(op) + ": " + what);
  }

  std::string_view take(std::uint64_t n) {
    if (n > in.size() - pos) fail("needs " + std::to_string(n) + " bytes, only " + std::to_string(in.size() - pos) + " left (truncated or corrupt)");
    std::string_view s = in.substr(pos, static_cast<std::size_t>(n));
    pos += static_cast<std::size_t>(n);
    return s;
  }

  std::uint64_t read_le(std::size_t n) {
    std::string_view s = take(n);
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(s[i])) << (8 * i);
    return v;
  }

  void push(const PickleValue& v) {
    if (stack.size() + marks.size() >= kMaxPickleStack) fail("stack deeper than " + std::to_string(kMaxPickleStack));
    stack.push_back(v);
  }

  // Index where the items above the last MARK start; the mark is removed.
  std::size_t pop_mark() {
    if (marks.empty()) fail("no MARK to match");
    std::size_t m = marks.back();
    marks.pop_back();
    return m;
  }

  // Every container and every placed item costs memory whether or not it expands (an empty list
  // weighs nothing in the expansion bound): the total is bounded by limits::kMaxPickleValues.
  void hold(std::uint64_t n) {
    values += n;
    if (values > limits::kMaxPickleValues)
      fail("more than " + std::to_string(limits::kMaxPickleValues) +
           " values (containers, items, keys, memo entries), the limit of one snapshot (docs/robustness.md)");
  }

  // Room for n more elements, growing geometrically: reserve(size + n) on every APPENDS of one
  // item would copy the list each time (quadratic in its length).
  template <typename V>
  static void grow(V& v, std::size_t n) {
    if (v.size() + n > v.capacity()) v.reserve(std::max(v.size() + n, 2 * v.capacity()));
  }

  PickleContainer& new_container(PickleValue::Type kind) {
    hold(1);
    PickleContainer& c = arena.emplace_back();
    c.kind = kind;
    return c;
  }

  static bool is_container(const PickleValue& v) {
    auto t = v.type();
    return t == PickleValue::Type::list || t == PickleValue::Type::tuple || t == PickleValue::Type::dict;
  }

  // Places `v` inside `parent`: seals v, checks for cycles, updates depth and weight.
  void adopt(PickleContainer& parent, const PickleValue& v) {
    if (is_container(v)) {
      auto* child = const_cast<PickleContainer*>(v.c_);
      if (child == &parent) fail("a container placed inside itself (recursive pickles are refused)");
      child->sealed = true;
      if (child->depth + 1 > kMaxPickleDepth) fail("nesting deeper than " + std::to_string(kMaxPickleDepth));
      parent.depth = std::max(parent.depth, child->depth + 1);
      parent.weight = saturating_add(parent.weight, child->weight);
    } else {
      parent.weight = saturating_add(parent.weight, 1);
    }
    if (parent.weight > max_weight) fail("the value expands to more than " + std::to_string(max_weight) + " nodes through shared references");
  }

  PickleContainer& target(PickleValue::Type kind, std::size_t index) {
    if (index >= stack.size() || (!marks.empty() && index < marks.back())) fail("stack underflow");
    PickleValue& t = stack[index];
    if (t.type() != kind) fail(std::string("expected a ") + type_name(kind) + " below the items, found " + type_name(t.type()));
    auto* c = const_cast<PickleContainer*>(t.c_);
    if (c->sealed) fail("a container changed after it was placed in another (recursive pickles are refused)");
    return *c;
  }

  void append_items(std::size_t from) {
    if (from == 0) fail("stack underflow: no list below the items");
    PickleContainer& list = target(PickleValue::Type::list, from - 1);
    hold(stack.size() - from);
    grow(list.items, stack.size() - from);
    for (std::size_t i = from; i < stack.size(); ++i) {
      adopt(list, stack[i]);
      list.items.push_back(stack[i]);
    }
    stack.resize(from);
  }

  void set_items(std::size_t from) {
    if (from == 0) fail("stack underflow: no dict below the items");
    if ((stack.size() - from) % 2 != 0) fail("odd number of items for a dict");
    PickleContainer& dict = target(PickleValue::Type::dict, from - 1);
    hold(stack.size() - from);
    grow(dict.entries, (stack.size() - from) / 2);
    for (std::size_t i = from; i < stack.size(); i += 2) {
      adopt(dict, stack[i]);
      adopt(dict, stack[i + 1]);
      dict.entries.emplace_back(stack[i], stack[i + 1]);
    }
    stack.resize(from);
  }

  void make_tuple(std::size_t from) {
    PickleContainer& t = new_container(PickleValue::Type::tuple);
    hold(stack.size() - from);
    t.items.reserve(stack.size() - from);
    for (std::size_t i = from; i < stack.size(); ++i) {
      adopt(t, stack[i]);
      t.items.push_back(stack[i]);
    }
    stack.resize(from);
    push(PickleValue::container(&t));
  }

  void tuple_n(std::size_t n) {
    if (stack.size() < n || (!marks.empty() && stack.size() - n < marks.back())) fail("stack underflow");
    make_tuple(stack.size() - n);
  }

  void memo_put(std::uint64_t index) {
    if (stack.empty() || (!marks.empty() && marks.back() == stack.size())) fail("nothing to memoize");
    const PickleValue& v = stack.back();
    if (index < memo.size()) {
      memo[index] = v;
    } else if (index == memo.size()) {
      hold(1);
      memo.push_back(v);
    } else {
      if (!sparse_memo.count(index)) hold(2);  // a hash node costs about two values
      sparse_memo[index] = v;
    }
  }

  void memo_get(std::uint64_t index) {
    if (index < memo.size()) return push(memo[index]);
    auto it = sparse_memo.find(index);
    if (it == sparse_memo.end()) fail("memo index " + std::to_string(index) + " was never stored");
    push(it->second);
  }

  PickleValue read_long(std::uint64_t n) {
    std::string_view s = take(n);
    if (n == 0) return PickleValue::integer(0);
    // Two's complement, little endian. Strip redundant sign bytes, then it must fit 64 bits
    // (or 65 for a positive value, kept as unsigned).
    const bool negative = static_cast<unsigned char>(s[n - 1]) & 0x80;
    std::size_t len = static_cast<std::size_t>(n);
    const unsigned char fill = negative ? 0xff : 0x00;
    while (len > 1 && static_cast<unsigned char>(s[len - 1]) == fill &&
           ((static_cast<unsigned char>(s[len - 2]) & 0x80) == (fill & 0x80)))
      --len;
    if (!negative && len == 9 && static_cast<unsigned char>(s[8]) == 0) len = 8;
    if (len > 8) fail("integer of " + std::to_string(n) + " bytes does not fit in 64 bits");
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < len; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(s[i])) << (8 * i);
    if (negative) {
      if (len < 8) v |= ~std::uint64_t{0} << (8 * len);
      return PickleValue::integer(static_cast<std::int64_t>(v));
    }
    return PickleValue::uinteger(v);
  }

  PickleValue run() {
    while (true) {
      op_at = pos;
      op = 0;
      if (pos >= in.size()) fail("end of input before STOP (truncated file)");
      op = static_cast<unsigned char>(in[pos++]);
      switch (op) {
        case PROTO: {
          protocol = static_cast<unsigned char>(take(1)[0]);
          if (protocol < 2 || protocol > 5) fail("protocol " + std::to_string(protocol) + " is not 2-5");
          break;
        }
        case FRAME: {
          std::uint64_t n = read_le(8);
          if (n > in.size() - pos) fail("frame of " + std::to_string(n) + " bytes runs past the end");
          break;  // frames only group opcodes; the bytes are read as they come
        }
        case STOP: {
          if (!marks.empty()) fail("STOP inside an open MARK");
          if (stack.size() != 1) fail("STOP with " + std::to_string(stack.size()) + " values on the stack, expected 1");
          return stack.back();
        }
        case MARK:
          if (stack.size() + marks.size() >= kMaxPickleStack) fail("stack deeper than " + std::to_string(kMaxPickleStack));
          marks.push_back(stack.size());
          break;
        case EMPTY_DICT: push(PickleValue::container(&new_container(PickleValue::Type::dict))); break;
        case EMPTY_LIST: push(PickleValue::container(&new_container(PickleValue::Type::list))); break;
        case EMPTY_TUPLE: push(PickleValue::container(&new_container(PickleValue::Type::tuple))); break;
        case APPEND: {
          if (stack.size() < 2 || (!marks.empty() && stack.size() - 1 <= marks.back())) fail("stack underflow");
          append_items(stack.size() - 1);
          break;
        }
        case APPENDS: append_items(pop_mark()); break;
        case SETITEM: {
          if (stack.size() < 3 || (!marks.empty() && stack.size() - 2 <= marks.back())) fail("stack underflow");
          set_items(stack.size() - 2);
          break;
        }
        case SETITEMS: set_items(pop_mark()); break;
        case TUPLE: make_tuple(pop_mark()); break;
        case TUPLE1: tuple_n(1); break;
        case TUPLE2: tuple_n(2); break;
        case TUPLE3: tuple_n(3); break;
        case BININT: push(PickleValue::integer(static_cast<std::int32_t>(static_cast<std::uint32_t>(read_le(4))))); break;
        case BININT1: push(PickleValue::integer(static_cast<std::int64_t>(read_le(1)))); break;
        case BININT2: push(PickleValue::integer(static_cast<std::int64_t>(read_le(2)))); break;
        case LONG1: {
          std::uint64_t n = read_le(1);
          push(read_long(n));
          break;
        }
        case LONG4: {
          auto n = static_cast<std::int32_t>(static_cast<std::uint32_t>(read_le(4)));
          if (n < 0) fail("negative length");
          push(read_long(static_cast<std::uint64_t>(n)));
          break;
        }
        case BINFLOAT: {
          std::string_view s = take(8);
          std::uint64_t bits = 0;
          for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<unsigned char>(s[i]);  // big endian
          push(PickleValue::floating(std::bit_cast<double>(bits)));
          break;
        }
        case SHORT_BINUNICODE: push(PickleValue::string(take(read_le(1)))); break;
        case BINUNICODE: push(PickleValue::string(take(read_le(4)))); break;
        case BINUNICODE8: push(PickleValue::string(take(read_le(8)))); break;
        case SHORT_BINBYTES: push(PickleValue::bytes(take(read_le(1)))); break;
        case BINBYTES: push(PickleValue::bytes(take(read_le(4)))); break;
        case BINBYTES8: push(PickleValue::bytes(take(read_le(8)))); break;
        case NEWTRUE: push(PickleValue::boolean(true)); break;
        case NEWFALSE: push(PickleValue::boolean(false)); break;
        case NONE: push(PickleValue()); break;
        case MEMOIZE: memo_put(memo.size()); break;
        case BINPUT: memo_put(read_le(1)); break;
        case LONG_BINPUT: memo_put(read_le(4)); break;
        case BINGET: memo_get(read_le(1)); break;
        case LONG_BINGET: memo_get(read_le(4)); break;
        default: fail("not supported (the reader takes plain values only)");
      }
    }
  }
};

const PackedFormat* packed_format(std::string_view head) noexcept {
  using namespace std::string_view_literals;
  static constexpr PackedFormat kFormats[] = {
      {"gzip", "gzip-compressed", "\x1f\x8b"sv, "1f 8b", "gunzip -k FILE"},
      {"bzip2", "bzip2-compressed", "BZh"sv, "42 5a 68", "bunzip2 -k FILE"},
      {"xz", "xz-compressed", "\xfd" "7zXZ\0"sv, "fd 37 7a 58 5a 00", "unxz -k FILE"},
      {"zstd", "zstd-compressed", "\x28\xb5\x2f\xfd"sv, "28 b5 2f fd", "unzstd FILE"},
      {"lz4", "lz4-compressed", "\x04\x22\x4d\x18"sv, "04 22 4d 18", "unlz4 FILE"},
      // (torch.save's format too; a snapshot is what torch.cuda.memory._dump_snapshot pickles)
      {"zip", "a zip archive", "PK\x03\x04"sv, "50 4b 03 04", "unzip FILE"},
  };
  for (const PackedFormat& f : kFormats)
    if (head.starts_with(f.magic)) return &f;
  return nullptr;
}

PickleDocument parse_pickle(std::string bytes, const std::string& where) {
  if (const PackedFormat* packed = packed_format(bytes))
    throw Error(ErrorKind::parse, where + ": " + packed->described + " (it opens with " + packed->name + "'s bytes " +
                                      packed->magic_hex + ", not a pickle's); unpack it first (" + packed->unpack +
                                      ") and give the .pickle that torch.cuda.memory._dump_snapshot wrote");
  PickleDocument doc;
  doc.bytes_ = std::make_unique<std::string>(std::move(bytes));
  doc.arena_ = std::make_unique<std::deque<PickleContainer>>();
  PickleParser parser(*doc.bytes_, where, *doc.arena_);
  doc.root_ = parser.run();
  doc.protocol_ = parser.protocol;
  return doc;
}

PickleDocument read_pickle_file(const std::string& path) {
  return parse_pickle(read_input_file(path, limits::kMaxSnapshotBytes, "snapshot pickle"), path);
}

}  // namespace membudget::diagnose
