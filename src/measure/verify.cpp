// membudget verify: measured beside predicted, phase by phase.
#include "measure/verify.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "measure/snapshot.hpp"
#include "membudget/input.hpp"

#include <span>

namespace membudget::measure {
namespace {

using nlohmann::ordered_json;

std::span<const Phase> phases_of_mode(bool infer) {
  if (infer) return kServePhases;
  return kTrainPhases;
}

bytes_t measured_phase(const StepMeasure& m, Phase phase) {
  switch (phase) {
    case Phase::floor: return m.floor;
    case Phase::forward_peak: return m.forward_peak;
    case Phase::backward_peak: return m.backward_peak;
    case Phase::optimizer_peak: return m.optimizer_peak;
    case Phase::prefill_peak: return m.prefill_peak;
    case Phase::decode_peak: return m.decode_peak;
  }
  return 0;
}

bytes_t predicted_phase(const Budget& b, int step, Phase phase) {
  const auto& list = step == 0 && !b.step0.empty() ? b.step0 : b.phases;
  for (const auto& p : list)
    if (p.phase == phase) return p.bytes;
  return 0;
}

StepCheck check_step(const Budget& b, const StepMeasure& m, double tolerance, bool infer) {
  StepCheck sc;
  sc.measure = m;
  for (Phase phase : phases_of_mode(infer)) {
    PhaseCheck pc;
    pc.phase = to_string(phase);
    pc.predicted = predicted_phase(b, m.index, phase);
    pc.measured = measured_phase(m, phase);
    pc.error = static_cast<std::int64_t>(pc.measured) - static_cast<std::int64_t>(pc.predicted);
    pc.error_pct = pc.predicted ? 100.0 * static_cast<double>(pc.error) / static_cast<double>(pc.predicted)
                                : (pc.measured ? 100.0 : 0.0);
    pc.ok = std::fabs(static_cast<double>(pc.error)) <= tolerance * static_cast<double>(pc.predicted);
    sc.phases.push_back(pc);
  }
  return sc;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorKind::io, path + ": cannot open for writing");
  f << text;
  if (!f) throw Error(ErrorKind::io, path + ": write failed");
}

}  // namespace

VerifyResult run_verify(const ModelSpec& model, const Job& job_in, const VerifyOptions& options) {
  if (options.steps < 1) throw Error(ErrorKind::invalid_argument, "--steps: must be at least 1");
  if (options.warmup < 0) throw Error(ErrorKind::invalid_argument, "--warmup: must be 0 or more");
  if (!(options.tolerance >= 0)) throw Error(ErrorKind::invalid_argument, "--tolerance: must be 0 or more");
  if (!(options.lr >= 0) || !std::isfinite(options.lr))
    throw Error(ErrorKind::invalid_argument, "--lr: must be a finite number, 0 or more");
  Job job = job_in;
  VerifyResult res;
  res.options = options;
  res.predicted = predict(model, job, PredictOptions{});

  auto backend = make_backend(options.backend, options.capacity);
  res.backend = backend->name();
  AllocatorOptions ao;
  ao.policy.expandable_segments = options.expandable_segments;
  ao.record_history = !options.snapshot_path.empty() || !options.plot_path.empty();
  CachingAllocator allocator(backend->memory(), ao);
  HarnessOptions ho;
  ho.leak_per_step = options.leak_per_step;
  ho.adamw.lr = options.lr;
  res.infer = job.mode == Mode::infer;
  std::optional<Harness> harness;
  std::optional<InferHarness> iharness;
  try {
    if (res.infer) {
      InferOptions io;
      io.leak_per_step = options.leak_per_step;
      iharness.emplace(model, job, *backend, allocator, io);
      res.kv_pool = iharness->kv_pool_bytes();
      res.weights = iharness->weight_bytes();
    } else {
      harness.emplace(model, job, *backend, allocator, ho);
    }
    for (int i = 0; i < options.warmup + options.steps; ++i) {
      StepMeasure m = res.infer ? iharness->step().measure : harness->step();
      res.allocated_after.push_back(m.allocated_end);
      if (i >= options.warmup) res.steps.push_back(check_step(res.predicted, m, options.tolerance, res.infer));
    }
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::out_of_memory) throw;
    if (!options.snapshot_path.empty()) write_snapshot(allocator, options.snapshot_path);
    std::ostringstream msg;
    msg << e.what() << "\nmembudget verify: the predicted peak is " << format_bytes(res.predicted.peak) << " ("
        << res.predicted.peak_phase << ") and the " << backend->name() << " memory holds "
        << format_bytes(backend->memory().capacity())
        << (res.infer ? "; lower --batch or --seq, or give more memory"
                      : "; lower --batch or --seq, use --recompute full or --loss chunked, or give more memory");
    throw Error(ErrorKind::out_of_memory, msg.str());
  }
  const AllocatorStats s = allocator.stats();
  res.reserved = 0;
  for (const auto& sc : res.steps) res.reserved = std::max(res.reserved, sc.measure.reserved_peak);
  res.outside = backend->outside_bytes(static_cast<bytes_t>(s.reserved.current));
  res.alloc_retries = s.num_alloc_retries;
  for (const auto& sc : res.steps)
    for (const auto& pc : sc.phases) res.within_tolerance = res.within_tolerance && pc.ok;
  // leak check: allocated after each step, from step 1 on (step 0 creates gradients and moments)
  for (std::size_t i = 2; i < res.allocated_after.size(); ++i)
    if (res.allocated_after[i] > res.allocated_after[i - 1]) {
      res.leak_step = static_cast<int>(i);
      res.leak_bytes = res.allocated_after[i] - res.allocated_after[i - 1];
      break;
    }
  if (!options.snapshot_path.empty()) write_snapshot(allocator, options.snapshot_path);
  if (!options.plot_path.empty())
    write_file(options.plot_path,
               timeline_svg(allocator.history(), res.infer ? iharness->marks() : harness->marks(), res));
  return res;
}

