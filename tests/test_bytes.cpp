#include <doctest/doctest.h>

#include <limits>

#include "membudget/bytes.hpp"

using namespace membudget;

TEST_CASE("checked arithmetic throws instead of wrapping") {
  CHECK(checked_mul(1ull << 31, 1ull << 31, "x") == (1ull << 62));
  CHECK_THROWS_AS(checked_mul(1ull << 32, 1ull << 32, "x"), Error);
  CHECK_THROWS_AS(checked_add(std::numeric_limits<bytes_t>::max(), 1, "x"), Error);
  CHECK(checked_product("p", 2, 3, 4) == 24);
  try {
    checked_mul(1ull << 40, 1ull << 40, "weights of layer 3");
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::overflow);
    CHECK(std::string(e.what()).find("weights of layer 3") != std::string::npos);
  }
}

TEST_CASE("the portable overflow test agrees with the compiler's checked arithmetic") {
  constexpr bytes_t max = std::numeric_limits<bytes_t>::max();
  const bytes_t values[] = {0, 1, 2, 3, 511, 512, 1ull << 31, 1ull << 32, (1ull << 32) + 1, 0xFFFFFFFFull,
                            1ull << 63, max / 3, max / 2, max / 2 + 1, max - 1, max};
  for (bytes_t a : values) {
    for (bytes_t b : values) {
      const unsigned __int128 exact_mul = static_cast<unsigned __int128>(a) * b;
      const unsigned __int128 exact_add = static_cast<unsigned __int128>(a) + b;
      bytes_t r = 0, p = 0;
      CHECK(detail::mul_overflows(a, b, r) == (exact_mul > max));
      CHECK(detail::mul_overflows_portable(a, b, p) == (exact_mul > max));
      CHECK(p == r);
      CHECK(detail::add_overflows(a, b, r) == (exact_add > max));
      CHECK(detail::add_overflows_portable(a, b, p) == (exact_add > max));
      CHECK(p == r);
    }
  }
  static_assert([] {
    bytes_t r = 0;
    return !detail::mul_overflows(1ull << 31, 1ull << 31, r) && r == (1ull << 62) &&
           detail::add_overflows(std::numeric_limits<bytes_t>::max(), 1, r);
  }(), "checked arithmetic is usable in constant expressions");
}

TEST_CASE("format_bytes uses binary units with two decimals") {
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(1023) == "1023 B");
  CHECK(format_bytes(1536) == "1.50 KiB");
  CHECK(format_bytes(80 * GiB) == "80.00 GiB");
}

TEST_CASE("parse_bytes accepts binary and decimal units") {
  CHECK(parse_bytes("80GiB") == 80 * GiB);
  CHECK(parse_bytes("80 GiB") == 80 * GiB);
  CHECK(parse_bytes("141GB") == 141000000000ull);
  CHECK(parse_bytes("1024") == 1024);
  CHECK(parse_bytes("1.5MiB") == 1572864);
  CHECK_THROWS_AS(parse_bytes("eighty"), Error);
  CHECK_THROWS_AS(parse_bytes("80 furlongs"), Error);
  CHECK_THROWS_AS(parse_bytes("-5GiB"), Error);
  CHECK_THROWS_AS(parse_bytes("1e30"), Error);
}
