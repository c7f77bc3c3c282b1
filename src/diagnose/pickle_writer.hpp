// src/diagnose/pickle_writer.hpp: a streaming writer of plain-values pickles (protocol 2).
//
// Emits exactly what pytorch.org/memory_viz and CPython read: PROTO 2; dict, list and tuple as
// EMPTY_DICT / EMPTY_LIST + MARK ... SETITEMS / APPENDS (batches of 1000 like CPython) and MARK ...
// TUPLE; ints as BININT1 / BININT2 / BININT / LONG1; floats as BINFLOAT; str as BINUNICODE; bool as
// NEWTRUE / NEWFALSE; None. Every distinct string is memoized (BINPUT) and repeated ones are BINGET,
// which keeps a snapshot's millions of "address" / "size" keys at two bytes each.
//
//   PickleWriter w;
//   w.begin_dict(); w.string("segments"); w.begin_list(); ... w.end_list(); w.end_dict();
//   std::string bytes = w.finish();
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace membudget::diagnose {

class PickleWriter {
 public:
  PickleWriter();

  void none();
  void boolean(bool b);
  void integer(std::int64_t v);
  void uinteger(std::uint64_t v);
  void floating(double v);
  void string(std::string_view s);

  // A dict's contents are written as key, value, key, value, ...
  void begin_dict();
  void end_dict();
  void begin_list();
  void end_list();
  void begin_tuple();
  void end_tuple();

  // Appends STOP and returns the bytes; throws Error(invalid_argument) if a container is open.
  std::string finish();

 private:
  enum class Kind { dict, list, tuple };
  struct Open {
    Kind kind;
    std::size_t in_batch = 0;  // values written since the batch's MARK
    bool marked = false;
  };

  void before_value();
  void end_container(Kind kind, char closing);
  void put_u8(unsigned v) { out_.push_back(static_cast<char>(v)); }
  void put_le(std::uint64_t v, int n);

  std::string out_;
  std::vector<Open> open_;
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, std::uint32_t, Hash, std::equal_to<>> memo_;
  std::uint32_t next_memo_ = 0;
};

}  // namespace membudget::diagnose