namespace {

ordered_json phases_of(const Budget& b, const std::vector<PhasePeak>& list) {
  (void)b;
  ordered_json o = ordered_json::object();
  for (const auto& p : list) o[p.name()] = p.bytes;
  return o;
}

ordered_json step_json(const StepCheck& sc, bool infer) {
  const StepMeasure& m = sc.measure;
  ordered_json o = infer ? ordered_json{{"step", m.index},
                                        {"floor", m.floor},
                                        {"prefill_peak", m.prefill_peak},
                                        {"decode_peak", m.decode_peak},
                                        {"allocated_end", m.allocated_end},
                                        {"reserved_peak", m.reserved_peak}}
                         : ordered_json{{"step", m.index},           {"loss", m.loss},
                                        {"floor", m.floor},          {"forward_peak", m.forward_peak},
                                        {"backward_peak", m.backward_peak}, {"optimizer_peak", m.optimizer_peak},
                                        {"allocated_end", m.allocated_end}, {"reserved_peak", m.reserved_peak},
                                        {"seconds", m.seconds}};
  ordered_json err = ordered_json::object();
  for (const auto& pc : sc.phases)
    err[pc.phase] = {{"predicted", pc.predicted}, {"bytes", pc.error}, {"percent", pc.error_pct}, {"ok", pc.ok}};
  o["error"] = err;
  return o;
}

std::string pct(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.2f%%", v);
  return buf;
}

std::string padl(std::string s, std::size_t w) {
  std::size_t cols = 0;
  for (unsigned char c : s) cols += (c & 0xC0) != 0x80;
  if (cols < w) s.insert(0, w - cols, ' ');
  return s;
}
std::string padr(std::string s, std::size_t w) {
  std::size_t cols = 0;
  for (unsigned char c : s) cols += (c & 0xC0) != 0x80;
  if (cols < w) s.append(w - cols, ' ');
  return s;
}

}  // namespace

