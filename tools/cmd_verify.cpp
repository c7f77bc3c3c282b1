// membudget verify MODEL [job flags]: run the synthetic step (training, or --mode infer: prefill and
// one decode step), measure each phase, compare.
#include <iostream>

#include "cli.hpp"
#include "job_flags.hpp"
#include "membudget/input.hpp"
#include "measure/verify.hpp"

namespace membudget::cli {
namespace {

// "1%" → 0.01; "0.01" → 0.01.
double parse_tolerance(const std::string& text) {
  try {
    std::size_t used = 0;
    const bool percent = !text.empty() && text.back() == '%';
    const std::string num = percent ? text.substr(0, text.size() - 1) : text;
    const double v = std::stod(num, &used);
    if (used != num.size() || !(v >= 0)) throw std::invalid_argument("bad");
    return percent ? v / 100.0 : v;
  } catch (const std::exception&) {
    throw Error(ErrorKind::invalid_argument, "--tolerance: '" + text + "' is not a fraction (0.01) or a percentage (1%)");
  }
}

struct VerifyFlags {
  JobFlags job;
  std::string backend = "cpu";
  std::string steps = "3", warmup = "1";  // parse_whole: at most limits::kMaxVerifySteps each
  std::string tolerance;
  std::string snapshot, plot;
  bool debug_leak = false;
  bool expandable = false;
  float lr = 3e-3f;
};

Registrar reg("verify", 20, [](CLI::App& app) {
  auto f = std::make_shared<VerifyFlags>();
  CLI::App* cmd = app.add_subcommand(
      "verify",
      "run membudget's synthetic training step (or, with --mode infer, a prefill into a KV pool and one decode "
      "step), measure each phase and compare with the prediction");
  f->job.add(cmd);
  cmd->add_option("--device-backend", f->backend, "cpu (default: Eigen on host memory) | cuda");
  cmd->add_option("--steps", f->steps, "measured steps after the warm-up (default 3)");
  cmd->add_option("--warmup", f->warmup, "warm-up steps, not compared (default 1; 0 compares step 0 too)");
  cmd->add_option("--tolerance", f->tolerance, "largest error per phase, e.g. 1% or 0.01 (default 1% for the harness profile, 10% otherwise)");
  cmd->add_option("--snapshot", f->snapshot, "write the allocation history as a PyTorch memory snapshot (.pickle)");
  cmd->add_option("--plot", f->plot, "draw the measured timeline with the predicted phase peaks (.svg)");
  cmd->add_option("--lr", f->lr, "AdamW learning rate of the training step (default 3e-3; --mode infer has no optimizer)");
  cmd->add_flag("--expandable-segments", f->expandable, "the allocator maps pages into growing segments");
  cmd->add_flag("--debug-leak", f->debug_leak, "keep 4 KiB from every step (shows that the leak check fires)")
      ->group("");
  cmd->callback([f, cmd] {
    refuse_given(*cmd, {"--headroom"}, "verify measures the step; it keeps no headroom");
    const ModelSpec spec = f->job.model();
    // verify runs the harness: predict its profile unless the user asks for another one
    JobFlags jf = f->job;
    if (jf.profile.empty()) jf.profile = "harness";
    const Job job = jf.job(spec);
    if (job.mode == Mode::infer) refuse_given(*cmd, {"--lr"}, "--mode infer runs no optimizer step");
    const Format format = parse_format(f->job.format);
    measure::VerifyOptions vo;
    vo.backend = f->backend;
    vo.steps = static_cast<int>(parse_whole(f->steps, "--steps", 1, limits::kMaxVerifySteps));
    vo.warmup = static_cast<int>(parse_whole(f->warmup, "--warmup", 0, limits::kMaxVerifySteps));
    vo.tolerance = f->tolerance.empty() ? (job.profile == Profile::harness ? 0.01 : 0.10) : parse_tolerance(f->tolerance);
    if (f->job.given("--device"))
      throw Error(ErrorKind::invalid_argument, "--device: verify measures the device it runs on; use --device-memory to cap it");
    if (!f->job.device_memory.empty()) vo.capacity = parse_bytes(f->job.device_memory, "--device-memory");
    vo.snapshot_path = f->snapshot;
    vo.plot_path = f->plot;
    vo.leak_per_step = f->debug_leak;
    vo.expandable_segments = f->expandable;
    vo.lr = f->lr;
    const measure::VerifyResult r = measure::run_verify(spec, job, vo);
    std::cout << measure::render_verify(r, format);
    if (!r.ok()) set_exit_status(1);
  });
});

}  // namespace
}  // namespace membudget::cli
