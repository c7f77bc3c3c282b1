// membudget max-batch MODEL --device NAME [job flags]: the largest micro-batch that fits, and the
// gradient-accumulation steps that reach --global-batch.
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "job_flags.hpp"
#include "membudget/api.hpp"
#include "membudget/input.hpp"

namespace membudget::cli {
namespace {

// A CSV field: quoted (quotes doubled) when it holds a comma, a quote or a line break; escaped for
// the terminal.
std::string csv_field(const std::string& s) {
  std::string v = printable(s);
  if (v.find_first_of(",\"\n\r") == std::string::npos) return v;
  std::string q = "\"";
  for (char c : v) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

struct MaxBatchFlags {
  JobFlags job;
  std::string global_batch_text, data_parallel_text, limit_text;  // parse_whole: exact, bounded
  std::uint64_t global_batch = 0, data_parallel = 1, limit = 0;
};

Registrar reg("max-batch", 20, [](CLI::App& app) {
  auto f = std::make_shared<MaxBatchFlags>();
  CLI::App* cmd = app.add_subcommand("max-batch", "the largest micro-batch that fits a card (and the accumulation steps)");
  f->job.add(cmd, /*with_batch_seq=*/false);
  cmd->get_option("--format")->description("table (default) | json | csv");  // of the shared flags' four, those it writes
  f->job.add_allocator_conf(cmd);
  cmd->add_option("--seq,-s", f->job.seq, "sequence length in tokens (default 4096)");
  cmd->add_option("--global-batch", f->global_batch_text, "target global batch (sequences per optimizer step)");
  cmd->add_option("--data-parallel", f->data_parallel_text, "data-parallel ranks sharing the global batch (default: the job's --dp × --fsdp, else 1)");
  cmd->add_option("--max", f->limit_text, "largest micro-batch tried (default 65536)");
  cmd->callback([f, cmd] {
    // At least 1 when given: 0 would silently mean "no target" (--global-batch) or "the default"
    // (--max).
    constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
    if (cmd->count("--global-batch")) f->global_batch = parse_whole(f->global_batch_text, "--global-batch", 1, kMax);
    if (cmd->count("--max")) f->limit = parse_whole(f->limit_text, "--max", 1, kMax);
    if (cmd->count("--data-parallel")) {
      if (!cmd->count("--global-batch"))
        throw Error(ErrorKind::invalid_argument, "--data-parallel: applies only with --global-batch");
      f->data_parallel = parse_whole(f->data_parallel_text, "--data-parallel", 1, kMax);
    }
    const ModelSpec spec = f->job.model();
    const Job job = f->job.job(spec);
    const auto dev = f->job.device_choice();
    if (!dev) throw Error(ErrorKind::invalid_argument, "max-batch: give --device NAME or --device-memory SIZE");
    require_one_of(f->job.format, "--format", {"table", "json", "csv"});
    const Format format = parse_format(f->job.format);
    SearchOptions o;
    o.headroom = f->job.headroom;
    o.global_batch = f->global_batch;
    o.data_parallel = f->data_parallel;
    o.limit = f->limit;
    o.reserved = true;  // decide on what nvidia-smi will show (docs/accuracy.md, reserved memory)
    o.allocator_conf = f->job.allocator_conf;
    const MaxBatchResult r = max_micro_batch(spec, job, *dev, o);
    Job at = job;
    at.batch = std::max<std::uint64_t>(1, r.max_micro_batch);
    PredictOptions po;
    po.reserved = true;
    po.allocator_conf = f->job.allocator_conf;
    const Budget budget = predict(spec, at, po);
    const Fit fit = check_fit(budget, *dev, f->job.headroom);
    // what the card must hold at the answer: reserved + outside where the job has a reserved model
    const bytes_t required = r.reserved_required ? r.reserved_required : r.at_max.required;
    // the allocated figures at the answer are the budget's (the replay's phases where it runs), so
    // that the output agrees with its own budget; the search's estimate decided only where to look
    const bytes_t allocated_required = fit.allocated_required;
    if (format == Format::json) {
      nlohmann::ordered_json o2;
      o2["model"] = spec.name;
      o2["device"] = {{"name", dev->name}, {"capacity", dev->capacity}, {"headroom", f->job.headroom}, {"limit", r.limit}};
      o2["seq"] = job.seq;
      o2["max_micro_batch"] = r.max_micro_batch;
      o2["at_limit"] = r.at_limit;
      o2["required"] = required;
      o2["basis"] = r.reserved_required ? "reserved" : "allocated";
      o2["allocated_required"] = allocated_required;
      o2["peak"] = budget.peak;
      o2["peak_phase"] = budget.peak_phase;
      if (f->global_batch) {
        o2["global_batch"] = f->global_batch;
        o2["data_parallel"] = r.data_parallel;
        o2["accum_micro_batch"] = r.accum_micro_batch;
        o2["grad_accum_steps"] = r.grad_accum_steps;
      }
      o2["evaluations"] = r.evaluations;
      o2["budget"] = nlohmann::ordered_json::parse(to_json_string(budget, fit, false, -1));
      std::cout << o2.dump(2) << "\n";
    } else if (format == Format::csv) {
      std::cout << "model,device,seq,max_micro_batch,required,limit,global_batch,accum_micro_batch,grad_accum_steps\n"
                << csv_field(spec.name) << "," << csv_field(dev->name) << "," << job.seq << "," << r.max_micro_batch << ","
                << required << "," << r.limit << "," << f->global_batch << "," << r.accum_micro_batch << ","
                << r.grad_accum_steps << "\n";
    } else {
      // (a serving job's recipe is its weights and KV cache; precision and recompute are training settings)
      const std::string recipe = job.mode == Mode::infer
                                     ? std::string("serving, weights ") + to_string(job.weights) + ", KV " + to_string(job.kv_dtype)
                                     : std::string(to_string(job.precision)) + ", recompute " + to_string(job.recompute);
      std::cout << printable(spec.name) << " on " << dev->name << " (" << format_bytes(r.limit) << " usable), seq " << job.seq
                << ", " << recipe
                << (job.parallel.single() ? std::string() : ", one rank of " + layout_label(job.parallel)) << "\n";
      if (r.max_micro_batch == 0) {
        std::cout << "  no micro-batch fits: batch 1 needs " << format_bytes(required) << "\n";
      } else {
        std::cout << "  max micro-batch  " << r.max_micro_batch << "  (needs "
                  << (r.reserved_required ? format_bytes(r.reserved_required) + " reserved + outside, " : std::string())
                  << format_bytes(allocated_required) << " allocated + outside, peak " << budget.peak_phase << ")\n";
        if (r.at_limit)
          std::cout << "  (the search's limit: every micro-batch up to " << r.max_micro_batch
                    << " fits, and a larger one may too; raise it with --max)\n";
        if (f->global_batch && r.accum_micro_batch)
          std::cout << "  global batch " << f->global_batch << " = micro-batch " << r.accum_micro_batch << " × "
                    << r.grad_accum_steps << " accumulation steps × " << r.data_parallel << " data-parallel ranks\n";
        else if (f->global_batch)
          std::cout << "  global batch " << f->global_batch << ": no micro-batch dividing its " << f->global_batch / r.data_parallel
                    << " sequences per rank fits with the accumulation steps it needs (the first micro-batch's gradients "
                       "stay allocated through the rest)\n";
      }
    }
    // nothing fits: no micro-batch, or none that reaches the global batch
    if (r.max_micro_batch == 0 || (f->global_batch && r.accum_micro_batch == 0)) set_exit_status(1);
  });
});

}  // namespace
}  // namespace membudget::cli
