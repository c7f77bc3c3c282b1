// membudget leaks: is allocated memory flat from step to step, or a staircase?
//
//   membudget leaks steps.csv [--format table|json]
// steps.csv: "step,allocated" (bytes allocated after each step; see membudget/leaks.hpp).
//   membudget leaks snapshot.pickle [--format table|json]
// A .pickle is a torch.cuda.memory._dump_snapshot with a trace (membudget/snapshot_leaks.hpp).
// Exit codes: 0 no leak, 1 leak found, 2 bad input (unreadable CSV or snapshot, a snapshot without
// trace or step boundaries), 5 the file could not be read.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>

#include "cli.hpp"
#include "diagnose/pickle.hpp"
#include "membudget/input.hpp"
#include "membudget/leaks.hpp"
#include "membudget/snapshot_leaks.hpp"

namespace membudget::cli {
namespace {

struct LeaksOptions {
  std::string path;
  std::string format = "table";
};

// The table lines both inputs share: the verdict, the growth when there is a leak, the explanation.
void print_verdict(const LeakReport& r) {
  std::printf("leak:            %s\n", r.leak ? "yes" : "no");
  if (r.leak) {
    std::printf("growth per step: %s (%llu B)\n", format_bytes(r.growth_per_step).c_str(),
                static_cast<unsigned long long>(r.growth_per_step));
    std::printf("from step:       %lld\n", static_cast<long long>(*r.start_step));
    std::printf("growth in total: %s\n", format_bytes(r.growth_total).c_str());
  }
  std::printf("%s\n", r.explanation.c_str());
}

// Whether the bytes open as a pickle (protocol 2 and later: the PROTO opcode 0x80) or as a compressed
// file or archive (which the pickle reader names), whatever the file's name: read as a CSV it gave
// column names of binary.
bool opens_as_binary_snapshot(std::string_view bytes) {
  return (!bytes.empty() && static_cast<unsigned char>(bytes[0]) == 0x80) || diagnose::packed_format(bytes) != nullptr;
}

void run(const LeaksOptions& o) {
  // read once, then told apart: a pipe or a FIFO cannot be opened twice (the sniff's read took a
  // block of a piped CSV, which then lost those rows, silently; a FIFO blocked)
  std::string bytes = read_input_file(o.path, std::max(limits::kMaxSnapshotBytes, limits::kMaxCsvBytes), "leaks input");
  if (o.path.ends_with(".pickle") || o.path.ends_with(".pkl") || opens_as_binary_snapshot(bytes)) {
    const SnapshotLeaks l = snapshot_leaks(std::move(bytes), o.path);
    const LeakReport& r = l.report;
    if (o.format == "json") {
      std::cout << to_json(l, 2) << "\n";  // frames that are not UTF-8 are replaced, not fatal
    } else {
      std::printf("step boundaries: %s\n", printable(l.boundaries).c_str());
      std::printf("steps:           %zu\n", r.steps);
      for (std::size_t i = 0; i < l.series.allocated.size(); ++i)
        std::printf("  step %-4zu      %s\n", i, format_bytes(l.series.allocated[i]).c_str());
      print_verdict(r);
      std::printf("never freed, born after warm-up: %s\n", format_bytes(l.survivor_bytes).c_str());
      for (const auto& g : l.survivors)
        std::printf("  %-12s %6llu  from step %lld  %s\n", format_bytes(g.bytes).c_str(),
                    static_cast<unsigned long long>(g.count), static_cast<long long>(g.first_step), printable(g.frame).c_str());
    }
    if (r.leak) set_exit_status(1);
    return;
  }
  if (bytes.size() > limits::kMaxCsvBytes)
    throw Error(ErrorKind::invalid_argument, o.path + ": the steps CSV is larger than " + format_bytes(limits::kMaxCsvBytes) +
                                                 ", the limit membudget reads (docs/robustness.md)");
  const StepSeries series = read_steps_csv(bytes, o.path);
  const LeakReport r = detect_leak(series.allocated, series.steps);
  if (o.format == "json") {
    std::cout << to_json(r, 2) << "\n";
  } else {
    std::printf("steps:           %zu\n", r.steps);
    print_verdict(r);
  }
  if (r.leak) set_exit_status(1);
}

const Registrar registrar("leaks", 61, [](CLI::App& parent) {
  auto o = std::make_shared<LeaksOptions>();
  auto* sub = parent.add_subcommand(
      "leaks", "Find a per-step memory leak in allocated-bytes-per-step (exit 1 when found)");
  sub->add_option("steps", o->path, "steps.csv (step,allocated: bytes after each step) or a snapshot .pickle")
      ->required();
  sub->add_option("--format", o->format, "table (default) | json");
  sub->callback([o] {
    require_one_of(o->format, "--format", {"table", "json"});
    run(*o);
  });
});

}  // namespace
}  // namespace membudget::cli
