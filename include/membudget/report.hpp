// membudget/report.hpp: a Budget as a table, JSON, CSV or Markdown.
//
// The JSON is a contract (docs/json.md): all sizes are integer bytes, and the keys
// model, job, terms, breakdown, phases, step0, peak, peak_phase, device keep their names.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "membudget/budget.hpp"

namespace membudget {

enum class Format { table, json, csv, markdown };
Format parse_format(std::string_view s);

struct ReportOptions {
  Format format = Format::table;
  bool explain = false;     // list the tensors live at each phase peak
  std::size_t top = 8;      // tensors listed at the peak in the table
};

std::string render(const Budget& budget, const std::optional<Fit>& fit, const ReportOptions& options);
std::string to_json_string(const Budget& budget, const std::optional<Fit>& fit, bool explain = false, int indent = 2);
// `s` padded with spaces to `width` display columns (UTF-8 aware), for text tables.
std::string pad_columns(std::string s, std::size_t width);
// A parallel layout in words: "FSDP2 over 8 ranks (reshard after forward)", "DDP over 4 ranks", …
std::string layout_label(const Parallelism& p);

}  // namespace membudget
