// Leak detection on allocated-bytes-per-step series, and the steps.csv reader (see leaks.hpp).
#include "membudget/leaks.hpp"
#include "membudget/input.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "json_out.hpp"

namespace membudget {

namespace {

using diff_t = __int128;  // a difference of two 64-bit byte counts

template <typename T>
T median_of(std::vector<T> v) {  // lower median; v non-empty
  auto mid = v.begin() + static_cast<std::ptrdiff_t>((v.size() - 1) / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

// Robust standard deviation of the step-to-step differences, from the second differences: a
// staircase (constant differences) has none, however long its flat prefix, while white noise of
// standard deviation s in the series gives second differences of deviation s*sqrt(6), i.e.
// differences of deviation s*sqrt(2) = that / sqrt(3).
long double noise_of(const std::vector<diff_t>& d) {
  if (d.size() < 2) return 0;
  std::vector<long double> e;
  e.reserve(d.size() - 1);
  for (std::size_t i = 0; i + 1 < d.size(); ++i) e.push_back(static_cast<long double>(d[i + 1] - d[i]));
  long double m = median_of(e);
  for (auto& x : e) x = std::fabs(x - m);
  return 1.4826L * median_of(e) / std::sqrt(3.0L);
}

std::string bytes_text(diff_t v) {
  std::string sign = v < 0 ? "-" : "";
  sign += format_bytes(static_cast<bytes_t>(v < 0 ? -v : v));
  return sign;
}

}  // namespace

LeakReport detect_leak(std::span<const bytes_t> a, std::span<const std::int64_t> steps,
                       const LeakOptions& opt) {
  if (!steps.empty() && steps.size() != a.size())
    throw Error(ErrorKind::invalid_argument,
                "detect_leak: " + std::to_string(steps.size()) + " step labels for " +
                    std::to_string(a.size()) + " values");
  const std::size_t min_run = std::max<std::size_t>(opt.min_run, 1);
  auto label = [&](std::size_t i) { return steps.empty() ? static_cast<std::int64_t>(i) : steps[i]; };
  LeakReport r;
  r.steps = a.size();
  if (a.size() < min_run + 1) {
    r.explanation = "only " + std::to_string(a.size()) + " steps: at least " +
                    std::to_string(min_run + 1) + " are needed to tell a staircase from a jump";
    return r;
  }
  std::vector<diff_t> d(a.size() - 1);
  for (std::size_t i = 0; i + 1 < a.size(); ++i)
    d[i] = static_cast<diff_t>(a[i + 1]) - static_cast<diff_t>(a[i]);
  const long double noise = noise_of(d);
  const long double threshold = 3 * noise;
  auto grows = [&](diff_t x) {
    return x >= static_cast<diff_t>(opt.min_growth) && static_cast<long double>(x) > threshold;
  };

  // The run of growing steps that reaches the end of the series.
  std::size_t s = d.size();
  while (s > 0 && grows(d[s - 1])) --s;
  const std::size_t run = d.size() - s;
  if (run < min_run) {
    r.explanation = "flat: the last " + std::to_string(min_run) +
                    " steps do not all grow by at least " +
                    format_bytes(std::max<bytes_t>(
                        opt.min_growth,
                        static_cast<bytes_t>(std::llround(std::min(threshold, 1e18L))))) +
                    " (the noise level)";
    return r;
  }
  // A one-time jump at the start of the run (optimizer state) is not part of the staircase:
  // leading steps above 3x the run's median are trimmed (one median, so this stays linear).
  {
    const diff_t run_med = median_of(std::vector<diff_t>(d.begin() + static_cast<std::ptrdiff_t>(s), d.end()));
    while (d.size() - s > min_run && d[s] > 3 * run_med) ++s;
  }
  std::vector<diff_t> tail(d.begin() + static_cast<std::ptrdiff_t>(s), d.end());
  const diff_t med = median_of(tail);
  // A new high-water mark: a sawtooth climbing back to earlier heights is not a leak.
  bytes_t peak_before = 0;
  for (std::size_t i = 0; i < s; ++i) peak_before = std::max(peak_before, a[i]);
  if (s > 0 && !grows(static_cast<diff_t>(a.back()) - static_cast<diff_t>(peak_before))) {
    r.explanation = "the last " + std::to_string(d.size() - s) +
                    " steps grow but stay below the earlier peak of " + format_bytes(peak_before) +
                    " (a sawtooth, not a leak)";
    return r;
  }
  r.leak = true;
  r.growth_per_step = static_cast<bytes_t>(med);
  r.start_step = label(s);
  r.growth_total = a.back() - a[s];
  r.explanation = "allocated grows by " + bytes_text(med) + " per step from step " +
                  std::to_string(label(s)) + " on (" + std::to_string(d.size() - s) +
                  " steps in a row, " + format_bytes(r.growth_total) + " in total)";
  if (s > 0 && d[s - 1] > 3 * med && grows(d[s - 1]))
    r.explanation += "; the jump of " + bytes_text(d[s - 1]) + " before it is a one-time "
                     "allocation (optimizer state), not counted";
  return r;
}

// ---------------------------------------------------------------------------------------------
// steps.csv

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = trim(s.substr(1, s.size() - 2));
  return s;
}

std::vector<std::string_view> split_fields(std::string_view line) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  for (;;) {
    std::size_t comma = line.find(',', start);
    out.push_back(trim(line.substr(start, comma == std::string_view::npos ? std::string_view::npos
                                                                          : comma - start)));
    if (comma == std::string_view::npos) return out;
    start = comma + 1;
  }
}

std::string lower(std::string_view s) {
  std::string o(s);
  for (auto& c : o) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return o;
}

std::string shown(std::string_view s) {  // a field quoted in an error, kept short and printable
  std::string o;
  for (char c : s.substr(0, 40)) o += std::isprint(static_cast<unsigned char>(c)) ? c : '?';
  return s.size() > 40 ? o + "..." : o;
}

}  // namespace

