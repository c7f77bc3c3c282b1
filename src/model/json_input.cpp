// A JSON input file with each key at most once per object and no number read as another
// (json_input.hpp).
#include "json_input.hpp"

#include <cmath>
#include <unordered_set>
#include <vector>

namespace membudget::detail {
namespace {

using json = nlohmann::json;

// What nlohmann's DOM parse lets through, seen in a SAX pass over the same text: a key given twice
// in one object (the DOM keeps the last) and a number whose digits are not zero read as 0 or a
// denormal (`1e-400`: strtod's underflow, which would silently mean "none" for a soft-cap). A
// malformed text stops the pass; the DOM parse then reports it with its position.
class InputChecks : public nlohmann::json_sax<json> {
 public:
  InputChecks(const std::string& where, ErrorKind kind) : where_(where), kind_(kind) {}

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t v, const string_t& text) override {
    if (v != 0 && std::fpclassify(v) != FP_SUBNORMAL) return true;
    const std::string mantissa = text.substr(0, text.find_first_of("eE"));
    if (mantissa.find_first_of("123456789") != std::string::npos)
      throw Error(kind_, where_ + ": the number " + text.substr(0, 64) + " is too small for a double (it would be read as " +
                             (v == 0 ? "0" : "a denormal") + ")");
    return true;
  }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    open_.emplace_back();
    return true;
  }
  bool key(string_t& key) override {
    if (!open_.back().insert(key).second)
      throw Error(kind_, where_ + ": key '" + (key.size() > 64 ? key.substr(0, 61) + "..." : key) +
                             "' is given twice in one object; give each key once");
    return true;
  }
  bool end_object() override {
    open_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  const std::string& where_;
  ErrorKind kind_;
  std::vector<std::unordered_set<std::string>> open_;  // the keys seen in each object being read
};

}  // namespace

nlohmann::json parse_json_once_per_key(std::string_view text, const std::string& where, ErrorKind kind) {
  InputChecks checks(where, kind);
  json::sax_parse(text, &checks);  // (a malformed text stops it: the parse below throws, with the position)
  return json::parse(text);
}

}  // namespace membudget::detail
