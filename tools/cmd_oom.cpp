// membudget oom: read a PyTorch out-of-memory message, classify it, print the first fix.
//
//   membudget oom [TEXT] [--file F] [--format table|json] [--step N] [--phase train|eval]
//                 [--long-seq]
// The message comes from TEXT, else from --file, else from standard input; it may sit anywhere in
// a traceback or a log. Exit codes: 0 the message was read, 2 no readable message (or bad
// options), 5 the file could not be read.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "cli.hpp"
#include "diagnose/json_out.hpp"
#include "job_flags.hpp"
#include "membudget/input.hpp"
#include "membudget/oom.hpp"
#include "membudget/oom_attribution.hpp"
#include "membudget/report.hpp"

namespace membudget::cli {
namespace {

struct OomOptions {
  std::string text;
  std::string file;
  std::string format = "table";
  std::string step;  // parsed by parse_step: CLI11 would take "-1" as 2^64 - 1
  std::string phase;
  bool long_seq = false;
  std::string model;  // with the job flags below: which budget term the failed allocation is
  std::string batch, seq, precision, optimizer, recompute, attention, loss;
};

std::string read_input(const OomOptions& o) {
  if (!o.text.empty() && !o.file.empty())
    throw Error(ErrorKind::invalid_argument, "oom: give the message as TEXT or --file FILE, not both");
  // "-" (as TEXT or --file) is standard input, as for most tools that read a file
  if (!o.text.empty() && o.text != "-") return o.text;
  if (!o.file.empty() && o.file != "-") return read_input_file(o.file, limits::kMaxOomTextBytes, "out-of-memory text");
  return read_input_stream(std::cin, limits::kMaxOomTextBytes, "out-of-memory text", "standard input");
}

// ", rank 3" or ", worker default0": whose lines torchrun tagged the message's with, if anyone's.
std::string source_of(const OomReport& r) {
  if (r.rank) return ", rank " + std::to_string(*r.rank);
  if (!r.worker.empty()) return ", worker " + r.worker;
  return "";
}

void print_table(const OomReport& r, const OomDiagnosis& d) {
  auto row = [](const std::string& name, bytes_t v, const std::string& note = "") {
    std::printf("  %-22s %14s  %20llu B%s%s\n", name.c_str(), format_bytes(v).c_str(),
                static_cast<unsigned long long>(v), note.empty() ? "" : "  ", note.c_str());
  };
  std::printf("%s out-of-memory message at line %zu (PyTorch %s template), GPU %d%s\n", r.backend.c_str(), r.line,
              to_string(r.template_version), r.gpu, source_of(r).c_str());
  row("requested", r.requested, "(rounded by the allocator)");
  row("capacity", r.capacity);
  if (r.allowed) row("allowed", *r.allowed, "(per-process fraction)");
  row("free", r.free);
  row("allocated by PyTorch", r.allocated);
  if (r.private_pools) row("  in private pools", *r.private_pools, "(CUDA graphs)");
  row("reserved by PyTorch", r.reserved, r.reserved_derived ? "(allocated + unallocated)" : "");
  row("reserved unallocated", r.reserved_unallocated,
      r.reserved_unallocated_derived ? "(reserved - allocated)" : "");
  if (const bytes_t beyond = r.reserved_beyond_device())
    row("outside PyTorch", 0,
        "(unknown: free + reserved exceed the capacity by " + format_bytes(beyond) +
            "; PyTorch reserves more than the device reports in use, as when Windows' driver spills into shared "
            "system memory, or the message was edited)");
  else
    row("outside PyTorch", r.non_pytorch(), "(capacity - free - reserved)");
  if (r.process_in_use) row("this process", *r.process_in_use, "(including non-PyTorch memory)");
  for (const auto& p : r.other_processes) row("process " + std::to_string(p.pid), p.in_use);
  std::printf("\nclassification: %s (%s)\n  %s\nfirst fix: %s\n", to_string(d.classification),
              d.situation.c_str(), d.explanation.c_str(), d.first_fix.c_str());
}

// "--step 12": a whole number in [0, limits::kMaxStep], nothing else.
std::uint64_t parse_step(const std::string& text) {
  const bool digits = !text.empty() && text.size() <= 10 && text.find_first_not_of("0123456789") == std::string::npos;
  if (!digits || std::stoull(text) > limits::kMaxStep)
    throw Error(ErrorKind::invalid_argument, "--step: '" + text + "' is not a step index from 0 to " +
                                                 std::to_string(limits::kMaxStep));
  return std::stoull(text);
}

void run(const OomOptions& o, const CLI::App& sub) {
  require_one_of(o.format, "--format", {"table", "json"});
  if (sub.count("--phase")) require_one_of(o.phase, "--phase", {"train", "eval"});
  OomContext ctx;
  if (sub.count("--step")) ctx.step = parse_step(o.step);
  if (o.model.empty())
    for (const char* flag : {"--batch", "--seq", "--precision", "--optimizer", "--recompute", "--attention", "--loss"})
      if (sub.count(flag))
        throw Error(ErrorKind::invalid_argument, std::string(flag) + ": describes the job of --model; give --model SPEC");
  ctx.phase = o.phase == "eval" ? OomPhase::eval : o.phase == "train" ? OomPhase::train
                                                                      : OomPhase::unknown;
  ctx.long_sequences_only = o.long_seq;
  const std::string input = read_input(o);
  bool stopped_early = false;
  const std::vector<OomReport> reports = parse_oom_messages(input, &stopped_early);
  const OomReport& report = reports.front();  // the first; the others are listed after it
  std::optional<OomAttribution> attribution;
  if (!o.model.empty()) {
    JobFlags f;
    f.model_path = o.model;
    f.batch = o.batch;
    f.seq = o.seq;
    f.precision = o.precision;
    f.optimizer = o.optimizer;
    f.recompute = o.recompute;
    f.attention = o.attention;
    f.loss = o.loss;
    const ModelSpec spec = f.model();
    attribution = attribute_oom(report, spec, f.job(spec));
  }
  if (o.format == "json") {
    nlohmann::json j = attribution ? diagnose::oom_json(report, ctx, *attribution) : diagnose::oom_json(report, ctx);
    if (reports.size() > 1) j["other_messages"] = nlohmann::json::array();
    for (std::size_t i = 1; i < reports.size(); ++i) {
      const OomReport& r = reports[i];
      nlohmann::json m{{"line", r.line},           {"gpu", r.gpu},
                       {"requested", r.requested}, {"reserved", r.reserved},
                       {"classification", to_string(classify(r, ctx).classification)}};
      if (r.rank) m["rank"] = *r.rank;
      if (!r.worker.empty()) m["worker"] = r.worker;
      j["other_messages"].push_back(std::move(m));
    }
    // the text holds more message starts than were tried
    if (stopped_early) j["messages_tried"] = limits::kMaxOomMessages;
    std::cout << diagnose::dump(j, 2) << "\n";
  } else {
    print_table(report, classify(report, ctx));
    if (attribution) std::printf("\nbudget term: %s\n  %s\n", attribution->term.c_str(), attribution->note.c_str());
    if (reports.size() > 1) {
      std::printf("\nThe input holds %zu more out-of-memory message%s; the figures above are the first's:\n",
                  reports.size() - 1, reports.size() > 2 ? "s" : "");
      constexpr std::size_t kListed = 10;  // a log of retries can hold hundreds (JSON lists them all)
      for (std::size_t i = 1; i < reports.size(); ++i) {
        if (i > kListed) {
          std::printf("  ... and %zu more (--format json lists them)\n", reports.size() - i);
          break;
        }
        const OomReport& r = reports[i];
        std::printf("  line %zu: GPU %d%s, tried to allocate %s, %s reserved: %s\n", r.line, r.gpu,
                    source_of(r).c_str(), format_bytes(r.requested).c_str(),
                    format_bytes(r.reserved).c_str(), to_string(classify(r, ctx).classification));
      }
      std::printf("Give one message alone to read its figures and first fix.\n");
    }
    if (stopped_early)
      std::printf("\nThe input holds more than %d out-of-memory message starts; only those were read.\n",
                  limits::kMaxOomMessages);
  }
}

const Registrar registrar("oom", 60, [](CLI::App& parent) {
  auto o = std::make_shared<OomOptions>();
  auto* sub = parent.add_subcommand(
      "oom", "Read a PyTorch out-of-memory message: its figures, the cause and the first fix");
  sub->add_option("text", o->text, "The message (or a whole traceback); default: --file or stdin ('-' too)");
  sub->add_option("--file,-f", o->file, "Read the message from this file");
  sub->add_option("--format", o->format, "table (default) | json");
  sub->add_option("--step", o->step, "0-based index of the step that ran out of memory");
  sub->add_option("--phase", o->phase, "Phase that ran out of memory: train | eval");
  sub->add_flag("--long-seq", o->long_seq, "It runs out of memory only on the longest sequences");
  sub->add_option("--model", o->model, "The model spec of the job: say which budget term the failed allocation is");
  sub->add_option("--batch", o->batch, "with --model: micro-batch");
  sub->add_option("--seq", o->seq, "with --model: sequence length");
  sub->add_option("--precision", o->precision, "with --model: fp32 | amp-bf16 | bf16 | bf16-master");
  sub->add_option("--optimizer", o->optimizer, "with --model: optimizer");
  sub->add_option("--recompute", o->recompute, "with --model: none | selective | full");
  sub->add_option("--attention", o->attention, "with --model: flash | math");
  sub->add_option("--loss", o->loss, "with --model: full | chunked");
  sub->callback([o, sub] { run(*o, *sub); });
});

}  // namespace
}  // namespace membudget::cli