StepSeries read_steps_csv(std::string_view text, std::string_view name) {
  if (text.starts_with("\xEF\xBB\xBF")) text.remove_prefix(3);  // UTF-8 byte order mark
  StepSeries out;
  std::optional<std::size_t> alloc_col, step_col;
  std::string alloc_name = "allocated", step_name = "step";
  std::size_t line_no = 0;
  auto where = [&](std::size_t column, const std::string& col_name) {
    return std::string(name) + ":" + std::to_string(line_no) + ": column " +
           std::to_string(column + 1) + " (" + col_name + ")";
  };
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = trim(text.substr(start, end - start));
    start = end + 1;
    ++line_no;
    if (line.empty() || line.front() == '#') continue;
    auto fields = split_fields(line);

    if (!alloc_col) {  // the first line decides the layout
      const char first = fields[0].empty() ? ' ' : fields[0].front();
      const bool header = !(std::isdigit(static_cast<unsigned char>(first)) || first == '.' ||
                            first == '+' || first == '-');
      if (header) {
        for (std::size_t i = 0; i < fields.size(); ++i) {
          std::string n = lower(fields[i]);
          if (n == "allocated") alloc_col = i;
          if (n == "step" || n == "iteration" || n == "iter") step_col = step_col ? step_col : i;
        }
        for (std::size_t i = 0; !alloc_col && i < fields.size(); ++i)
          if (lower(fields[i]).find("allocated") != std::string::npos) alloc_col = i;
        if (!alloc_col && fields.size() == 1) alloc_col = 0;
        if (!alloc_col) {
          std::string cols;
          for (auto f : fields) cols += (cols.empty() ? "'" : ", '") + shown(f) + "'";
          throw Error(ErrorKind::parse,
                      std::string(name) + ":" + std::to_string(line_no) +
                          ": no 'allocated' column in the header (columns: " + cols +
                          "); expected 'step,allocated' or one column of bytes");
        }
        alloc_name = shown(fields[*alloc_col]);
        if (step_col) step_name = shown(fields[*step_col]);
        continue;
      }
      if (fields.size() == 1) {
        alloc_col = 0;
      } else {
        step_col = 0;
        alloc_col = 1;
      }
    }

    std::size_t needed = std::max(*alloc_col, step_col.value_or(0)) + 1;
    if (fields.size() < needed)
      throw Error(ErrorKind::parse, std::string(name) + ":" + std::to_string(line_no) +
                                        ": expected " + std::to_string(needed) +
                                        " columns, found " + std::to_string(fields.size()));

    std::string_view av = fields[*alloc_col];
    if (av.empty())
      throw Error(ErrorKind::parse, where(*alloc_col, alloc_name) + ": empty; expected bytes");
    bytes_t bytes = 0;
    try {
      bytes = parse_bytes(av, "allocated");
    } catch (const Error&) {
      throw Error(ErrorKind::parse, where(*alloc_col, alloc_name) + ": '" + shown(av) +
                                        "' is not a byte count (examples: 1073741824, 1.5 GiB)");
    }

    std::int64_t step = static_cast<std::int64_t>(out.allocated.size());
    if (step_col) {
      std::string_view sv = fields[*step_col];
      std::size_t i = (sv.starts_with('-') || sv.starts_with('+')) ? 1 : 0;
      bool ok = i < sv.size() && sv.size() - i <= 18;
      std::int64_t v = 0;
      for (; ok && i < sv.size(); ++i) {
        if (!std::isdigit(static_cast<unsigned char>(sv[i]))) ok = false;
        else v = v * 10 + (sv[i] - '0');
      }
      if (!ok)
        throw Error(ErrorKind::parse, where(*step_col, step_name) + ": '" + shown(sv) +
                                          "' is not an integer step");
      step = sv.starts_with('-') ? -v : v;
      if (!out.steps.empty() && step <= out.steps.back())
        throw Error(ErrorKind::parse, where(*step_col, step_name) + ": step " +
                                          std::to_string(step) + " after step " +
                                          std::to_string(out.steps.back()) +
                                          "; steps must increase");
    }
    out.steps.push_back(step);
    out.allocated.push_back(bytes);
  }
  if (out.allocated.empty())
    throw Error(ErrorKind::parse, std::string(name) + ": no data rows (expected 'step,allocated' "
                                                      "lines of bytes allocated after each step)");
  return out;
}

StepSeries read_steps_csv_file(const std::string& path) {
  return read_steps_csv(read_input_file(path, limits::kMaxCsvBytes, "steps CSV"), path);
}

nlohmann::json diagnose::leak_json(const LeakReport& r) {
  return nlohmann::json{
      {"leak", r.leak},
      {"growth_per_step", r.growth_per_step},
      {"start_step", r.start_step ? nlohmann::json(*r.start_step) : nlohmann::json(nullptr)},
      {"steps", r.steps},
      {"growth_total", r.growth_total},
      {"explanation", r.explanation}};
}

std::string to_json(const LeakReport& report, int indent) { return diagnose::dump(diagnose::leak_json(report), indent); }

}  // namespace membudget
