// The lists' numbers in a job's key (job_key.hpp).
#include "job_key.hpp"

#include <unordered_map>

namespace membudget::detail {
namespace {
struct ListHash {
  std::size_t operator()(const std::vector<std::uint64_t>& list) const noexcept {
    std::uint64_t h = list.size();
    for (std::uint64_t v : list) h = (h ^ v) * 0x100000001b3ull;
    return static_cast<std::size_t>(h ^ (h >> 29));
  }
};
// (a thread asks about a handful of layer lists; a program that makes a new one per question
// forgets them in lots of this many)
constexpr std::size_t kListsRemembered = 4096;
}  // namespace

std::uint64_t list_number(const std::vector<std::uint64_t>& list) {
  if (list.empty()) return 0;
  thread_local std::unordered_map<std::vector<std::uint64_t>, std::uint64_t, ListHash> numbers;
  thread_local std::uint64_t given = 0;
  if (const auto it = numbers.find(list); it != numbers.end()) return it->second;
  if (numbers.size() >= kListsRemembered) numbers.clear();
  return numbers.emplace(list, ++given).first->second;
}

}  // namespace membudget::detail
