// libFuzzer target: the YAML `job:` section (parse_job_section) on any text. A section that is
// read gives a job that validates or throws Error(invalid_job / unsupported); any other input is an
// Error(invalid_job / invalid_argument / parse), never a crash, hang or other exception.
// fuzz-requires: src/model/job_yaml.cpp src/model/job.cpp src/model/bytes.cpp
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "membudget/job_yaml.hpp"

using namespace membudget;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const Job j = parse_job_section(text, "fuzz.yaml", Job{});
    try {
      j.validate();
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::invalid_job && e.kind() != ErrorKind::unsupported) std::abort();
    }
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::invalid_job && e.kind() != ErrorKind::invalid_argument && e.kind() != ErrorKind::parse)
      std::abort();
  }
  return 0;
}
