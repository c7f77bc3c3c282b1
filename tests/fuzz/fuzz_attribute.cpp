// libFuzzer target: the snapshot trace decoder, the replay, attribute and snapshot leaks on any
// pickle. Any input must either work or throw membudget::Error(parse) (Error(unsupported) for a
// snapshot without a trace or step boundaries, in leaks); the groups must sum to the peak.
// fuzz-requires: src/diagnose/pickle.cpp src/diagnose/trace.cpp src/diagnose/attribute.cpp src/diagnose/snapshot_leaks.cpp src/diagnose/leaks.cpp
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "diagnose/attribute_internal.hpp"
#include "diagnose/pickle.hpp"
#include "diagnose/trace.hpp"
#include "membudget/snapshot_leaks.hpp"

using namespace membudget;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const auto snap = diagnose::decode_snapshot(diagnose::parse_pickle(bytes, "fuzz"), "fuzz");
    const Attribution a = diagnose::attribute_decoded(snap, nullptr, Job{});
    bytes_t groups = 0, terms = 0;
    for (const auto& g : a.groups) groups += g.bytes;
    for (auto v : a.measured) terms += v;
    if (groups != a.peak_bytes || terms != a.peak_bytes) std::abort();
    if (a.peak_bytes < a.before_recording || a.peak_bytes < a.end_bytes) std::abort();
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::parse) std::abort();
  }
  try {
    (void)to_json(snapshot_leaks(bytes, "fuzz"));
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::parse && e.kind() != ErrorKind::unsupported) std::abort();
  }
  return 0;
}
