// The predicted step as an SVG timeline: plot.hpp. The picture is drawn from the steady step's
// allocation stream (AutogradSim's SimTrace, the same one the compiled plans and the reserved
// replay read), so every band is a tensor the simulation made; the numbers printed on it are the
// budget's.
#include "membudget/plot.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "autograd_sim.hpp"
#include "inventory.hpp"
#include "reserved.hpp"
#include "serve_plan.hpp"
#include "membudget/attribute.hpp"
#include "membudget/error.hpp"

namespace membudget {
namespace {

// The bands, bottom to top, and the roles each gathers; the last is no tensor's: the caching
// allocator's slack (memory_allocated() above the tensors' bytes: blocks taken whole or rounded up),
// drawn where the replay runs, so that the stack's top is the allocated memory the phases report.
constexpr std::array<const char*, 8> kBands = {"parameters",  "gradients",       "optimizer state", "saved activations",
                                               "temporaries", "logits and loss", "workspace",       "allocator slack"};
constexpr std::array<const char*, 8> kColours = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                                 "#edc948", "#b07aa1", "#9c755f", "#bab0ac"};
constexpr std::size_t kSlackBand = kBands.size() - 1;

std::size_t band_of(Role r) {
  switch (r) {
    case Role::parameter:
    case Role::adapter:
    case Role::weight_copy: return 0;
    case Role::gradient: return 1;
    case Role::optimizer_state:
    case Role::master_weight: return 2;
    case Role::saved_activation:
    case Role::input:
    case Role::kv_cache: return 3;
    case Role::temporary:
    case Role::optimizer_temporary:
    case Role::communication: return 4;
    case Role::logits_loss: return 5;
    case Role::workspace: return 6;
  }
  return 4;
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

struct Sample {
  std::array<bytes_t, kBands.size()> band{};
  bytes_t total() const {
    bytes_t t = 0;
    for (bytes_t b : band) t += b;
    return t;
  }
};

// The predicted steady step (or serving step) of the budget's job, replayed event by event: one
// sample of live bytes by band per allocation or free from the first phase start on, and where
// each phase begins.
struct PredictedStream {
  Job job;  // the budget's job, at the rank it is for
  bool serving = false;
  std::array<detail::SimTrace, 2> traces;  // step 0 (training only) and the drawn step
  std::vector<Sample> samples;
  std::vector<std::pair<std::size_t, Phase>> phase_starts;
};
PredictedStream predicted_stream(const ModelSpec& model, const Budget& b) {
  if (b.job.profile != Profile::torch)
    throw Error(ErrorKind::unsupported, "--plot: the timeline covers --profile torch (the harness is not drawn yet)");
  PredictedStream out;
  out.job = b.job;
  if (!out.job.parallel.single()) out.job.parallel.rank = b.rank;  // the rank the budget is for
  out.serving = out.job.mode == Mode::infer;
  if (out.serving) detail::simulate_serving(model, out.job, false, &out.traces[1]);  // the prefill and a decode step
  else detail::simulate_torch_train(model, out.job, false, nullptr, &out.traces);
  const detail::SimTrace& tr = out.traces[1];  // the steady step
  Sample live;
  std::size_t phase_events = 0;
  for (const detail::SimTrace::Event& ev : tr.events) {
    if (ev.t == detail::SimTrace::kPhase) {
      out.phase_starts.push_back({out.samples.size(), tr.phases.at(phase_events++)});
      continue;
    }
    const bool alloc = ev.t >= 0;
    const detail::TensorInfo& t = tr.tensors.at(static_cast<std::size_t>(alloc ? ev.t : ~ev.t));
    bytes_t& band = live.band[band_of(t.role)];
    band = alloc ? band + t.rounded : band - std::min(band, t.rounded);
    if (!out.phase_starts.empty()) out.samples.push_back(live);
  }
  if (out.samples.empty()) throw Error(ErrorKind::unsupported, "--plot: the step has no allocations to draw");
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// The plot area's two axes and five byte gridline labels (0 to 105% of `top`), `y` the byte scale.
template <class Scale>
void axes(std::ostream& o, double left, double upper, double pw, double ph, bytes_t top, const Scale& y) {
  o << "<line x1=\"" << left << "\" y1=\"" << upper + ph << "\" x2=\"" << left + pw << "\" y2=\"" << upper + ph
    << "\" stroke=\"black\"/>\n";
  o << "<line x1=\"" << left << "\" y1=\"" << upper << "\" x2=\"" << left << "\" y2=\"" << upper + ph << "\" stroke=\"black\"/>\n";
  for (int g = 0; g <= 4; ++g) {
    const bytes_t v = static_cast<bytes_t>(static_cast<double>(top) * 1.05 * g / 4);
    o << "<text x=\"" << left - 6 << "\" y=\"" << num(y(v) + 4) << "\" text-anchor=\"end\">" << escape(format_bytes(v)) << "</text>\n";
  }
}
}  // namespace

std::string render_timeline_svg(const ModelSpec& model, const Budget& b, const std::optional<Fit>& fit,
                                const std::string& allocator_conf) {
  PredictedStream stream = predicted_stream(model, b);
  const Job& job = stream.job;
  const bool serving = stream.serving;
  const std::vector<Sample>& samples = stream.samples;
  const auto& phase_starts = stream.phase_starts;
  // memory_allocated() and memory_reserved() after every event, from the same stream replayed
  // through the caching allocator (one value per sample), where the budget has the reserved model:
  // the allocated bytes above the tensors' are the slack band, the reserved bytes a line
  std::vector<bytes_t> reserved;
  if (!b.reserved.empty()) {
    const detail::AllocatorConf conf = allocator_conf.empty() ? detail::AllocatorConf{} : detail::parse_allocator_conf(allocator_conf);
    const std::vector<detail::MemoryAt> replayed = detail::memory_timeline(stream.traces, job, conf.policy);  // the stream drawn, not simulated again
    if (replayed.size() != samples.size())  // the same stream, event for event
      throw std::logic_error("--plot: the reserved replay saw " + std::to_string(replayed.size()) +
                             " events, the timeline " + std::to_string(samples.size()));
    reserved.reserve(replayed.size());
    for (std::size_t i = 0; i < replayed.size(); ++i) {
      const bytes_t tensors = stream.samples[i].total();
      stream.samples[i].band[kSlackBand] = replayed[i].allocated > tensors ? replayed[i].allocated - tensors : 0;
      reserved.push_back(replayed[i].reserved);
    }
  }
  // At most ~2000 points: each bucket keeps its highest moment (peaks stay visible).
  const std::size_t kMaxPoints = 2000;
  const std::size_t stride = (samples.size() + kMaxPoints - 1) / kMaxPoints;
  std::vector<Sample> pts;
  std::vector<std::size_t> at;  // the sample index each point stands for
  std::vector<bytes_t> reserved_pts;  // the highest reserved figure of each bucket
  for (std::size_t i = 0; i < samples.size(); i += stride) {
    std::size_t best = i;
    const std::size_t end = std::min(samples.size(), i + stride);
    for (std::size_t k = i; k < end; ++k)
      if (samples[k].total() > samples[best].total()) best = k;
    pts.push_back(samples[best]);
    at.push_back(best);
    if (!reserved.empty()) reserved_pts.push_back(*std::max_element(reserved.begin() + static_cast<std::ptrdiff_t>(i),
                                                                    reserved.begin() + static_cast<std::ptrdiff_t>(end)));
  }
  std::size_t peak_i = 0;
  for (std::size_t i = 0; i < pts.size(); ++i)
    if (pts[i].total() > pts[peak_i].total()) peak_i = i;

  bytes_t top = 0;
  for (const auto& p : b.phases) top = std::max(top, p.bytes);
  for (const auto& p : b.reserved) top = std::max(top, p.bytes);
  if (fit) top = std::max(top, fit->capacity);
  top = std::max<bytes_t>(top, 1);
  // the legend and the peak's tensor names sit right of the plot, clear of the phase labels that
  // end near its right edge (legend_x), with room for a tensor's name
  const double W = 1380, H = 640, left = 90, right = 430, upper = 50, lower = 60;
  const double pw = W - left - right, ph = H - upper - lower, legend_x = left + pw + 70;
  auto X = [&](std::size_t sample) { return left + pw * static_cast<double>(sample) / static_cast<double>(std::max<std::size_t>(1, samples.size() - 1)); };
  auto Y = [&](bytes_t v) { return upper + ph * (1.0 - static_cast<double>(v) / (static_cast<double>(top) * 1.05)); };

  std::ostringstream o;
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H << "\" viewBox=\"0 0 " << W << ' '
    << H << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o << "<title>" << escape((model.name.empty() ? std::string("model") : model.name) +
                           (serving ? ": predicted serving step, batch " : ": predicted steady training step, batch ") +
                           std::to_string(b.job.batch) + " × seq " + std::to_string(b.job.seq))
    << "</title>\n";
  o << "<text x=\"" << left << "\" y=\"24\" font-size=\"15\">"
    << escape((model.name.empty() ? std::string("model") : model.name) + " · batch " + std::to_string(b.job.batch) + " × seq " +
              std::to_string(b.job.seq) + " · " + to_string(b.job.precision) +
              (b.job.parallel.single() ? std::string() : " · rank " + std::to_string(b.rank) + " of " + std::to_string(b.world)))
    << (serving ? " — allocated memory over the prefill and a decode step (predicted)"
                : " — allocated memory over the steady step (predicted)")
    << "</text>\n";
  // the stacked bands
  for (std::size_t k = 0; k < kBands.size(); ++k) {
    std::ostringstream poly;
    for (std::size_t i = 0; i < pts.size(); ++i) {
      bytes_t cum = 0;
      for (std::size_t q = 0; q <= k; ++q) cum += pts[i].band[q];
      poly << num(X(at[i])) << ',' << num(Y(cum)) << ' ';
    }
    for (std::size_t i = pts.size(); i-- > 0;) {
      bytes_t cum = 0;
      for (std::size_t q = 0; q < k; ++q) cum += pts[i].band[q];
      poly << num(X(at[i])) << ',' << num(Y(cum)) << ' ';
    }
    o << "<polygon class=\"band\" data-band=\"" << kBands[k] << "\" fill=\"" << kColours[k] << "\" fill-opacity=\"0.85\" points=\""
      << poly.str() << "\"/>\n";
  }
  axes(o, left, upper, pw, ph, top, Y);
  o << "<text x=\"" << left + pw / 2 << "\" y=\"" << H - 20 << "\" text-anchor=\"middle\">allocation events of the step (in order)</text>\n";
  // phases: a line where each begins; its peak (the budget's figure) labelled once
  std::vector<Phase> labelled;
  for (std::size_t p = 0; p < phase_starts.size(); ++p) {
    const auto [start, phase] = phase_starts[p];
    const double x = X(start);
    o << "<line class=\"phase-start\" x1=\"" << num(x) << "\" y1=\"" << upper << "\" x2=\"" << num(x) << "\" y2=\"" << upper + ph
      << "\" stroke=\"#555\" stroke-dasharray=\"4 3\"/>\n";
    if (std::find(labelled.begin(), labelled.end(), phase) != labelled.end()) continue;
    labelled.push_back(phase);
    const bytes_t bytes = b.phase(phase);
    // a phase starting in the plot's last quarter is labelled to the left of its line, inside the plot
    const bool near_end = x > left + 0.75 * pw;
    o << "<text class=\"phase-peak\" data-phase=\"" << to_string(phase) << "\" data-bytes=\"" << bytes << "\" x=\""
      << num(near_end ? x - 4 : x + 4) << "\" y=\"" << num(upper + 14 + 14 * static_cast<double>(labelled.size() - 1)) << '"'
      << (near_end ? " text-anchor=\"end\"" : "") << '>' << to_string(phase) << ' ' << escape(format_bytes(bytes)) << "</text>\n";
  }
  // phases the stream does not mark (the serving walk's floor): a dotted level with its figure
  for (const PhasePeak& p : b.phases) {
    if (std::find(labelled.begin(), labelled.end(), p.phase) != labelled.end()) continue;
    labelled.push_back(p.phase);
    o << "<line x1=\"" << left << "\" y1=\"" << num(Y(p.bytes)) << "\" x2=\"" << left + pw << "\" y2=\"" << num(Y(p.bytes))
      << "\" stroke=\"#555\" stroke-dasharray=\"1 3\"/>\n";
    o << "<text class=\"phase-peak\" data-phase=\"" << to_string(p.phase) << "\" data-bytes=\"" << p.bytes << "\" x=\""
      << left + 4 << "\" y=\"" << num(Y(p.bytes) - 4) << "\">" << to_string(p.phase) << ' ' << escape(format_bytes(p.bytes))
      << "</text>\n";
  }
  // memory_reserved() event by event (the replay through the caching allocator): it steps up where
  // a new segment is cached and stays there (nothing is released without empty_cache)
  if (!reserved_pts.empty()) {
    std::ostringstream line;
    for (std::size_t i = 0; i < reserved_pts.size(); ++i) line << num(X(at[i])) << ',' << num(Y(reserved_pts[i])) << ' ';
    o << "<polyline class=\"reserved\" data-bytes=\"" << b.reserved_peak << "\" fill=\"none\" stroke=\"black\" stroke-width=\"1.5\" points=\""
      << line.str() << "\"/>\n";
  }
  if (fit) {
    const bytes_t usable = static_cast<bytes_t>(static_cast<double>(fit->capacity) * (1.0 - fit->headroom));
    for (const auto& [v, label, colour] : {std::tuple{fit->capacity, fit->device.name + " capacity", "#c00"},
                                           std::tuple{usable, std::string("usable (") + num(fit->headroom * 100) + "% headroom)", "#e88"}}) {
      o << "<line class=\"capacity\" data-bytes=\"" << v << "\" x1=\"" << left << "\" y1=\"" << num(Y(v)) << "\" x2=\"" << left + pw
        << "\" y2=\"" << num(Y(v)) << "\" stroke=\"" << colour << "\" stroke-width=\"1.5\"/>\n";
      o << "<text x=\"" << left + pw - 4 << "\" y=\"" << num(Y(v) - 4) << "\" text-anchor=\"end\" fill=\"" << colour << "\">"
        << escape(label + " " + format_bytes(v)) << "</text>\n";
    }
  }
  // the peak and its largest tensors (the budget's live list at its peak phase, when explained)
  const double px = X(at[peak_i]), py = Y(pts[peak_i].total());
  // data-drawn-bytes: the stack's height there (where the replay runs, its allocated bytes)
  o << "<circle class=\"peak\" data-bytes=\"" << b.peak << "\" data-drawn-bytes=\"" << pts[peak_i].total() << "\" cx=\"" << num(px) << "\" cy=\"" << num(py)
    << "\" r=\"4\" fill=\"black\"/>\n";
  const PhasePeak* peak_phase = nullptr;
  for (const auto& p : b.phases)
    if (!peak_phase || p.bytes > peak_phase->bytes) peak_phase = &p;
  if (peak_phase && !peak_phase->live.empty()) {
    std::vector<TensorBytes> live_at_peak = peak_phase->live;
    std::sort(live_at_peak.begin(), live_at_peak.end(), [](const TensorBytes& x, const TensorBytes& y) { return x.bytes > y.bytes; });
    for (std::size_t i = 0; i < std::min<std::size_t>(4, live_at_peak.size()); ++i)
      o << "<text class=\"peak-tensor\" x=\"" << legend_x << "\" y=\"" << num(upper + 200 + 16 * static_cast<double>(i))
        << "\">" << escape(format_bytes(live_at_peak[i].bytes) + "  " + live_at_peak[i].name) << "</text>\n";
    o << "<text x=\"" << legend_x << "\" y=\"" << upper + 184 << "\" font-weight=\"bold\">largest at the peak ("
      << to_string(peak_phase->phase) << ")</text>\n";
  }
  // legend
  for (std::size_t k = 0; k < kBands.size(); ++k) {
    const double y = upper + 16 * static_cast<double>(kBands.size() - 1 - k);
    o << "<rect x=\"" << legend_x << "\" y=\"" << num(y) << "\" width=\"12\" height=\"12\" fill=\"" << kColours[k] << "\"/>\n";
    o << "<text x=\"" << legend_x + 18 << "\" y=\"" << num(y + 10) << "\">" << kBands[k] << "</text>\n";
  }
  if (!b.reserved.empty())
    o << "<text x=\"" << legend_x << "\" y=\"" << upper + 140 << "\">— reserved (caching allocator)</text>\n";
  o << "</svg>\n";
  return o.str();
}

std::string render_attribution_svg(const ModelSpec& model, const Budget& b, const Attribution& a) {
  if (b.job.mode != Mode::train)
    throw Error(ErrorKind::unsupported, "attribute --plot: the prediction beside a snapshot is a training step");
  if (a.timeline.empty()) throw Error(ErrorKind::unsupported, "attribute --plot: the snapshot has no trace to draw");
  const PredictedStream stream = predicted_stream(model, b);
  std::vector<bytes_t> predicted;
  predicted.reserve(stream.samples.size());
  for (const Sample& x : stream.samples) predicted.push_back(x.total());
  const bytes_t predicted_top = *std::max_element(predicted.begin(), predicted.end());
  const std::array<bytes_t, kMemoryTerms> zero{};
  const std::array<bytes_t, kMemoryTerms>& pterms = a.predicted ? *a.predicted : zero;
  bytes_t top = std::max({a.peak_bytes, predicted_top, b.peak});
  top = std::max<bytes_t>(top, 1);
  const double W = 1200, H = 600, left = 90, right = 330, upper = 50, lower = 60;
  const double pw = W - left - right, ph = H - upper - lower;
  auto X = [&](std::size_t i, std::size_t n) {
    return left + pw * static_cast<double>(i) / static_cast<double>(std::max<std::size_t>(1, n - 1));
  };
  auto Y = [&](bytes_t v) { return upper + ph * (1.0 - static_cast<double>(v) / (static_cast<double>(top) * 1.05)); };
  const std::string name = model.name.empty() ? std::string("model") : model.name;
  std::ostringstream o;
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H << "\" viewBox=\"0 0 " << W << ' '
    << H << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o << "<title>" << escape(name + ": measured snapshot beside the predicted step, batch " + std::to_string(b.job.batch) +
                           " × seq " + std::to_string(b.job.seq))
    << "</title>\n";
  o << "<text x=\"" << left << "\" y=\"24\" font-size=\"15\">"
    << escape(name + " · batch " + std::to_string(b.job.batch) + " × seq " + std::to_string(b.job.seq) + " · " +
              to_string(b.job.precision))
    << " — allocated memory, measured (snapshot) and predicted</text>\n";
  axes(o, left, upper, pw, ph, top, Y);
  o << "<text x=\"" << left + pw / 2 << "\" y=\"" << H - 20
    << "\" text-anchor=\"middle\">each stream over its own events, start to end (the snapshot's trace; the predicted steady "
       "step)</text>\n";
  // the two curves (the predicted one bucketed as the measured one is: each point the highest of its stretch)
  const std::size_t stride = (predicted.size() + Attribution::kTimelinePoints - 1) / Attribution::kTimelinePoints;
  std::vector<bytes_t> pred_pts;
  for (std::size_t i = 0; i < predicted.size(); i += stride)
    pred_pts.push_back(*std::max_element(predicted.begin() + static_cast<std::ptrdiff_t>(i),
                                         predicted.begin() + static_cast<std::ptrdiff_t>(std::min(predicted.size(), i + stride))));
  for (const auto& [cls, pts, colour, peak] :
       {std::tuple{"measured", &a.timeline, "#d62728", a.peak_bytes}, std::tuple{"predicted", static_cast<const std::vector<bytes_t>*>(&pred_pts), "#1f77b4", predicted_top}}) {
    std::ostringstream line;
    std::size_t peak_i = 0;
    for (std::size_t i = 0; i < pts->size(); ++i) {
      line << num(X(i, pts->size())) << ',' << num(Y((*pts)[i])) << ' ';
      if ((*pts)[i] > (*pts)[peak_i]) peak_i = i;
    }
    o << "<polyline class=\"" << cls << "\" data-bytes=\"" << peak << "\" fill=\"none\" stroke=\"" << colour
      << "\" stroke-width=\"1.5\" points=\"" << line.str() << "\"/>\n";
    o << "<circle class=\"" << cls << "-peak\" data-bytes=\"" << peak << "\" cx=\"" << num(X(peak_i, pts->size())) << "\" cy=\""
      << num(Y(peak)) << "\" r=\"4\" fill=\"" << colour << "\"/>\n";
    o << "<text x=\"" << num(X(peak_i, pts->size()) + 6) << "\" y=\"" << num(Y(peak) - 6) << "\" fill=\"" << colour << "\">" << cls
      << " peak " << escape(format_bytes(peak)) << "</text>\n";
  }
  // the bytes live at each peak, by budget term: two stacked bars
  constexpr std::array<const char*, kMemoryTerms> kTermColours = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#b07aa1", "#9c755f"};
  const double bar_w = 60, bars_left = left + pw + 40;
  for (int side = 0; side < 2; ++side) {
    const std::array<bytes_t, kMemoryTerms>& terms = side == 0 ? a.measured : pterms;
    if (side == 1 && !a.predicted) break;
    const double x = bars_left + side * (bar_w + 30);
    bytes_t cum = 0;
    for (std::size_t t = 0; t < kMemoryTerms; ++t) {
      const bytes_t v = terms[t];
      o << "<rect class=\"term\" data-side=\"" << (side == 0 ? "measured" : "predicted") << "\" data-term=\""
        << to_string(static_cast<MemoryTerm>(t)) << "\" data-bytes=\"" << v << "\" x=\"" << num(x) << "\" y=\"" << num(Y(cum + v))
        << "\" width=\"" << bar_w << "\" height=\"" << num(Y(cum) - Y(cum + v)) << "\" fill=\"" << kTermColours[t] << "\"/>\n";
      cum += v;
    }
    o << "<text x=\"" << num(x + bar_w / 2) << "\" y=\"" << upper + ph + 16 << "\" text-anchor=\"middle\">"
      << (side == 0 ? "measured" : "predicted") << "</text>\n";
  }
  for (std::size_t t = 0; t < kMemoryTerms; ++t) {
    const double y = upper + 16 * static_cast<double>(kMemoryTerms - 1 - t);
    o << "<rect x=\"" << bars_left + 2 * bar_w + 50 << "\" y=\"" << num(y) << "\" width=\"12\" height=\"12\" fill=\"" << kTermColours[t]
      << "\"/>\n";
    o << "<text x=\"" << bars_left + 2 * bar_w + 66 << "\" y=\"" << num(y + 10) << "\">" << to_string(static_cast<MemoryTerm>(t))
      << "</text>\n";
  }
  o << "<text x=\"" << bars_left << "\" y=\"" << upper - 12 << "\" font-weight=\"bold\">live at each peak, by term</text>\n";
  o << "</svg>\n";
  return o.str();
}

std::string predicted_snapshot(const ModelSpec& model, const Budget& b, const std::string& allocator_conf) {
  if (b.job.mode != Mode::train || b.job.profile != Profile::torch)
    throw Error(ErrorKind::unsupported, "--snapshot: the predicted trace covers training with --profile torch");
  Job job = b.job;
  if (!job.parallel.single()) job.parallel.rank = b.rank;
  const detail::AllocatorConf conf =
      allocator_conf.empty() ? detail::AllocatorConf{} : detail::parse_allocator_conf(allocator_conf);
  return detail::predicted_snapshot_pickle(model, job, conf.policy);
}

}  // namespace membudget
