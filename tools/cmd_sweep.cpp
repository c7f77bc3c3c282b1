// membudget sweep MODEL --batch 1..64 --seq 1024,2048 --precision amp-bf16,bf16 [--device …]
// [--format csv|json|table]: the estimate over a grid.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli.hpp"
#include "grid_flags.hpp"
#include "job_flags.hpp"
#include "membudget/api.hpp"
#include "membudget/input.hpp"

namespace membudget::cli {
namespace {
unsigned long long ull(std::uint64_t v) { return static_cast<unsigned long long>(v); }

Registrar reg("sweep", 30, [](CLI::App& app) {
  auto f = std::make_shared<JobFlags>();
  f->format = "csv";
  CLI::App* cmd = app.add_subcommand("sweep", "estimates over a grid of micro-batches, sequences, precisions, recompute");
  f->add(cmd, /*with_batch_seq=*/false);
  cmd->get_option("--format")->description("csv (default) | json | table");  // of the shared flags' four, those it writes
  cmd->add_option("--batch,-b", f->batch, "micro-batches: 1..64, 1..64:8 or 1,2,4 (default 4)");
  cmd->add_option("--seq,-s", f->seq, "sequence lengths: 1024,2048,4096 or 1024..8192:1024 (default 4096)");
  f->add_allocator_conf(cmd);
  auto fit_on = std::make_shared<std::string>("reserved");
  cmd->add_option("--fit-on", *fit_on,
                  "with --device: decide fits on reserved memory + outside (default; a few ms per replayed point) "
                  "or on allocated bytes + outside (the fast grid)");
  cmd->callback([f, fit_on, cmd] {
    if (*fit_on != "reserved" && *fit_on != "allocated")
      throw Error(ErrorKind::invalid_argument, "--fit-on: reserved or allocated, not '" + printable(*fit_on) + "'");
    JobFlags base = *f;
    SweepGrid grid;
    if (!f->batch.empty()) grid.batches = parse_count_list(f->batch, "--batch");
    if (!f->seq.empty()) grid.seqs = parse_count_list(f->seq, "--seq");
    if (!f->precision.empty()) grid.precisions = parse_precision_list(f->precision);
    if (!f->recompute.empty()) grid.recomputes = parse_recompute_list(f->recompute);
    // layouts: --dp 1,2 --fsdp 8,16,64 --tp 1,2,4,8 --pp 1,2 (each a list; every combination)
    if (!f->dp.empty()) grid.dps = parse_count_list(f->dp, "--dp");
    if (!f->fsdp.empty()) grid.fsdps = parse_count_list(f->fsdp, "--fsdp");
    if (!f->tp.empty()) grid.tps = parse_count_list(f->tp, "--tp");
    if (!f->pp.empty()) grid.pps = parse_count_list(f->pp, "--pp");
    for (std::string* list : {&base.dp, &base.fsdp, &base.tp, &base.pp, &base.batch, &base.seq, &base.precision, &base.recompute})
      list->clear();  // (the grid's: each point sets its own)
    const ModelSpec spec = base.model();
    // The layout's own options (--microbatches, --zero, --sp, --rank, ...) cannot be checked before
    // a point gives the layout (checked with none, each was refused as if its --pp, --dp or --tp had
    // not been given): the job is checked here without them, and each point with them and its own
    // layout and recipe (a point that does not take one is a row with its error).
    const Job job = base.job(spec, false, /*validate=*/false);
    JobFlags unlaid = base;  // (after base's job: it carries the files base read, read once)
    for (std::string* option : {&unlaid.pp_schedule, &unlaid.microbatches, &unlaid.virtual_stages, &unlaid.pp_layers,
                                &unlaid.zero, &unlaid.reshard_after_forward, &unlaid.rank, &unlaid.fsdp_grad_sync})
      option->clear();
    unlaid.ddp_bucket_view = unlaid.sp = unlaid.loss_parallel = unlaid.fsdp_offload = false;
    (void)unlaid.job(spec, false);  // every other setting checked now (the grid's sequences below)
    const auto dev = f->device_choice();
    const std::string& format = f->format;
    require_one_of(format, "--format", {"csv", "json", "table"});
    warn_beyond_context(spec, grid.seqs.empty() ? job.seq : *std::max_element(grid.seqs.begin(), grid.seqs.end()));
    if (!dev && cmd->count("--fit-on"))
      throw Error(ErrorKind::invalid_argument, "--fit-on: applies only with --device or --device-memory");
    if (!dev && !f->allocator_conf.empty())
      throw Error(ErrorKind::invalid_argument, "--allocator-conf: applies only with --device (the fit on reserved memory)");
    const bool on_reserved = dev && *fit_on == "reserved";
    if (!on_reserved && !f->allocator_conf.empty())
      throw Error(ErrorKind::invalid_argument, "--allocator-conf: applies only with --fit-on reserved");
    const auto points = sweep(spec, job, grid, dev, f->headroom, on_reserved, f->allocator_conf);
    // every point refused is bad input, as one such point given to predict is (each row names its error)
    if (std::none_of(points.begin(), points.end(), [](const SweepPoint& p) { return p.ok; }))
      set_exit_status(Error(ErrorKind::invalid_job, "").exit_code());
    // serving reads no precision or recompute: those columns stay empty (they printed the defaults)
    const bool training = job.mode == Mode::train;
    auto precision_of = [training](const SweepPoint& p) { return training ? to_string(p.precision) : ""; };
    auto recompute_of = [training](const SweepPoint& p) { return training ? to_string(p.recompute) : ""; };
    if (format == "json") {
      nlohmann::ordered_json a = nlohmann::ordered_json::array();
      for (const auto& p : points) {
        const auto training_only = [training](const char* v) { return training ? nlohmann::ordered_json(v) : nlohmann::ordered_json(); };
        nlohmann::ordered_json o = {{"batch", p.batch}, {"seq", p.seq}, {"precision", training_only(to_string(p.precision))},
                                    {"recompute", training_only(to_string(p.recompute))}, {"dp", p.dp}, {"fsdp", p.fsdp},
                                    {"tp", p.tp}, {"pp", p.pp}, {"ok", p.ok}};
        if (p.ok) {
          o["peak"] = p.estimate.peak;
          o["required"] = p.estimate.required;
          o["peak_phase"] = p.estimate.peak_phase;
          o["model_states"] = p.estimate.terms.model_states;
          o["activations"] = p.estimate.terms.activations;
          o["logits_loss"] = p.estimate.terms.logits_loss;
          if (dev) o["fits"] = p.fits;
          if (dev) o["basis"] = p.on_reserved ? "reserved" : "allocated";
          if (p.reserved_required) o["reserved_required"] = p.reserved_required;
          if (p.beyond_max_positions) o["beyond_max_positions"] = true;
        } else {
          o["error"] = p.error;
        }
        a.push_back(std::move(o));
      }
      nlohmann::ordered_json doc = {{"model", spec.name}, {"points", a}};
      if (dev) doc["device"] = {{"name", dev->name}, {"capacity", dev->capacity}, {"headroom", f->headroom}};
      std::cout << doc.dump(2) << "\n";
      return;
    }
    std::string out;
    out.reserve(points.size() * 96);
    const bool table = format == "table";
    char line[512];
    // the table's layout column, where the grid has layouts (its rows were otherwise alike)
    const bool layouts = !grid.dps.empty() || !grid.fsdps.empty() || !grid.tps.empty() || !grid.pps.empty();
    auto layout_of = [layouts](const SweepPoint& p) {
      if (!layouts) return std::string();
      char cell[96];
      std::snprintf(cell, sizeof cell, "dp%llu fsdp%llu tp%llu pp%llu", ull(p.dp), ull(p.fsdp), ull(p.tp), ull(p.pp));
      return std::string(cell);
    };
    const int layout_width = layouts ? 26 : 0;
    if (table)
      std::snprintf(line, sizeof line, "%6s %7s %-12s %-9s %-*s%14s %14s %14s %-22s %s\n", "batch", "seq", "precision",
                    "recompute", layout_width, layouts ? "layout" : "", "peak", "required",
                    on_reserved ? "reserved_req" : "", "peak_phase", dev ? "fits" : "");
    else
      std::snprintf(line, sizeof line, "batch,seq,precision,recompute,peak,required,peak_phase,model_states,"
                                       "activations,logits_loss,fits,error,dp,fsdp,tp,pp,basis,reserved_required\n");
    out += line;
    for (const auto& p : points) {
      if (table) {
        if (p.ok)
          std::snprintf(line, sizeof line, "%6llu %7llu %-12s %-9s %-*s%14s %14s %14s %-22s %s\n",
                        static_cast<unsigned long long>(p.batch), static_cast<unsigned long long>(p.seq),
                        precision_of(p), recompute_of(p), layout_width, layout_of(p).c_str(),
                        format_bytes(p.estimate.peak).c_str(),
                        format_bytes(p.estimate.required).c_str(),
                        p.reserved_required ? format_bytes(p.reserved_required).c_str() : "",
                        p.estimate.peak_phase, dev ? (p.fits ? "yes" : "no") : "");
        else
          std::snprintf(line, sizeof line, "%6llu %7llu %-12s %-9s %-*s error: %s\n", static_cast<unsigned long long>(p.batch),
                        static_cast<unsigned long long>(p.seq), precision_of(p), recompute_of(p), layout_width,
                        layout_of(p).c_str(), printable(p.error).c_str());
      } else if (p.ok) {
        std::snprintf(line, sizeof line, "%llu,%llu,%s,%s,%llu,%llu,%s,%llu,%llu,%llu,%s,\n",
                      static_cast<unsigned long long>(p.batch), static_cast<unsigned long long>(p.seq),
                      precision_of(p), recompute_of(p), static_cast<unsigned long long>(p.estimate.peak),
                      static_cast<unsigned long long>(p.estimate.required), p.estimate.peak_phase,
                      static_cast<unsigned long long>(p.estimate.terms.model_states),
                      static_cast<unsigned long long>(p.estimate.terms.activations),
                      static_cast<unsigned long long>(p.estimate.terms.logits_loss),
                      dev ? (p.fits ? "true" : "false") : "");
        // the layout columns, after the (empty) error
        line[std::strlen(line) - 1] = '\0';
        out += line;
        std::snprintf(line, sizeof line, ",%llu,%llu,%llu,%llu,%s,%s\n", ull(p.dp), ull(p.fsdp), ull(p.tp), ull(p.pp),
                      dev ? (p.on_reserved ? "reserved" : "allocated") : "",
                      p.reserved_required ? std::to_string(p.reserved_required).c_str() : "");
      } else {
        std::string err = printable(p.error);
        for (auto& c : err)
          if (c == '"') c = '\'';
        std::snprintf(line, sizeof line, "%llu,%llu,%s,%s,,,,,,,,\"%s\",%llu,%llu,%llu,%llu,,\n",
                      static_cast<unsigned long long>(p.batch), static_cast<unsigned long long>(p.seq),
                      precision_of(p), recompute_of(p), err.c_str(), ull(p.dp), ull(p.fsdp), ull(p.tp),
                      ull(p.pp));
      }
      out += line;
    }
    std::cout << out;
  });
});

}  // namespace
}  // namespace membudget::cli
