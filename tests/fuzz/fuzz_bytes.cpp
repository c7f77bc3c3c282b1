// libFuzzer target: parse_bytes on any text. It either refuses with Error(invalid_argument) or
// returns a byte count that reads back exactly: the decimal digits of the result parse to the same
// value, in bytes and as the same count of KiB when the result is a whole number of KiB. A text of
// plain digits is checked against an independent 128-bit reading.
// fuzz-requires: src/model/bytes.cpp
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "membudget/bytes.hpp"

using namespace membudget;

namespace {

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  bytes_t v = 0;
  try {
    v = parse_bytes(text, "fuzz");
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::invalid_argument) std::abort();
    if (all_digits(text)) {  // refused digits must not fit 64 bits
      unsigned __int128 x = 0;
      for (char c : text) {
        x = x * 10 + static_cast<unsigned>(c - '0');
        if (x > UINT64_MAX) return 0;
      }
      std::abort();
    }
    return 0;
  }
  if (all_digits(text)) {
    unsigned __int128 x = 0;
    for (char c : text) x = x * 10 + static_cast<unsigned>(c - '0');  // < 2^64: it was accepted
    if (x != v) std::abort();
  }
  if (parse_bytes(std::to_string(v), "roundtrip") != v) std::abort();
  if (parse_bytes(std::to_string(v) + " B", "roundtrip") != v) std::abort();
  if (v % KiB == 0 && parse_bytes(std::to_string(v / KiB) + "KiB", "roundtrip") != v) std::abort();
  return 0;
}