std::string render_verify(const VerifyResult& r, Format format) {
  const Job& j = r.predicted.job;
  const StepCheck* last = r.steps.empty() ? nullptr : &r.steps.back();
  if (format == Format::json) {
    ordered_json o;
    o["model"] = r.predicted.model.name;
    o["backend"] = r.backend;
    if (r.infer)
      o["job"] = {{"mode", "infer"},
                  {"batch", j.batch},
                  {"seq", j.seq},
                  {"pool_tokens", j.seq + 1},
                  {"weights", to_string(j.weights)},
                  {"kv_dtype", to_string(j.kv_dtype)},
                  {"profile", to_string(j.profile)}};
    else
      o["job"] = {{"batch", j.batch},
                  {"seq", j.seq},
                  {"precision", to_string(j.precision)},
                  {"recompute", to_string(j.recompute)},
                  {"loss", to_string(j.loss)},
                  {"loss_chunk", j.loss_chunk},
                  {"profile", to_string(j.profile)}};
    o["steps"] = r.options.steps;
    o["warmup"] = r.options.warmup;
    o["tolerance"] = r.options.tolerance;
    if (!r.infer) o["lr"] = r.options.lr;
    o["predicted"] = phases_of(r.predicted, r.predicted.phases);
    if (r.infer) {
      o["predicted"]["kv_cache"] = r.predicted.terms.kv_cache;
      o["predicted"]["weights"] = r.predicted.states.weights;
    } else {
      o["predicted"]["step0"] = phases_of(r.predicted, r.predicted.step0);
    }
    ordered_json meas;
    for (Phase p : phases_of_mode(r.infer)) meas[to_string(p)] = last ? measured_phase(last->measure, p) : 0;
    if (r.infer) {
      meas["kv_pool"] = r.kv_pool;
      meas["weights"] = r.weights;
    }
    meas["reserved"] = r.reserved;
    meas["outside"] = r.outside;
    meas["alloc_retries"] = r.alloc_retries;
    meas["allocated_after_step"] = r.allocated_after;
    ordered_json per = ordered_json::array();
    for (const auto& sc : r.steps) per.push_back(step_json(sc, r.infer));
    meas["per_step"] = per;
    o["measured"] = meas;
    ordered_json err = ordered_json::object();
    if (last)
      for (const auto& pc : last->phases) err[pc.phase] = {{"bytes", pc.error}, {"percent", pc.error_pct}};
    o["error"] = err;
    o["leak"] = r.leak_step ? ordered_json{{"detected", true}, {"from_step", *r.leak_step}, {"bytes_per_step", r.leak_bytes}}
                            : ordered_json{{"detected", false}};
    o["within_tolerance"] = r.within_tolerance;
    return o.dump(2) + "\n";
  }
  if (format != Format::table)
    throw Error(ErrorKind::invalid_argument, "--format: verify prints table or json");
  std::ostringstream out;
  out << "membudget verify · " << printable(r.predicted.model.name) << " on " << r.backend << " · batch " << j.batch << " × seq "
      << j.seq << " · ";
  if (r.infer) {
    out << "infer: prefill + one decode step · weights " << to_string(j.weights) << " · KV " << to_string(j.kv_dtype)
        << " pool of " << j.seq + 1 << " tokens per sequence";
  } else {
    out << to_string(j.precision) << " · recompute " << to_string(j.recompute) << " · " << to_string(j.loss) << " loss";
    if (j.loss == Loss::chunked) out << " (chunk " << std::min(j.loss_chunk, j.batch * j.seq) << ")";
  }
  out << "\n" << r.options.warmup << " warm-up + " << r.options.steps << " measured steps · profile "
      << to_string(j.profile) << " · tolerance " << r.options.tolerance * 100 << "%\n\n";
  out << padr("step  phase", 22) << padl("predicted", 14) << padl("measured", 14) << padl("error", 12)
      << padl("", 10) << "\n";
  for (const auto& sc : r.steps) {
    for (const auto& pc : sc.phases) {
      out << padr(std::to_string(sc.measure.index) + "     " + pc.phase, 22) << padl(format_bytes(pc.predicted), 14)
          << padl(format_bytes(pc.measured), 14) << padl(std::to_string(pc.error) + " B", 12)
          << padl(pct(pc.error_pct), 10) << (pc.ok ? "" : "  ✗") << "\n";
    }
    if (r.infer) {
      out << "      allocated after the step " << format_bytes(sc.measure.allocated_end) << "\n";
    } else {
      char loss[32];
      std::snprintf(loss, sizeof loss, "%.4f", sc.measure.loss);
      out << "      loss " << loss << " · allocated after the step " << format_bytes(sc.measure.allocated_end) << "\n";
    }
  }
  if (r.infer)
    out << "\nKV pool " << r.kv_pool << " B measured, " << r.predicted.terms.kv_cache << " B predicted (kv_cache_bytes of "
        << j.batch << " × " << j.seq + 1 << " tokens) · weights " << r.weights << " B\n";
  out << "\nreserved " << format_bytes(r.reserved) << " · outside the allocator " << format_bytes(r.outside)
      << " · alloc retries " << r.alloc_retries << "\n";
  if (r.allocated_after.size() < 3)
    out << "leak check: needs 3 steps or more (--steps, --warmup)\n";
  else if (r.leak_step)
    out << "leak check: allocated memory climbs from step " << *r.leak_step << " (+" << format_bytes(r.leak_bytes)
        << " per step)\n";
  else
    out << "leak check: flat after step 0 (" << format_bytes(r.allocated_after.back()) << " after each step)\n";
  out << (r.within_tolerance ? "result: every phase within tolerance\n" : "result: some phase misses the prediction beyond tolerance\n");
  return out.str();
}

