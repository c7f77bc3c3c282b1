// libFuzzer target: parse_oom_message on arbitrary text, then classify and serialise what it read.
// fuzz-requires: src/diagnose/oom.cpp
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "membudget/oom.hpp"

using namespace membudget;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const OomReport r = parse_oom_message(text);
    // What the parser promises.
    if (r.line < 1) std::abort();
    if (r.reserved_derived && r.reserved != r.allocated + r.reserved_unallocated) std::abort();
    if (r.reserved_unallocated_derived &&
        r.reserved_unallocated != (r.reserved > r.allocated ? r.reserved - r.allocated : 0))
      std::abort();
    if (r.non_pytorch() > r.capacity) std::abort();
    for (std::uint64_t step : {0ull, 1ull, 7ull}) {
      for (OomPhase phase : {OomPhase::unknown, OomPhase::train, OomPhase::eval}) {
        OomContext ctx{step, phase, step == 7};
        const OomDiagnosis d = classify(r, ctx);
        if (d.first_fix.empty() || d.situation.empty()) std::abort();
      }
    }
    (void)to_json(r);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::parse) std::abort();  // bad text is a parse error, nothing else
  }
  return 0;
}
