// libFuzzer entry point for the snapshot pickle reader (src/diagnose/pickle.cpp).
// Build with clang: -fsanitize=fuzzer,address,undefined, linking the membudget library.
// Any input must either parse or throw membudget::Error(parse): never crash, hang or blow up.
// A parsed document is walked (iteratively, at most kVisits nodes: shared memo references make the
// expanded tree up to 64 x the input) to exercise the accessors on whatever came out.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "../../src/diagnose/pickle.hpp"
#include "membudget/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    auto doc = membudget::diagnose::parse_pickle(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
    using membudget::diagnose::PickleValue;
    const PickleValue& root = doc.root();
    if (root.depth() > membudget::diagnose::kMaxPickleDepth) std::abort();
    constexpr std::size_t kVisits = 1u << 20;
    std::vector<const PickleValue*> todo{&root};
    std::size_t visits = 0, chars = 0;
    while (!todo.empty() && visits++ < kVisits && todo.size() < kVisits) {
      const PickleValue* v = todo.back();
      todo.pop_back();
      switch (v->type()) {
        case PickleValue::Type::string: chars += v->as_string().size(); break;
        case PickleValue::Type::bytes: chars += v->as_bytes().size(); break;
        case PickleValue::Type::integer: (void)v->as_double(); break;
        case PickleValue::Type::list:
        case PickleValue::Type::tuple:
          for (const auto& item : v->items()) todo.push_back(&item);
          break;
        case PickleValue::Type::dict:
          (void)v->find("segments");
          for (const auto& [k, item] : v->entries()) {
            todo.push_back(&k);
            todo.push_back(&item);
          }
          break;
        default: break;
      }
    }
    (void)chars;
  } catch (const membudget::Error& e) {
    if (e.kind() != membudget::ErrorKind::parse) std::abort();
  }
  return 0;
}
