// A JSON input file with each key at most once per object (json_input.hpp).
#include "json_input.hpp"

#include <unordered_set>
#include <vector>

namespace membudget::detail {

nlohmann::json parse_json_once_per_key(std::string_view text, const std::string& where, ErrorKind kind) {
  using json = nlohmann::json;
  std::vector<std::unordered_set<std::string>> open;  // the keys seen in each object being read
  const json::parser_callback_t once = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      open.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      open.pop_back();
    } else if (event == json::parse_event_t::key && !open.empty()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!open.back().insert(key).second)
        throw Error(kind, where + ": key '" + (key.size() > 64 ? key.substr(0, 61) + "..." : key) +
                              "' is given twice in one object; give each key once");
    }
    return true;
  };
  return json::parse(text, once);
}

}  // namespace membudget::detail
