// Reserved memory: the simulated step's allocation stream replayed through the caching allocator.
//
// simulate_torch_train records each pass's stream (SimTrace: every allocation, free and phase
// start). The replay runs them as one process runs two steps:
//   * step 0 from the start: the parameters as the model is built, the batch, the forward (its
//     cuBLAS workspace at the first matmul), the backward (the autograd thread's workspace), then
//     optimizer.step() creating the state lazily;
//   * then the steady step. Its prologue (the events before its first phase start) re-creates what
//     a steady step finds allocated: each such tensor is matched, by name and size, with the step-0
//     tensor still alive that it stands for (parameters, batch, optimizer state, workspaces), so
//     nothing is allocated twice; the rest runs as recorded.
// Adjustments to the stream, so that the allocator sees the blocks PyTorch asks for:
//   * the simulator's "caching allocator" tensors (whole segments held by parameters and optimizer
//     state, which it adds to memory_allocated() by hand) are skipped: the replay makes them;
//   * the optimizer's lumps (state, fp32 master copy, step temporaries) are split over the
//     trainable parameters in proportion to their size, in parameter order, as torch.optim's
//     zeros_like per parameter and foreach lists allocate them (AdamW: exp_avg then exp_avg_sq).
// The device memory is fake (a bump pointer of addresses, nothing is touched) and unlimited, so no
// flush-and-retry happens: the figure is what the allocator reserves when nothing presses it.
#include "reserved.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "autograd_sim.hpp"
#include "inventory.hpp"
#include "measure/allocator.hpp"
#include "measure/snapshot.hpp"

namespace membudget::detail {
namespace {

// Addresses without memory: raw segments and expandable ranges come from a bump pointer. The
// 64-bit forms are the ones implemented: the replay's segments and addresses pass 4 GiB, which a
// 32-bit target's pointers cannot hold (the web page's wasm32); the pointer forms are never called.
class FakeMemory final : public measure::RawMemory {
 public:
  void* raw_alloc(std::size_t) override { return nullptr; }
  void raw_free(void*, std::size_t) override {}
  measure::DeviceAddr raw_alloc_at(bytes_t bytes) override { return bump(bytes); }
  void raw_free_at(measure::DeviceAddr, bytes_t) override {}
  bytes_t capacity() const override { return bytes_t{1} << 50; }
  bytes_t free_bytes() const override { return capacity(); }
  std::string name() const override { return "fake device memory (reserved-memory replay)"; }
  measure::DeviceAddr reserve_range_at(bytes_t bytes) override { return bump(bytes); }
  void release_range_at(measure::DeviceAddr, bytes_t) override {}
  bool map_range_at(measure::DeviceAddr, bytes_t) override { return true; }
  void unmap_range_at(measure::DeviceAddr, bytes_t) override {}

 private:
  measure::DeviceAddr bump(bytes_t bytes) {
    const measure::DeviceAddr at = next_;
    next_ += (bytes + (bytes_t{2} << 20) - 1) / (bytes_t{2} << 20) * (bytes_t{2} << 20) + (bytes_t{2} << 20);
    return at;
  }
  measure::DeviceAddr next_ = measure::DeviceAddr{1} << 40;
};

bool is(const char* a, const char* b) { return std::strcmp(a, b) == 0; }

class Replay {
 public:
  Replay(const Job& job, const AllocatorPolicy& policy, bool record = false)
      : job_(job), record_(record), alloc_(mem_, options(policy, record)) {}
  const measure::CachingAllocator& allocator() const { return alloc_; }

  // `timeline`: memory_reserved() after each event from the first phase start on (predict --plot).
  void run(const SimTrace& trace, bool steady, std::array<bytes_t, 4>& phase_reserved,
           std::vector<bytes_t>* timeline = nullptr) {
    trainable_.clear();
    trainable_bytes_ = 0;
    for (const TensorInfo& t : trace.tensors)
      if (t.param && t.requires_grad) {
        trainable_.push_back(t.bytes);
        trainable_bytes_ += t.bytes;
      }
    live_.assign(trace.tensors.size(), {});
    // The phase being replayed (its index in kTrainPhases), -1 before the first. A phase that
    // recurs (a pipeline schedule's forwards and backwards) reports the reserved memory at the end
    // of its last occurrence (reserved never shrinks without empty_cache).
    int phase = -1;
    std::size_t phase_events = 0;
    auto phase_index = [](Phase p) {
      return static_cast<int>(std::find(std::begin(kTrainPhases), std::end(kTrainPhases), p) - std::begin(kTrainPhases));
    };
    for (const SimTrace::Event& ev : trace.events) {
      if (ev.t == SimTrace::kPhase) {
        if (phase >= 0 && phase < 4) phase_reserved[static_cast<std::size_t>(phase)] = reserved();
        const bool first = phase < 0;
        phase = phase_index(trace.phases.at(phase_events++));
        if (first && steady) reset_peak();
        continue;
      }
      apply(trace, ev, steady, phase);
      if (timeline && phase >= 0) timeline->push_back(reserved());
    }
    if (phase >= 0 && phase < 4) phase_reserved[static_cast<std::size_t>(phase)] = reserved();
    // What this step leaves allocated, for the next step's prologue to find.
    carried_.clear();
    for (std::size_t t = 0; t < live_.size(); ++t)
      if (!live_[t].empty()) carried_[key(trace.tensors[t])].push_back(std::move(live_[t]));
  }

