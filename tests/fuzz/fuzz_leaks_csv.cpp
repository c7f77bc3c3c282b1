// libFuzzer target: the steps.csv reader and detect_leak, on text and on raw 64-bit values.
// fuzz-requires: src/diagnose/leaks.cpp
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "membudget/leaks.hpp"

using namespace membudget;

namespace {

void check(const LeakReport& r, std::size_t n) {
  if (r.steps != n) std::abort();
  if (r.leak && (!r.start_step || r.growth_per_step < LeakOptions{}.min_growth)) std::abort();
  if (!r.leak && (r.start_step || r.growth_per_step != 0)) std::abort();
  (void)to_json(r);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const StepSeries s = read_steps_csv(text, "fuzz.csv");
    if (s.steps.size() != s.allocated.size() || s.allocated.empty()) std::abort();
    for (std::size_t i = 1; i < s.steps.size(); ++i)
      if (s.steps[i] <= s.steps[i - 1]) std::abort();
    check(detect_leak(s.allocated, s.steps), s.allocated.size());
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::parse) std::abort();
  }
  // The same bytes as a series of raw values: extreme sizes and differences.
  std::vector<bytes_t> values(size / sizeof(bytes_t));
  if (!values.empty()) std::memcpy(values.data(), data, values.size() * sizeof(bytes_t));
  check(detect_leak(values), values.size());
  return 0;
}
