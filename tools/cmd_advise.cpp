// membudget advise MODEL --device NAME [job flags]: ranked fixes for a job that does not fit.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "job_flags.hpp"
#include "membudget/advise.hpp"
#include "membudget/input.hpp"

namespace membudget::cli {
namespace {

std::string gib(bytes_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(v) / static_cast<double>(GiB));
  return buf;
}


Registrar reg("advise", 40, [](CLI::App& app) {
  auto flags = std::make_shared<JobFlags>();
  CLI::App* cmd = app.add_subcommand("advise", "rank the fixes for a training job that does not fit a card");
  flags->add(cmd);
  flags->add_allocator_conf(cmd);
  cmd->get_option("--format")->description("table (default) | json");  // of the shared flags' four, the two it writes
  cmd->callback([flags] {
    const ModelSpec spec = flags->model();
    const Job job = flags->job(spec);
    require_one_of(flags->format, "--format", {"table", "json"});
    const Format format = parse_format(flags->format);
    const auto device = flags->device_choice();
    if (!device) throw Error(ErrorKind::invalid_argument, "advise: give the card with --device NAME or --device-memory SIZE");
    PredictOptions po;
    po.reserved = true;  // as advise() decides: on what nvidia-smi will show, where modelled
    po.allocator_conf = flags->allocator_conf;
    const Budget budget = predict(spec, job, po);
    const Fit fit = check_fit(budget, *device, flags->headroom);
    const std::vector<Fix> fixes = advise(spec, job, *device, flags->headroom, flags->allocator_conf);
    auto basis = [](bool on_reserved) { return on_reserved ? "reserved" : "allocated"; };
    const double usable = static_cast<double>(fit.capacity) * (1.0 - fit.headroom);
    const double free_frac = 1.0 - static_cast<double>(fit.required) / usable;
    const bool tight = fit.fits && free_frac < 0.10;
    bool any_fits = fit.fits;
    for (const auto& f : fixes) any_fits = any_fits || (!f.skipped && f.fits);

    if (format == Format::json) {
      nlohmann::ordered_json j;
      j["model"] = spec.name;
      j["device"] = {{"name", fit.device.name}, {"capacity", fit.capacity}, {"headroom", fit.headroom}};
      j["baseline"] = {{"peak", budget.peak}, {"required", fit.required}, {"basis", basis(fit.on_reserved)},
                       {"fits", fit.fits}, {"tight", tight}};
      auto& a = j["fixes"] = nlohmann::ordered_json::array();
      for (const auto& f : fixes) {
        // a fix skipped before a prediction has no figures (0 read as a fix that needs nothing)
        const auto figure = [&](const auto& v) { return f.predicted ? nlohmann::ordered_json(v) : nlohmann::ordered_json(); };
        nlohmann::ordered_json o = {{"name", f.name},
                                    {"change", f.change},
                                    {"peak", figure(f.peak)},
                                    {"required", figure(f.required)},
                                    {"basis", figure(basis(f.on_reserved))},
                                    {"fits", f.fits},
                                    {"skipped", f.skipped},
                                    {"cost_class", to_string(f.cost_class)},
                                    {"compute", f.compute},
                                    {"transfer_s", f.transfer_s},
                                    {"gpus", f.gpus},
                                    {"cost", f.cost},
                                    {"note", f.note}};
        a.push_back(std::move(o));
      }
      std::cout << j.dump(2) << "\n";
    } else {
      std::cout << printable(spec.name) << ", " << to_string(job.mode) << " " << job.batch << "×" << job.seq << " "
                << to_string(job.precision) << " " << to_string(job.optimizer) << " on " << fit.device.name << " ("
                << gib(fit.capacity) << ", headroom " << static_cast<int>(fit.headroom * 100 + 0.5) << "%)\n";
      std::cout << "as is: " << (fit.on_reserved ? "reserved " + gib(budget.reserved_peak) : "peak " + gib(budget.peak))
                << " + overhead " << gib(budget.terms.overhead) << " = " << gib(fit.required)
                << (fit.on_reserved ? " (allocated peak " + gib(budget.peak) + ")" : std::string()) << " — "
                << (fit.fits ? (tight ? "fits, with little headroom" : "FITS: no fix needed") : "DOES NOT FIT")
                << "\n\n";
      std::cout << "  #  " << pad_columns("fix", 22) << pad_columns("peak", 12) << pad_columns("required", 12)
                << pad_columns("fits", 6) << "cost\n";
      int i = 0;
      for (const auto& f : fixes) {
        if (f.skipped) continue;
        std::cout << (++i < 10 ? "  " : " ") << i << "  " << pad_columns(f.name.substr(0, 60), 22)
                  << pad_columns(gib(f.peak), 12) << pad_columns(gib(f.required) + (f.on_reserved ? "" : "*"), 12)
                  << pad_columns(f.fits ? "yes" : "no", 6) << f.cost << "\n";
        std::cout << "     " << pad_columns("", 22) << "change: " << f.change << "\n";
        std::cout << "     " << pad_columns("", 22) << f.note << "\n";
      }
      std::cout << "\n  peak: allocated bytes; required: reserved memory + overhead (what nvidia-smi shows), or, "
                   "marked *, allocated peak + overhead where the fix has no reserved model\n";
      bool header = false;
      for (const auto& f : fixes) {
        if (!f.skipped) continue;
        if (!header) std::cout << "\nskipped:\n";
        header = true;
        std::cout << "  " << f.name << ": " << f.note << "\n";
      }
    }
    if (!any_fits) set_exit_status(1);
  });
});

}  // namespace
}  // namespace membudget::cli
