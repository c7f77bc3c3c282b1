#include "membudget/oom_attribution.hpp"

#include <cmath>
#include <cstdlib>

#include "json_out.hpp"

namespace membudget {
namespace {
bool size_matches(bytes_t requested, bytes_t tensor) {
  const double diff = std::fabs(static_cast<double>(requested) - static_cast<double>(tensor));
  return diff <= 2.0 * MiB || diff <= 0.02 * static_cast<double>(tensor);
}
}  // namespace

OomAttribution attribute_oom(const OomReport& report, const ModelSpec& model, const Job& job) {
  PredictOptions po;
  po.explain = true;
  const Budget b = predict(model, job, po);
  OomAttribution a;
  a.predicted_peak = b.peak;
  a.predicted_required = b.peak + b.terms.overhead;
  double best = 1e300;
  auto scan = [&](const std::vector<PhasePeak>& phases, const char* prefix) {
    for (const auto& p : phases) {
      for (const auto& t : p.live) {
        if (t.count == 0) continue;
        const bytes_t one = t.bytes / t.count;
        if (!size_matches(report.requested, one)) continue;
        const double d = std::fabs(static_cast<double>(report.requested) - static_cast<double>(one));
        // Prefer the tensor allocated closest to the phase's peak: a later phase wins ties only
        // when strictly closer in size.
        if (d < best) {
          best = d;
          a.matched = true;
          a.term = to_string(t.term);
          a.tensor = t.name;
          a.phase = std::string(prefix) + p.name();
          a.tensor_bytes = one;
        }
      }
    }
  };
  scan(b.phases, "");
  scan(b.step0, "step0.");
  if (a.matched) {
    a.note = "the failed " + format_bytes(report.requested) + " request matches \"" + a.tensor + "\" (" + a.term +
             ", " + format_bytes(a.tensor_bytes) + " predicted), live at " + a.phase;
  } else {
    // No single tensor of that size: say which term dominates the predicted peak.
    a.term = "unknown";
    a.note = "no tensor of " + format_bytes(report.requested) +
             " in the prediction for this job; check the job flags (batch, sequence, precision) against the run";
  }
  if (report.capacity > 0 && a.predicted_required > report.capacity)
    a.note += "; the prediction (" + format_bytes(a.predicted_required) + " with overhead) exceeds the card's " +
              format_bytes(report.capacity) + ", so this job cannot fit as configured";
  return a;
}

nlohmann::json diagnose::oom_json(const OomReport& report, const OomContext& context, const OomAttribution& a) {
  nlohmann::json j = oom_json(report, context);
  j["attribution"] = {{"matched", a.matched},
                      {"term", a.term},
                      {"tensor", a.tensor},
                      {"phase", a.phase},
                      {"tensor_bytes", a.tensor_bytes},
                      {"predicted_peak", a.predicted_peak},
                      {"predicted_required", a.predicted_required},
                      {"note", a.note}};
  return j;
}

std::string to_json(const OomReport& report, const OomContext& context, const OomAttribution& a, int indent) {
  return diagnose::dump(diagnose::oom_json(report, context, a), indent);
}

}  // namespace membudget