  bytes_t reserved() const { return static_cast<bytes_t>(alloc_.stats().reserved.current); }
  bytes_t allocated_peak() const { return allocated_peak_; }

 private:
  // One allocation or free of the stream, `phase` the index of the phase it falls in (-1: before).
  void apply(const SimTrace& trace, const SimTrace::Event& ev, bool steady, int phase) {
    if (ev.t < 0) {
      auto& blocks = live_[static_cast<std::size_t>(~ev.t)];
      for (measure::DeviceAddr p : blocks) alloc_.deallocate_at(p);
      blocks.clear();
      return;
    }
    const TensorInfo& info = trace.tensors[static_cast<std::size_t>(ev.t)];
    if (is(info.op, "caching allocator")) return;
    auto& blocks = live_[static_cast<std::size_t>(ev.t)];
    if (steady && phase < 0) {  // the steady step's prologue: what step 0 left allocated
      auto it = carried_.find(key(info));
      if (it != carried_.end() && !it->second.empty()) {
        blocks = std::move(it->second.back());
        it->second.pop_back();
        return;
      }
    }
    if (record_) {  // predict --snapshot: each block names its phase, tensor and op (no strings otherwise)
      const measure::AllocTag tag{info.op, info.name, phase >= 0 && phase < 4 ? to_string(kTrainPhases[phase]) : "before the step"};
      for (bytes_t piece : pieces(info)) blocks.push_back(alloc_.allocate_at(piece, tag));
    } else {
      for (bytes_t piece : pieces(info)) blocks.push_back(alloc_.allocate_at(piece));
    }
    if (steady) allocated_peak_ = std::max<bytes_t>(allocated_peak_, alloc_.stats().allocated.current);
  }

  static measure::AllocatorOptions options(const AllocatorPolicy& policy, bool record) {
    measure::AllocatorOptions o;
    o.policy = policy;
    o.record_history = record;
    return o;
  }
  static std::string key(const TensorInfo& t) { return std::string(t.name) + '\n' + std::to_string(t.bytes); }
  void reset_peak() { allocated_peak_ = static_cast<bytes_t>(alloc_.stats().allocated.current); }

  // The blocks PyTorch asks for to make the simulator's tensor `t`.
  std::vector<bytes_t> pieces(const TensorInfo& t) const {
    if (t.bytes == 0) return {};
    int per_param = 0;
    if (t.role == Role::optimizer_state)
      per_param = job_.optimizer == Optimizer::adamw ? 2 : 1;
    else if (t.role == Role::master_weight || t.role == Role::optimizer_temporary)
      per_param = 1;
    if (per_param == 0 || trainable_bytes_ == 0) return {t.bytes};
    std::vector<bytes_t> out;
    bytes_t given = 0;
    for (std::size_t i = 0; i < trainable_.size(); ++i) {
      const bytes_t share =
          static_cast<bytes_t>(static_cast<unsigned __int128>(t.bytes) * trainable_[i] / trainable_bytes_);
      for (int k = 0; k < per_param; ++k) {
        const bytes_t piece = share / per_param + (k == 0 ? share % per_param : 0);
        if (piece) out.push_back(piece);
        given += piece;
      }
    }
    if (given < t.bytes) {
      if (out.empty()) out.push_back(0);
      out.back() += t.bytes - given;
    }
    return out;
  }

  const Job& job_;
  bool record_;
  FakeMemory mem_;
  measure::CachingAllocator alloc_;
  std::vector<bytes_t> trainable_;
  bytes_t trainable_bytes_ = 0;
  std::vector<std::vector<measure::DeviceAddr>> live_;                          // by tensor id: its blocks
  std::map<std::string, std::vector<std::vector<measure::DeviceAddr>>> carried_;  // live after a step, by name and size
  bytes_t allocated_peak_ = 0;
};

}  // namespace

std::string predicted_snapshot_pickle(const ModelSpec& m, const Job& job, const AllocatorPolicy& policy) {
  std::array<SimTrace, 2> traces;
  simulate_torch_train(m, job, false, nullptr, &traces);
  Replay replay(job, policy, true);
  std::array<bytes_t, 4> phases{};
  replay.run(traces[0], false, phases);
  replay.run(traces[1], true, phases);
  return measure::snapshot_pickle(replay.allocator());
}

std::vector<bytes_t> reserved_timeline(const std::array<SimTrace, 2>& traces, const Job& job, const AllocatorPolicy& policy) {
  Replay replay(job, policy);
  std::array<bytes_t, 4> phases{};
  std::vector<bytes_t> timeline;
  replay.run(traces[0], false, phases);
  replay.run(traces[1], true, phases, &timeline);
  return timeline;
}

ReservedResult simulate_reserved(const ModelSpec& m, const Job& job, const AllocatorPolicy& policy) {
  std::array<SimTrace, 2> traces;
  simulate_torch_train(m, job, false, nullptr, &traces);
  ReservedResult r;
  Replay replay(job, policy);
  replay.run(traces[0], false, r.step0);
  replay.run(traces[1], true, r.steady);
  r.reserved_peak = replay.reserved();
  r.allocated_peak = replay.allocated_peak();
  return r;
}

namespace {
Error conf_error(const std::string& what) {
  return Error(ErrorKind::invalid_job, "--allocator-conf: " + what);
}
std::string trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return std::string(s);
}
std::uint64_t conf_count(const std::string& key, const std::string& v) {
  if (v.empty() || v.size() > 12 || v.find_first_not_of("0123456789") != std::string::npos)
    throw conf_error(key + ": '" + v + "' is not a non-negative integer");
  return std::stoull(v);
}
std::uint32_t divisions(const std::string& v) {
  const std::uint64_t d = conf_count("roundup_power2_divisions", v);
  if (d > 1 && (d & (d - 1))) throw conf_error("roundup_power2_divisions: " + v + " is not a power of 2");
  if (d > (1u << 20)) throw conf_error("roundup_power2_divisions: " + v + " is too large");
  return static_cast<std::uint32_t>(d);
}
}  // namespace

