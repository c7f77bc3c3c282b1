// snapshot_leaks(): the allocated-after-step series and the never-freed allocations of a trace.
#include "membudget/snapshot_leaks.hpp"

#include <algorithm>
#include <map>

#include "attribute_internal.hpp"
#include "json_out.hpp"
#include "pickle.hpp"
#include "trace.hpp"

namespace membudget {
namespace {

using diagnose::Action;
using diagnose::DecodedSnapshot;

// Event indices that end a step: the last event at or before each boundary time.
std::vector<std::size_t> boundaries_from_annotations(const DecodedSnapshot& s, std::vector<std::int64_t>& times,
                                                     std::string& how) {
  std::vector<std::size_t> out;
  for (const char* prefix : {"Optimizer.zero_grad", "Optimizer.step"}) {
    times.clear();
    for (const auto& a : s.annotations)
      if (!a.start && a.name.rfind(prefix, 0) == 0) times.push_back(a.time_us);
    if (!times.empty()) {
      how = std::string("annotations: end of ") + prefix;
      break;
    }
  }
  std::sort(times.begin(), times.end());
  for (std::int64_t t : times) {
    // the last event with time_us <= t (events are in time order)
    auto it = std::upper_bound(s.events.begin(), s.events.end(), t,
                               [](std::int64_t v, const diagnose::TraceEvent& e) { return v < e.time_us; });
    if (it == s.events.begin()) continue;
    out.push_back(static_cast<std::size_t>(it - s.events.begin() - 1));
  }
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<std::size_t> boundaries_from_frames(const DecodedSnapshot& s, std::vector<std::int64_t>& times,
                                                std::string& how) {
  std::vector<std::size_t> out;
  times.clear();
  bool in_opt = false;
  std::size_t last = 0;
  for (std::size_t i = 0; i < s.events.size(); ++i) {
    const auto& e = s.events[i];
    if (e.action != Action::alloc && e.action != Action::free_requested) continue;
    const auto frames = diagnose::frames_of(e.frames, s.where + ": frames of event " + std::to_string(i));
    if (frames.empty()) continue;  // the autograd thread: no evidence either way
    const bool opt = std::any_of(frames.begin(), frames.end(), diagnose::is_optimizer_frame);
    if (opt) {
      in_opt = true;
      last = i;
    } else if (in_opt) {
      out.push_back(last);
      times.push_back(s.events[last].time_us);
      in_opt = false;
    }
  }
  if (in_opt) {
    out.push_back(last);
    times.push_back(s.events[last].time_us);
  }
  how = "frames: end of each optimizer run";
  return out;
}

SnapshotLeaks run(const DecodedSnapshot& s, const LeakOptions& options) {
  SnapshotLeaks r;
  if (!s.has_trace)
    throw Error(ErrorKind::unsupported, s.where + ": the snapshot has no allocation trace (record with "
                                                  "torch.cuda.memory._record_memory_history())");
  std::vector<std::int64_t> times;
  std::vector<std::size_t> b = boundaries_from_annotations(s, times, r.boundaries);
  if (b.empty()) b = boundaries_from_frames(s, times, r.boundaries);
  if (b.empty())
    throw Error(ErrorKind::unsupported,
                s.where + ": no step boundaries: the trace has neither Optimizer annotations nor optimizer frames "
                          "(record with stacks, or write the bytes allocated after each step to a steps.csv)");
  const diagnose::Replay rep = diagnose::replay(s);
  for (std::size_t k = 0; k < b.size(); ++k) {
    r.series.steps.push_back(static_cast<std::int64_t>(k));
    r.series.allocated.push_back(rep.live[b[k]]);
  }
  r.boundary_time_us = times;
  r.report = detect_leak(r.series.allocated, r.series.steps, options);

  // Survivors: born after the first boundary and up to the last, never freed.
  const auto first = static_cast<std::int64_t>(b.front());
  const auto last = static_cast<std::int64_t>(b.back());
  std::map<std::string, SurvivorGroup> groups;
  for (const auto& l : rep.lifetimes) {
    if (l.died != diagnose::kAliveAtEnd || l.born <= first || l.born > last) continue;
    if (diagnose::is_workspace_size(l.size)) continue;
    const auto frames = diagnose::frames_of(l.frames, s.where + ": frames of the allocation at " + std::to_string(l.addr));
    const std::string label = diagnose::user_frame_label(frames);
    auto& g = groups[label];
    if (g.count == 0) {
      g.frame = label;
      g.first_step = static_cast<std::int64_t>(
          std::lower_bound(b.begin(), b.end(), static_cast<std::size_t>(l.born)) - b.begin());
    }
    g.bytes += l.size;
    g.count += 1;
    r.survivor_bytes += l.size;
  }
  for (auto& [k, g] : groups) r.survivors.push_back(std::move(g));
  std::sort(r.survivors.begin(), r.survivors.end(),
            [](const SurvivorGroup& x, const SurvivorGroup& y) { return x.bytes > y.bytes; });
  return r;
}

}  // namespace

SnapshotLeaks snapshot_leaks(std::string pickle_bytes, const std::string& where, const LeakOptions& options) {
  const auto snap = diagnose::decode_snapshot(diagnose::parse_pickle(std::move(pickle_bytes), where), where);
  return run(snap, options);
}

SnapshotLeaks snapshot_leaks_file(const std::string& path, const LeakOptions& options) {
  return run(diagnose::read_snapshot_file(path), options);
}

std::string to_json(const SnapshotLeaks& l, int indent) {
  nlohmann::json j = diagnose::leak_json(l.report);
  j["boundaries"] = l.boundaries;
  j["allocated_after_step"] = l.series.allocated;
  j["boundary_time_us"] = l.boundary_time_us;
  j["survivor_bytes"] = l.survivor_bytes;
  nlohmann::json a = nlohmann::json::array();
  for (const auto& g : l.survivors)
    a.push_back({{"frame", g.frame}, {"bytes", g.bytes}, {"count", g.count}, {"first_step", g.first_step}});
  j["survivors"] = a;
  return diagnose::dump(j, indent);
}

}  // namespace membudget
