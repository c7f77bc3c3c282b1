// membudget/bytes.hpp: byte counts that cannot overflow silently, and their human form.
//
// All sizes in membudget are std::uint64_t bytes. Every product or sum that builds a size goes
// through checked_mul / checked_add, which throw Error(overflow) naming what was being computed
// instead of wrapping around: a 405B model with a 1M-token batch must be an error, not a small
// number.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "membudget/error.hpp"

namespace membudget {

using bytes_t = std::uint64_t;

inline constexpr bytes_t KiB = 1024ull;
inline constexpr bytes_t MiB = 1024ull * KiB;
inline constexpr bytes_t GiB = 1024ull * MiB;

namespace detail {

// a × b and a + b into r; true when the exact result does not fit 64 bits. The compiler's checked
// arithmetic where it has it (GCC >= 5, Clang), else the portable division / wrap-around test;
// both are always defined so that tests can compare them.
constexpr bool mul_overflows_portable(bytes_t a, bytes_t b, bytes_t& r) noexcept {
  r = a * b;  // unsigned: wraps, never undefined
  return a != 0 && r / a != b;
}
constexpr bool add_overflows_portable(bytes_t a, bytes_t b, bytes_t& r) noexcept {
  r = a + b;
  return r < a;
}

#if defined(__has_builtin)
#if __has_builtin(__builtin_mul_overflow) && __has_builtin(__builtin_add_overflow)
#define MEMBUDGET_OVERFLOW_BUILTINS 1
#endif
#elif defined(__GNUC__) && __GNUC__ >= 5
#define MEMBUDGET_OVERFLOW_BUILTINS 1
#endif

#ifdef MEMBUDGET_OVERFLOW_BUILTINS
constexpr bool mul_overflows(bytes_t a, bytes_t b, bytes_t& r) noexcept { return __builtin_mul_overflow(a, b, &r); }
constexpr bool add_overflows(bytes_t a, bytes_t b, bytes_t& r) noexcept { return __builtin_add_overflow(a, b, &r); }
#else
constexpr bool mul_overflows(bytes_t a, bytes_t b, bytes_t& r) noexcept { return mul_overflows_portable(a, b, r); }
constexpr bool add_overflows(bytes_t a, bytes_t b, bytes_t& r) noexcept { return add_overflows_portable(a, b, r); }
#endif

[[noreturn]] inline void throw_overflow(std::string_view what) {
  throw Error(ErrorKind::overflow, std::string(what) + ": byte count overflows 64 bits; the sizes are absurd");
}

}  // namespace detail

inline bytes_t checked_mul(bytes_t a, bytes_t b, std::string_view what) {
  bytes_t r = 0;
  if (detail::mul_overflows(a, b, r)) detail::throw_overflow(what);
  return r;
}

inline bytes_t checked_add(bytes_t a, bytes_t b, std::string_view what) {
  bytes_t r = 0;
  if (detail::add_overflows(a, b, r)) detail::throw_overflow(what);
  return r;
}

// Product of several factors, each checked.
template <typename... Ts>
bytes_t checked_product(std::string_view what, bytes_t first, Ts... rest) {
  bytes_t r = first;
  ((r = checked_mul(r, static_cast<bytes_t>(rest), what)), ...);
  return r;
}

// "1.50 GiB", "512 B", "12.00 MiB" (binary units, two decimals, as PyTorch prints them).
std::string format_bytes(bytes_t bytes);

// Parses "80GiB", "80 GiB", "80GB" (decimal), "141e9", "1024", "512MiB". Throws Error(invalid_argument).
bytes_t parse_bytes(std::string_view text, std::string_view what = "size");

}  // namespace membudget
