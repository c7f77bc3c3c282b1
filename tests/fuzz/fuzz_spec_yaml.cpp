// libFuzzer target: the YAML spec loader and the YAML job section, on any text. A spec that loads
// must be valid (validate() passes) with a parameter count that is computed or an overflow; any
// other input is an Error of the kinds the loaders document, never a crash, hang or other exception.
// fuzz-requires: src/model/spec.cpp src/model/job_yaml.cpp
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "membudget/input.hpp"
#include "membudget/job_yaml.hpp"
#include "membudget/spec.hpp"
#include "spec_loader_checks.hpp"

using namespace membudget;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  return check_spec_loader([&] { return parse_model_yaml(text, "fuzz.yaml"); }, [](const ModelSpec& s) {
    if (s.sliding.window == 0 && s.sliding.every_nth != 1) std::abort();
  });
}