AllocatorConf parse_allocator_conf(std::string_view conf) {
  AllocatorConf out;
  std::vector<std::string> items;
  // split on commas outside brackets
  std::string cur;
  int depth = 0;
  for (char c : conf) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      items.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  items.push_back(cur);
  for (const std::string& raw : items) {
    const std::string item = trim(raw);
    if (item.empty()) continue;
    const auto colon = item.find(':');
    if (colon == std::string::npos) throw conf_error("'" + item + "' is not key:value");
    const std::string k = trim(std::string_view(item).substr(0, colon));
    const std::string v = trim(std::string_view(item).substr(colon + 1));
    if (k == "expandable_segments") {
      if (v == "True" || v == "true") out.policy.expandable_segments = true;
      else if (v == "False" || v == "false") out.policy.expandable_segments = false;
      else throw conf_error("expandable_segments: '" + v + "' is not True or False");
    } else if (k == "max_split_size_mb") {
      const std::uint64_t mb = conf_count(k, v);
      // c10: at least a large segment (20 MiB); larger than any request when unset
      out.policy.max_split_size = std::max<bytes_t>(mb, 20) * MiB;
    } else if (k == "roundup_power2_divisions") {
      if (!v.empty() && v.front() == '[') {
        if (v.back() != ']') throw conf_error("roundup_power2_divisions: '" + v + "' lacks its ']'");
        // [size_mb:divisions, ..., >:divisions]: from the interval of that size (a power of two,
        // in MiB) up to the next one given; '>' sets every interval after the last one given.
        std::string body = v.substr(1, v.size() - 2);
        std::size_t last = 0;
        bool any = false;
        std::size_t pos = 0;
        while (pos <= body.size()) {
          const std::size_t comma = std::min(body.find(',', pos), body.size());
          const std::string e = trim(std::string_view(body).substr(pos, comma - pos));
          pos = comma + 1;
          if (e.empty()) continue;
          const auto c2 = e.find(':');
          if (c2 == std::string::npos) throw conf_error("roundup_power2_divisions: '" + e + "' is not size:divisions");
          const std::string sz = trim(std::string_view(e).substr(0, c2));
          const std::uint32_t d = divisions(trim(std::string_view(e).substr(c2 + 1)));
          if (sz == ">") {
            for (std::size_t i = any ? last + 1 : 0; i < out.policy.roundup_power2_divisions.size(); ++i)
              out.policy.roundup_power2_divisions[i] = d;
            continue;
          }
          const std::uint64_t mb = conf_count("roundup_power2_divisions", sz);
          if (mb == 0 || (mb & (mb - 1))) throw conf_error("roundup_power2_divisions: size " + sz + " is not a power of 2");
          std::size_t idx = static_cast<std::size_t>(std::bit_width(mb) - 1);
          if (idx >= out.policy.roundup_power2_divisions.size()) idx = out.policy.roundup_power2_divisions.size() - 1;
          for (std::size_t i = any ? last + 1 : 0; i <= idx; ++i) out.policy.roundup_power2_divisions[i] = d;
          last = idx;
          any = true;
        }
      } else {
        out.policy.roundup_power2_divisions.fill(divisions(v));
      }
    } else if (k == "garbage_collection_threshold") {
      char* end = nullptr;
      const double f = std::strtod(v.c_str(), &end);
      if (v.empty() || end != v.c_str() + v.size() || !(f > 0.0 && f < 1.0))
        throw conf_error("garbage_collection_threshold: '" + v + "' is not in (0, 1)");
      out.garbage_collection_threshold = f;
    } else {
      throw conf_error("'" + k +
                       "' is not modelled (expandable_segments, max_split_size_mb, roundup_power2_divisions and "
                       "garbage_collection_threshold are)");
    }
  }
  return out;
}

}  // namespace membudget::detail
