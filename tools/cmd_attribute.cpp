// membudget attribute snapshot.pickle [--model MODEL job flags]: who holds the memory at the peak.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "job_flags.hpp"
#include "membudget/attribute.hpp"
#include "membudget/input.hpp"
#include "membudget/plot.hpp"

namespace membudget::cli {
namespace {

std::string gib(bytes_t v) {
  char buf[32];
  if (v >= GiB) std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(v) / static_cast<double>(GiB));
  else std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(v) / static_cast<double>(MiB));
  return buf;
}

std::string tail(const std::string& s, std::size_t w) {
  if (s.size() <= w) return s + std::string(w - s.size(), ' ');
  return "…" + s.substr(s.size() - (w - 1));
}

std::string pad(std::string s, std::size_t w) {
  if (s.size() < w) s.append(w - s.size(), ' ');
  return s;
}

Registrar reg("attribute", 50, [](CLI::App& app) {
  auto flags = std::make_shared<JobFlags>();
  auto path = std::make_shared<std::string>();
  auto top = std::make_shared<std::size_t>(20);
  auto top_text = std::make_shared<std::string>();
  auto plot = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "attribute", "the live allocations at the peak of a torch.cuda.memory._dump_snapshot, by frame and budget term");
  cmd->add_option("snapshot", *path, "snapshot pickle written by torch.cuda.memory._dump_snapshot")->required();
  cmd->add_option("--model", flags->model_path, "model spec, to print the predicted bytes per term beside");
  cmd->add_option("--top", *top_text, "groups listed in the table (default 20)");
  cmd->add_option("--plot", *plot, "with --model: draw the snapshot and the predicted step on one chart (SVG)");
  flags->add_job_options(cmd);
  cmd->get_option("--format")->description("table (default) | json");  // of the shared flags' four, the two it writes
  cmd->callback([flags, path, top, top_text, plot, cmd] {
    if (cmd->count("--top")) *top = parse_whole(*top_text, "--top", 0, 1u << 20);
    refuse_given(*cmd, {"--device", "--device-memory", "--headroom"}, "attribute reads a snapshot; it checks no card");
    if (flags->model_path.empty())
      for (const std::string& flag : flags->given_job_flags())
        throw Error(ErrorKind::invalid_argument, flag + ": describes the job of --model; give --model SPEC");
    require_one_of(flags->format, "--format", {"table", "json"});
    const Format format = parse_format(flags->format);
    AttributeOptions opts;
    if (!flags->model_path.empty()) {
      opts.model = flags->model();
      opts.job = flags->job(*opts.model);
    }
    if (!plot->empty() && !opts.model) throw Error(ErrorKind::invalid_argument, "--plot: draws the prediction beside the snapshot; give --model SPEC");
    if (*plot == "-") throw Error(ErrorKind::invalid_argument, "--plot: give a file name (the report is standard output)");
    const Attribution a = attribute_snapshot_file(*path, opts);
    if (!plot->empty()) {  // written before the report: a failure leaves no half answer
      const std::string svg = render_attribution_svg(*opts.model, predict(*opts.model, opts.job), a);
      std::ofstream out(*plot, std::ios::binary);
      if (!out || !(out << svg) || !out.flush()) throw Error(ErrorKind::io, "--plot: cannot write " + *plot);
    }
    if (format == Format::json) {
      nlohmann::ordered_json j;
      j["device"] = a.device;
      j["trace_entries"] = a.trace_entries;
      j["peak_bytes"] = a.peak_bytes;
      j["peak_time_us"] = a.peak_time_us;
      j["peak_index"] = a.peak_index;
      j["before_recording_bytes"] = a.before_recording;
      j["end_bytes"] = a.end_bytes;
      j["inconsistent_events"] = a.inconsistent_events;
      auto& g = j["groups"] = nlohmann::ordered_json::array();
      for (const auto& x : a.groups)
        g.push_back({{"frame", x.frame}, {"bytes", x.bytes}, {"count", x.count}, {"term", to_string(x.term)}});
      auto& t = j["terms"] = nlohmann::ordered_json::object();
      for (std::size_t i = 0; i < kMemoryTerms; ++i) {
        nlohmann::ordered_json row = {{"measured", a.measured[i]}};
        row["predicted"] = a.predicted ? nlohmann::ordered_json((*a.predicted)[i]) : nlohmann::ordered_json();
        t[to_string(static_cast<MemoryTerm>(i))] = row;
      }
      if (a.predicted) {
        j["predicted_peak"] = a.predicted_peak;
        j["predicted_phase"] = a.predicted_phase;
      }
      // frames come from the file: invalid UTF-8 is replaced, not fatal
      std::cout << j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
      return;
    }
    std::cout << printable(*path) << ": device " << a.device << ", " << a.trace_entries << " trace entries\n";
    if (!a.has_trace)
      std::cout << "no allocation trace (record with torch.cuda.memory._record_memory_history()): the live blocks "
                   "at the snapshot are shown\n";
    std::cout << "peak allocated " << gib(a.peak_bytes) << " (" << a.peak_bytes << " bytes) ";
    if (!a.has_trace)
      std::cout << "at the snapshot (it has no trace); ";
    else if (a.peak_index < 0)
      std::cout << "before the trace's first event; ";
    else
      std::cout << "at event " << a.peak_index << ", t = " << a.peak_time_us << " µs; ";
    std::cout << gib(a.before_recording) << " allocated before recording\n\n";
    std::cout << pad("bytes", 12) << pad("count", 8) << pad("term", 17) << "frame\n";
    std::size_t shown = 0;
    bytes_t rest = 0;
    std::uint64_t rest_count = 0;
    for (const auto& g : a.groups) {
      if (shown++ < *top) {
        std::cout << pad(gib(g.bytes), 12) << pad(std::to_string(g.count), 8) << pad(to_string(g.term), 17)
                  << tail(printable(g.frame), 90) << "\n";
      } else {
        rest += g.bytes;
        rest_count += g.count;
      }
    }
    if (rest) std::cout << pad(gib(rest), 12) << pad(std::to_string(rest_count), 8) << pad("", 17) << "(other groups)\n";
    std::cout << "\n" << pad("term", 17) << pad("measured", 14) << (a.predicted ? "predicted" : "") << "\n";
    for (std::size_t i = 0; i < kMemoryTerms; ++i) {
      std::cout << pad(to_string(static_cast<MemoryTerm>(i)), 17) << pad(gib(a.measured[i]), 14);
      if (a.predicted) std::cout << gib((*a.predicted)[i]);
      std::cout << "\n";
    }
    std::cout << pad("total", 17) << pad(gib(a.peak_bytes), 14);
    if (a.predicted) std::cout << gib(a.predicted_peak) << " (" << a.predicted_phase << ")";
    std::cout << "\n";
  });
});

}  // namespace
}  // namespace membudget::cli
