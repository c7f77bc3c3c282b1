#include "grid_flags.hpp"

#include <cctype>

#include "membudget/input.hpp"
#include "membudget/job.hpp"

namespace membudget::cli {
namespace {

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : text) {
    if (c == ',') {
      out.push_back(cur);
      cur.clear();
    } else if (!std::isspace(static_cast<unsigned char>(c))) {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

std::uint64_t number(const std::string& s, const char* option, const std::string& whole) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos)
    throw Error(ErrorKind::invalid_argument, std::string(option) + ": '" + whole +
                                                 "' is not a list like 1..64, 1..64:8 or 1024,2048");
  const std::uint64_t v = parse_count(s, option);  // (a value past 64 bits is absurdly large)
  if (v == 0) throw Error(ErrorKind::invalid_argument, std::string(option) + ": values must be at least 1");
  return v;
}

}  // namespace

std::vector<std::uint64_t> parse_count_list(const std::string& text, const char* option) {
  std::vector<std::uint64_t> out;
  auto too_many = [&] {
    return Error(ErrorKind::invalid_argument, std::string(option) + ": '" + text + "' has more than " +
                                                  std::to_string(limits::kMaxListValues) +
                                                  " values, the limit of one list; use a step (1..4096:64)");
  };
  for (const std::string& item : split(text)) {
    const auto dots = item.find("..");
    if (dots == std::string::npos) {
      if (out.size() >= limits::kMaxListValues) throw too_many();
      out.push_back(number(item, option, text));
      continue;
    }
    std::string rest = item.substr(dots + 2);
    std::uint64_t step = 1;
    if (auto colon = rest.find(':'); colon != std::string::npos) {
      const std::string step_text = rest.substr(colon + 1);
      if (!step_text.empty() && step_text.find_first_not_of('0') == std::string::npos)
        throw Error(ErrorKind::invalid_argument, std::string(option) + ": '" + item + "' has a step of 0 (give 1 or more)");
      step = number(step_text, option, text);
      rest = rest.substr(0, colon);
    }
    const std::uint64_t a = number(item.substr(0, dots), option, text), b = number(rest, option, text);
    if (b < a) throw Error(ErrorKind::invalid_argument, std::string(option) + ": '" + item + "' is an empty range");
    // Counted before a value is stored: (b - a) / step + 1 values.
    if ((b - a) / step >= limits::kMaxListValues - out.size()) throw too_many();
    for (std::uint64_t v = a;; v += step) {
      out.push_back(v);
      if (b - v < step) break;  // the next value would pass b
    }
  }
  return out;
}

std::vector<Precision> parse_precision_list(const std::string& text) {
  std::vector<Precision> out;
  for (const std::string& s : split(text)) out.push_back(parse_precision(s));
  return out;
}

std::vector<Recompute> parse_recompute_list(const std::string& text) {
  std::vector<Recompute> out;
  for (const std::string& s : split(text)) out.push_back(parse_recompute(s));
  return out;
}

}  // namespace membudget::cli
