#include "membudget/bytes.hpp"

#include <cctype>
#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdio>
#include <string>

namespace membudget {

std::string format_bytes(bytes_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

// The number is read exactly: its digits, decimal point and exponent become an integer D and a
// power of ten (value = D · 10^e), the unit a power of two or of ten, and the result is the
// nearest whole byte (halves up), computed in 128-bit integers. No double is involved, so
// 18446744073709551615 and 9007199254740993 come back as themselves, and every value from 2^63 up
// to 2^64 − 1 keeps its last digit. A value past 2^64 − 1, a negative one, or one with more
// digits than 128 bits can carry is refused.
bytes_t parse_bytes(std::string_view text, std::string_view what) {
  using u128 = unsigned __int128;
  auto fail = [&](const std::string& why) -> Error {
    return Error(ErrorKind::invalid_argument,
                 std::string(what) + ": '" + std::string(text) + "' " + why +
                     " (examples: 80GiB, 141GB, 24576MiB, 85899345920)");
  };
  auto digit = [&](std::size_t k) { return k < text.size() && std::isdigit(static_cast<unsigned char>(text[k])); };
  std::size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  if (i < text.size() && text[i] == '-') throw fail("is not a non-negative size");
  if (i < text.size() && text[i] == '+') ++i;
  // Mantissa: digits [. digits]; D collects the significant digits, `e` the power of ten.
  u128 d = 0;
  std::int64_t e = 0;
  std::size_t digits = 0, significant = 0;
  auto take = [&](int v, bool fraction) {
    ++digits;
    if (d == 0 && v == 0) {  // leading zeros carry nothing
      if (fraction) --e;
      return;
    }
    if (significant == 38) {  // 10^38 < 2^127: further digits must be zeros to stay exact
      if (v != 0) throw fail("has more digits than a byte count can hold exactly");
      if (!fraction) ++e;
      return;
    }
    d = d * 10 + static_cast<unsigned>(v);
    ++significant;
    if (fraction) --e;
  };
  for (; digit(i); ++i) take(text[i] - '0', false);
  if (i < text.size() && text[i] == '.') {
    ++i;
    for (; digit(i); ++i) take(text[i] - '0', true);
  }
  if (digits == 0) throw fail("is not a size");
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E') &&
      (digit(i + 1) || ((i + 1 < text.size() && (text[i + 1] == '+' || text[i + 1] == '-')) && digit(i + 2)))) {
    ++i;
    const bool negative = text[i] == '-';
    if (text[i] == '+' || text[i] == '-') ++i;
    std::int64_t x = 0;
    for (; digit(i); ++i) x = std::min<std::int64_t>(x * 10 + (text[i] - '0'), 100000);  // saturates
    e += negative ? -x : x;
  }
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::string unit;
  for (; i < text.size(); ++i) {
    if (std::isspace(static_cast<unsigned char>(text[i]))) break;
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  }
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  if (i != text.size()) throw fail("has trailing text");
  unsigned shift = 0;  // binary units: · 2^shift; decimal units: · 10^3k folded into e
  if (unit.empty() || unit == "b") shift = 0;
  else if (unit == "kib" || unit == "k") shift = 10;
  else if (unit == "mib" || unit == "m") shift = 20;
  else if (unit == "gib" || unit == "g") shift = 30;
  else if (unit == "tib" || unit == "t") shift = 40;
  else if (unit == "kb") e += 3;
  else if (unit == "mb") e += 6;
  else if (unit == "gb") e += 9;
  else if (unit == "tb") e += 12;
  else throw fail("has an unknown unit '" + unit + "'");
  if (d == 0) return 0;

  constexpr u128 kMax = std::numeric_limits<bytes_t>::max();
  auto overflow = [&] { return fail("overflows 64 bits (the largest size is 18446744073709551615 bytes)"); };
  u128 whole = 0, rounded = 0;
  if (e >= 0) {
    whole = d;
    for (std::int64_t k = 0; k < e; ++k) {
      if (whole > kMax) throw overflow();
      whole *= 10;
    }
    if (whole > kMax) throw overflow();
    if (shift && whole > (kMax >> shift)) throw overflow();
    rounded = whole << shift;
  } else {
    // value = d · 2^shift / 10^n: the whole part, then the fraction bit by bit (long division).
    const std::int64_t n = -e;
    if (n > 38) {  // 10^n exceeds 128 bits; d < 10^38 so the value is below 2^40 / 10
      if (n - static_cast<std::int64_t>(significant) > 20) return 0;  // below half a byte
      throw fail("has more digits than a byte count can hold exactly");
    }
    u128 p = 1;
    for (std::int64_t k = 0; k < n; ++k) p *= 10;
    whole = d / p;
    u128 r = d % p;
    if (whole > (kMax >> shift)) throw overflow();
    whole <<= shift;
    u128 frac = 0;
    for (unsigned k = 0; k < shift; ++k) {  // r < p ≤ 10^38 < 2^127: 2r never overflows
      r *= 2;
      frac *= 2;
      if (r >= p) {
        r -= p;
        frac += 1;
      }
    }
    rounded = whole + frac + (2 * r >= p ? 1 : 0);
    if (rounded > kMax) throw overflow();
  }
  return static_cast<bytes_t>(rounded);
}

}  // namespace membudget
