// Bounded input reading, range-checked conversions, UTF-8 checks (include/membudget/input.hpp).
#include "membudget/input.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

namespace membudget {
namespace {

Error too_large(std::string_view what, std::string_view name, bytes_t limit) {
  return Error(ErrorKind::invalid_argument, std::string(name) + ": the " + std::string(what) + " is larger than " +
                                                format_bytes(limit) + " (" + std::to_string(limit) +
                                                " bytes), the limit membudget reads (docs/robustness.md)");
}

void append_stream(std::istream& in, std::string& out, bytes_t limit, std::string_view what, std::string_view name) {
  char buf[64 * 1024];
  while (in) {
    in.read(buf, sizeof buf);
    const auto got = static_cast<std::size_t>(in.gcount());
    if (got == 0) break;
    if (out.size() + got > limit) throw too_large(what, name, limit);
    out.append(buf, got);
  }
  if (in.bad()) throw Error(ErrorKind::io, std::string(name) + ": cannot read the " + std::string(what) + ": read failed");
}

}  // namespace

std::string read_input_stream(std::istream& in, bytes_t limit, std::string_view what, std::string_view name) {
  std::string out;
  append_stream(in, out, limit, what, name);
  return out;
}

std::string read_input_file(const std::string& path, bytes_t limit, std::string_view what) {
  const std::string w(what);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw Error(ErrorKind::io, "cannot read the " + w + " '" + path + "': " + std::strerror(errno));
  if (S_ISDIR(st.st_mode))
    throw Error(ErrorKind::io, "cannot read the " + w + " '" + path + "': it is a directory, not a file");
  // A regular file larger than the limit is refused before a byte is read; anything else (a pipe,
  // a character device) is read up to the limit.
  if (S_ISREG(st.st_mode) && static_cast<std::uint64_t>(st.st_size) > limit) throw too_large(what, path, limit);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::io, "cannot read the " + w + " '" + path + "': " + std::strerror(errno));
  std::string text;
  if (S_ISREG(st.st_mode)) text.reserve(static_cast<std::size_t>(st.st_size));
  append_stream(in, text, limit, what, path);
  return text;
}

std::string_view strip_bom(std::string_view text) noexcept {
  constexpr std::string_view kBom = "\xEF\xBB\xBF";
  return text.starts_with(kBom) ? text.substr(kBom.size()) : text;
}

bytes_t bytes_from_double(double v, std::string_view what) {
  // 2^64 is exactly representable; every double below it converts without overflow.
  constexpr double kTwo64 = 18446744073709551616.0;
  if (!(v >= 0.0 && v < kTwo64))
    throw Error(ErrorKind::overflow, std::string(what) + ": " + (std::isfinite(v) ? std::to_string(v) : std::string("not a number")) +
                                         " bytes is outside 0 .. 2^64-1; the sizes are absurd");
  return static_cast<bytes_t>(v);
}

namespace {

// The length of the well-formed UTF-8 sequence at text[i] (1-4), or 0 when there is none.
std::size_t utf8_length(std::string_view text, std::size_t i) noexcept {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  std::size_t n = 0;
  std::uint32_t cp = 0, min = 0;
  if ((c & 0xE0) == 0xC0) n = 2, cp = c & 0x1F, min = 0x80;
  else if ((c & 0xF0) == 0xE0) n = 3, cp = c & 0x0F, min = 0x800;
  else if ((c & 0xF8) == 0xF0) n = 4, cp = c & 0x07, min = 0x10000;
  else return 0;
  if (i + n > text.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

}  // namespace

bool valid_utf8(std::string_view text) noexcept {
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = utf8_length(text, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  char buf[16];
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = utf8_length(text, i);
    const auto c = static_cast<unsigned char>(text[i]);
    if (n == 0 || c < 0x20 || c == 0x7F) {
      std::snprintf(buf, sizeof buf, "\\x%02X", c);  // a control character or a stray byte
      out += buf;
      ++i;
      continue;
    }
    if (n == 2 && c == 0xC2 && static_cast<unsigned char>(text[i + 1]) < 0xA0) {  // C1: U+0080-U+009F
      std::snprintf(buf, sizeof buf, "\\u{%04X}", static_cast<unsigned char>(text[i + 1]));
      out += buf;
      i += 2;
      continue;
    }
    // the bidirectional controls (U+202A-U+202E, U+2066-U+2069) reorder the text a terminal shows
    if (n == 3 && c == 0xE2) {
      const auto c1 = static_cast<unsigned char>(text[i + 1]), c2 = static_cast<unsigned char>(text[i + 2]);
      if ((c1 == 0x80 && c2 >= 0xAA && c2 <= 0xAE) || (c1 == 0x81 && c2 >= 0xA6 && c2 <= 0xA9)) {
        std::snprintf(buf, sizeof buf, "\\u{%04X}", 0x2000u + ((c1 & 0x3Fu) << 6) + (c2 & 0x3Fu));
        out += buf;
        i += 3;
        continue;
      }
    }
    out.append(text.substr(i, n));
    i += n;
  }
  return out;
}

}  // namespace membudget