std::string timeline_svg(const std::vector<TraceEvent>& history, const std::vector<PhaseMark>& marks,
                         const VerifyResult& r) {
  // level[i]: allocated bytes after history event i
  std::vector<double> level;
  level.reserve(history.size() + 1);
  double cur = 0;
  level.push_back(0);
  for (const auto& e : history) {
    if (e.action == TraceEvent::Action::alloc) cur += static_cast<double>(kPyTorchAllocator.round_size(e.size));
    if (e.action == TraceEvent::Action::free_completed) cur -= static_cast<double>(kPyTorchAllocator.round_size(e.size));
    level.push_back(cur);
  }
  double ymax = 1;
  for (double v : level) ymax = std::max(ymax, v);
  for (const auto& p : r.predicted.phases) ymax = std::max(ymax, static_cast<double>(p.bytes));
  for (const auto& p : r.predicted.step0) ymax = std::max(ymax, static_cast<double>(p.bytes));
  ymax *= 1.08;
  const double W = 960, H = 420, left = 80, right = 20, top = 30, bottom = 40;
  const double n = static_cast<double>(std::max<std::size_t>(level.size() - 1, 1));
  auto X = [&](double i) { return left + (W - left - right) * i / n; };
  auto Y = [&](double v) { return top + (H - top - bottom) * (1.0 - v / ymax); };
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(1);
  s << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H << "\" viewBox=\"0 0 " << W
    << " " << H << "\" font-family=\"sans-serif\" font-size=\"11\">\n"
    << "<title>membudget verify: " << r.predicted.model.name << " measured timeline</title>\n"
    << "<rect x=\"0\" y=\"0\" width=\"" << W << "\" height=\"" << H << "\" fill=\"white\"/>\n";
  // axes and y ticks
  s << "<line x1=\"" << left << "\" y1=\"" << Y(0) << "\" x2=\"" << W - right << "\" y2=\"" << Y(0)
    << "\" stroke=\"black\"/>\n<line x1=\"" << left << "\" y1=\"" << top << "\" x2=\"" << left << "\" y2=\"" << Y(0)
    << "\" stroke=\"black\"/>\n";
  for (int t = 0; t <= 4; ++t) {
    const double v = ymax / 1.08 * t / 4;
    s << "<text x=\"" << left - 6 << "\" y=\"" << Y(v) + 4 << "\" text-anchor=\"end\">"
      << format_bytes(static_cast<bytes_t>(v)) << "</text>\n";
  }
  // phases: shaded spans, labels and the predicted peak of each
  for (std::size_t i = 0; i + 1 < marks.size(); ++i) {
    const auto& m = marks[i];
    if (m.phase == "end") continue;
    const double x0 = X(static_cast<double>(m.event)), x1 = X(static_cast<double>(marks[i + 1].event));
    const char* fill = m.phase == "forward" || m.phase == "prefill"
                           ? "#e8f0fe"
                           : (m.phase == "backward" || m.phase == "decode" ? "#fde8e8" : "#e8f8e8");
    s << "<rect x=\"" << x0 << "\" y=\"" << top << "\" width=\"" << std::max(x1 - x0, 0.5) << "\" height=\""
      << Y(0) - top << "\" fill=\"" << fill << "\"/>\n";
    s << "<text x=\"" << x0 + 2 << "\" y=\"" << top - 4 << "\" font-size=\"9\">" << m.step << ":" << m.phase
      << "</text>\n";
    Phase marked{};
    const bytes_t pred = parse_phase(m.phase + "_peak", &marked) ? predicted_phase(r.predicted, m.step, marked) : 0;
    s << "<line x1=\"" << x0 << "\" y1=\"" << Y(static_cast<double>(pred)) << "\" x2=\"" << x1 << "\" y2=\""
      << Y(static_cast<double>(pred)) << "\" stroke=\"#c00\" stroke-width=\"1.5\" stroke-dasharray=\"5,3\"/>\n";
  }
  // measured allocated bytes (bucketed to at most ~2000 points, keeping each bucket's maximum)
  s << "<polyline fill=\"none\" stroke=\"#1a56db\" stroke-width=\"1.2\" points=\"";
  const std::size_t stride = std::max<std::size_t>(1, level.size() / 2000);
  for (std::size_t i = 0; i < level.size(); i += stride) {
    double v = 0;
    for (std::size_t k = i; k < std::min(level.size(), i + stride); ++k) v = std::max(v, level[k]);
    s << X(static_cast<double>(i)) << "," << Y(v) << " ";
  }
  s << "\"/>\n";
  s << "<text x=\"" << left << "\" y=\"" << H - 12 << "\">allocator events → (blue: measured allocated bytes; red "
       "dashed: predicted phase peaks)</text>\n";
  s << "</svg>\n";
  return s.str();
}

}  // namespace membudget::measure
