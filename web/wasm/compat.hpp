// compat.hpp: force-included into every translation unit of the wasm build (web/CMakeLists.txt).
// Debian's emscripten 3.1.6 ships a libc++ older than the C++20 library the native build uses
// (libstdc++ 12); what membudget needs from the gap is filled here, nothing else.
#pragma once

#include <bit>
#include <type_traits>

#if !defined(__cpp_lib_bit_cast)
namespace std {
// std::bit_cast as C++20 specifies it, over the compiler builtin libc++ itself uses.
template <class To, class From>
  requires(sizeof(To) == sizeof(From) && is_trivially_copyable_v<To> && is_trivially_copyable_v<From>)
constexpr To bit_cast(const From& from) noexcept {
  return __builtin_bit_cast(To, from);
}
}  // namespace std
#endif
