#include "membudget/bytes.hpp"

#include <cctype>
#include <cmath>
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

bytes_t parse_bytes(std::string_view text, std::string_view what) {
  auto fail = [&](const std::string& why) -> Error {
    return Error(ErrorKind::invalid_argument,
                 std::string(what) + ": '" + std::string(text) + "' " + why +
                     " (examples: 80GiB, 141GB, 24576MiB, 85899345920)");
  };
  std::size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::size_t start = i;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.' ||
                             text[i] == 'e' || text[i] == 'E' || text[i] == '+'))
    ++i;
  if (i == start) throw fail("is not a size");
  std::string number(text.substr(start, i - start));
  double value = 0;
  try {
    std::size_t used = 0;
    value = std::stod(number, &used);
    if (used != number.size()) throw fail("is not a size");
  } catch (const std::logic_error&) {
    throw fail("is not a size");
  }
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::string unit;
  for (; i < text.size(); ++i) {
    if (std::isspace(static_cast<unsigned char>(text[i]))) break;
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  }
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  if (i != text.size()) throw fail("has trailing text");
  double mult = 1;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "kib" || unit == "k") mult = 1024.0;
  else if (unit == "mib" || unit == "m") mult = 1024.0 * 1024;
  else if (unit == "gib" || unit == "g") mult = 1024.0 * 1024 * 1024;
  else if (unit == "tib" || unit == "t") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb") mult = 1e3;
  else if (unit == "mb") mult = 1e6;
  else if (unit == "gb") mult = 1e9;
  else if (unit == "tb") mult = 1e12;
  else throw fail("has an unknown unit '" + unit + "'");
  double total = value * mult;
  if (!std::isfinite(total) || total < 0) throw fail("is not a non-negative size");
  if (total >= 1.8e19) throw fail("overflows 64 bits");
  return static_cast<bytes_t>(std::llround(total));
}

}  // namespace membudget
