// membudget predict MODEL [job flags]: the budget, the phase peaks and the device verdict.
#include <fstream>
#include <iostream>
#include <memory>

#include "cli.hpp"
#include "job_flags.hpp"
#include "membudget/input.hpp"
#include "membudget/plot.hpp"

namespace membudget::cli {
namespace {

Registrar reg("predict", 10, [](CLI::App& app) {
  auto flags = std::make_shared<JobFlags>();
  CLI::App* cmd = app.add_subcommand("predict", "predict the memory of a training or serving step");
  flags->add(cmd);
  flags->add_explain(cmd);
  flags->add_allocator_conf(cmd);
  auto plot = std::make_shared<std::string>();
  cmd->add_option("--plot", *plot, "also write the predicted step as an SVG timeline to FILE (training)");
  auto snapshot = std::make_shared<std::string>();
  cmd->add_option("--snapshot", *snapshot,
                  "also write the predicted step as an allocator trace to FILE.pickle (pytorch.org/memory_viz opens it)");
  cmd->callback([flags, plot, snapshot] {
    // the report goes to standard output, so neither file can ("-" was written as a file named -),
    // and one path for both would leave only the second
    for (const auto& [flag, path] : {std::pair{"--plot", plot}, std::pair{"--snapshot", snapshot}})
      if (*path == "-") throw Error(ErrorKind::invalid_argument, std::string(flag) + ": give a file name (the report is standard output)");
    if (!plot->empty() && *plot == *snapshot)
      throw Error(ErrorKind::invalid_argument, "--plot and --snapshot: the same file '" + printable(*plot) + "'; give each its own");
    const ModelSpec spec = flags->model();
    const Job job = flags->job(spec);
    const Format format = parse_format(flags->format);
    PredictOptions po;
    po.explain = flags->explain || format == Format::table || !plot->empty();
    po.reserved = true;
    po.ranks = true;  // a distributed job lists every group of ranks whose memory differs  // reserved_peak and nvidia_smi (training with the torch profile)
    po.allocator_conf = flags->allocator_conf;
    const Budget budget = predict(spec, job, po);
    std::optional<Fit> fit;
    if (auto dev = flags->device_choice()) fit = check_fit(budget, *dev, flags->headroom);
    ReportOptions ro;
    ro.format = format;
    ro.explain = flags->explain;
    if (!plot->empty()) {  // written before the report: a failure leaves no half answer
      const std::string svg = render_timeline_svg(spec, budget, fit, flags->allocator_conf);
      std::ofstream out(*plot, std::ios::binary);
      if (!out || !(out << svg) || !out.flush()) throw Error(ErrorKind::io, "--plot: cannot write " + *plot);
    }
    if (!snapshot->empty()) {
      const std::string bytes = predicted_snapshot(spec, budget, flags->allocator_conf);
      std::ofstream out(*snapshot, std::ios::binary);
      if (!out || !(out << bytes) || !out.flush()) throw Error(ErrorKind::io, "--snapshot: cannot write " + *snapshot);
    }
    std::cout << render(budget, fit, ro);
    if (fit && !fit->fits) set_exit_status(1);
  });
});

}  // namespace
}  // namespace membudget::cli
