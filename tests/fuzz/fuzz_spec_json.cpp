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

using namespace membudget;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const ModelSpec s = parse_hf_config(text, "fuzz.json");
    s.validate();
    if (!valid_utf8(s.name) || s.family.empty()) std::abort();
    try {
      (void)s.parameters();
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::overflow) std::abort();
    }
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::invalid_spec && e.kind() != ErrorKind::parse && e.kind() != ErrorKind::overflow &&
        e.kind() != ErrorKind::unsupported)
      std::abort();
  }
  return 0;
}
