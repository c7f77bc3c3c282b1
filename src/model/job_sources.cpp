// Where a job's settings were given: job_sources.hpp.
#include "membudget/job_sources.hpp"

#include <algorithm>

namespace membudget {

void JobSources::note(std::string_view flag, std::string location, std::string key) {
  by_flag_.insert_or_assign(std::string(flag), Place{std::move(location), std::move(key)});
}

void JobSources::given_as_flag(std::string_view flag) {
  if (const auto it = by_flag_.find(flag); it != by_flag_.end()) by_flag_.erase(it);
}

std::vector<std::string> JobSources::flags() const {
  std::vector<std::string> out;
  for (const auto& [flag, place] : by_flag_) out.push_back(flag);
  return out;
}

Error JobSources::locate(const Error& e) const {
  const std::string message = e.what();
  std::string opening, listed;
  std::size_t rest = 0;  // where the message goes on after an opening flag replaced by its place
  std::vector<std::string_view> seen;
  for (std::size_t i = message.find("--"); i != std::string::npos; i = message.find("--", i)) {
    std::size_t end = i + 2;
    while (end < message.size() && ((message[end] >= 'a' && message[end] <= 'z') || message[end] == '-')) ++end;
    const std::string_view flag = std::string_view(message).substr(i, end - i);
    const auto it = by_flag_.find(flag);
    const bool repeat = std::find(seen.begin(), seen.end(), flag) != seen.end();
    if (it != by_flag_.end() && !repeat) {
      seen.push_back(flag);
      const Place& place = it->second;
      if (i == 0 && message.compare(end, 2, ": ") == 0) {
        opening = place.location + ": " + place.key;
        rest = end;
      } else {
        listed += (listed.empty() ? " (" : "; ") + std::string(flag) + " is " + place.key + " at " + place.location;
      }
    }
    i = end;
  }
  if (opening.empty() && listed.empty()) return e;
  return Error(e.kind(), (opening.empty() ? message : opening + message.substr(rest)) + (listed.empty() ? "" : listed + ")"));
}

}  // namespace membudget
