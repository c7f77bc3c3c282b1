#include "pickle_writer.hpp"

#include <bit>

#include "membudget/error.hpp"

namespace membudget::diagnose {

namespace {
constexpr std::size_t kBatch = 1000;  // items per APPENDS / SETITEMS, as CPython's pickler
}

PickleWriter::PickleWriter() {
  put_u8(0x80);  // PROTO
  put_u8(2);
}

void PickleWriter::put_le(std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) put_u8(static_cast<unsigned>((v >> (8 * i)) & 0xff));
}

// Items of a dict or list go between MARK and SETITEMS / APPENDS; a batch closes every
// kBatch items (2 * kBatch values for a dict).
void PickleWriter::before_value() {
  if (open_.empty()) return;
  Open& o = open_.back();
  if (o.kind == Kind::tuple) return;
  const std::size_t limit = o.kind == Kind::dict ? 2 * kBatch : kBatch;
  if (o.marked && o.in_batch == limit) {
    put_u8(o.kind == Kind::dict ? 'u' : 'e');
    o.marked = false;
    o.in_batch = 0;
  }
  if (!o.marked) {
    put_u8('(');
    o.marked = true;
  }
  ++o.in_batch;
}

void PickleWriter::none() {
  before_value();
  put_u8('N');
}

void PickleWriter::boolean(bool b) {
  before_value();
  put_u8(b ? 0x88 : 0x89);
}

void PickleWriter::integer(std::int64_t v) {
  before_value();
  if (v >= 0 && v < 256) {
    put_u8('K');
    put_u8(static_cast<unsigned>(v));
  } else if (v >= 0 && v < 65536) {
    put_u8('M');
    put_le(static_cast<std::uint64_t>(v), 2);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    put_u8('J');
    put_le(static_cast<std::uint32_t>(static_cast<std::int32_t>(v)), 4);
  } else {
    // LONG1: the shortest little-endian two's complement that keeps the sign.
    auto u = static_cast<std::uint64_t>(v);
    int n = 8;
    while (n > 1) {
      auto top = static_cast<std::uint8_t>(u >> (8 * (n - 1)));
      auto next_sign = (u >> (8 * (n - 1) - 1)) & 1;
      if ((v < 0 && top == 0xff && next_sign) || (v >= 0 && top == 0 && !next_sign))
        --n;
      else
        break;
    }
    put_u8(0x8a);
    put_u8(static_cast<unsigned>(n));
    put_le(u, n);
  }
}

void PickleWriter::uinteger(std::uint64_t v) {
  if (v <= static_cast<std::uint64_t>(INT64_MAX)) return integer(static_cast<std::int64_t>(v));
  before_value();
  put_u8(0x8a);  // LONG1 with a zero sign byte
  put_u8(9);
  put_le(v, 8);
  put_u8(0);
}

void PickleWriter::floating(double v) {
  before_value();
  put_u8('G');
  auto bits = std::bit_cast<std::uint64_t>(v);
  for (int i = 7; i >= 0; --i) put_u8(static_cast<unsigned>((bits >> (8 * i)) & 0xff));
}

void PickleWriter::string(std::string_view s) {
  before_value();
  auto it = memo_.find(s);  // heterogeneous lookup: no copy for a repeat
  if (it != memo_.end()) {
    if (it->second < 256) {
      put_u8('h');  // BINGET
      put_u8(it->second);
    } else {
      put_u8('j');  // LONG_BINGET
      put_le(it->second, 4);
    }
    return;
  }
  if (s.size() > UINT32_MAX) throw Error(ErrorKind::invalid_argument, "pickle: string longer than 4 GiB");
  put_u8('X');  // BINUNICODE
  put_le(s.size(), 4);
  out_.append(s);
  const std::uint32_t index = next_memo_++;
  if (index < 256) {
    put_u8('q');  // BINPUT
    put_u8(index);
  } else {
    put_u8('r');  // LONG_BINPUT
    put_le(index, 4);
  }
  memo_.emplace(std::string(s), index);
}

void PickleWriter::begin_dict() {
  before_value();
  put_u8('}');
  open_.push_back(Open{Kind::dict});
}

void PickleWriter::begin_list() {
  before_value();
  put_u8(']');
  open_.push_back(Open{Kind::list});
}

void PickleWriter::begin_tuple() {
  before_value();
  put_u8('(');
  open_.push_back(Open{Kind::tuple});
}

void PickleWriter::end_container(Kind kind, char closing) {
  if (open_.empty() || open_.back().kind != kind)
    throw Error(ErrorKind::invalid_argument, "pickle writer: end of a container that is not open");
  Open o = open_.back();
  open_.pop_back();
  if (kind == Kind::dict && o.in_batch % 2 != 0)
    throw Error(ErrorKind::invalid_argument, "pickle writer: a dict key without a value");
  if (kind == Kind::tuple || o.marked) put_u8(static_cast<unsigned char>(closing));
}

void PickleWriter::end_dict() { end_container(Kind::dict, 'u'); }
void PickleWriter::end_list() { end_container(Kind::list, 'e'); }
void PickleWriter::end_tuple() { end_container(Kind::tuple, 't'); }

std::string PickleWriter::finish() {
  if (!open_.empty()) throw Error(ErrorKind::invalid_argument, "pickle writer: finish() with an open container");
  put_u8('.');
  return std::move(out_);
}

}  // namespace membudget::diagnose
