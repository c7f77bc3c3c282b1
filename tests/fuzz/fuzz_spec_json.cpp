// libFuzzer target: the Hugging Face config.json loader on any text. A config that loads must be a
// valid spec whose parameter count is computed or an overflow; any other input is an Error of the
// kinds the loader documents (a number like 1e400 is a parse error), never a crash, hang or other
// exception.
// fuzz-requires: src/model/spec.cpp
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "membudget/input.hpp"
#include "membudget/spec.hpp"
#include "spec_loader_checks.hpp"

using namespace membudget;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  return check_spec_loader([&] { return parse_hf_config(text, "fuzz.json"); }, [](const ModelSpec& s) {
    if (s.family.empty()) std::abort();  // model_type is required
  });
}
