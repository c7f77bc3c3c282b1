// attribute_snapshot(): the live allocations at the peak of a snapshot's trace, by frame and term.
#include "membudget/attribute.hpp"

#include <algorithm>
#include <map>
#include <tuple>

#include "pickle.hpp"
#include "attribute_internal.hpp"
#include "trace.hpp"

namespace membudget {

const char* to_string(MemoryTerm t) noexcept {
  switch (t) {
    case MemoryTerm::parameters: return "parameters";
    case MemoryTerm::gradients: return "gradients";
    case MemoryTerm::optimizer_state: return "optimizer_state";
    case MemoryTerm::activations: return "activations";
    case MemoryTerm::logits_loss: return "logits_loss";
    case MemoryTerm::other: return "other";
  }
  return "other";
}

namespace {

using diagnose::Frame;
using diagnose::Lifetime;
using diagnose::PickleValue;

bool has(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

bool python_frame(const Frame& f) { return f.filename.size() >= 3 && f.filename.substr(f.filename.size() - 3) == ".py"; }

// PyTorch's own Python files: ".../site-packages/torch/...", a source tree's "torch/...".
// (A path like /opt/torch/.venv/.../transformers/... is not PyTorch.)
bool torch_frame(const Frame& f) {
  return has(f.filename, "site-packages/torch/") || has(f.filename, "dist-packages/torch/") ||
         f.filename.rfind("torch/", 0) == 0 || has(f.filename, "/pytorch/torch/");
}

bool library_frame(const Frame& f) {
  if (torch_frame(f) || has(f.filename, "<frozen")) return true;
  const bool stdlib = has(f.filename, "/lib/python") && !has(f.filename, "site-packages") && !has(f.filename, "dist-packages");
  return stdlib;
}

// "file:line name" of the innermost Python frame outside torch/ and the standard library.
std::string frame_label(const std::vector<Frame>& frames) {
  const Frame* pick = nullptr;
  for (const auto& f : frames)
    if (python_frame(f) && !library_frame(f)) {
      pick = &f;
      break;
    }
  if (!pick)
    for (const auto& f : frames)
      if (python_frame(f)) {
        pick = &f;
        break;
      }
  if (!pick && !frames.empty()) pick = &frames.front();
  if (!pick) return "<no Python frame>";
  return std::string(pick->filename) + ":" + std::to_string(pick->line) + " " + std::string(pick->name);
}

bool any_frame(const std::vector<Frame>& frames, bool (*pred)(const Frame&)) {
  return std::any_of(frames.begin(), frames.end(), pred);
}

bool optimizer_frame(const Frame& f) {
  return has(f.filename, "/optim/") || has(f.filename, "optimizer.py") || f.name == "zero_grad";
}
bool zero_grad_frame(const Frame& f) { return f.name == "zero_grad" || has(f.filename, "/optim/") || has(f.filename, "optimizer.py"); }
bool backward_frame(const Frame& f) {
  return has(f.name, "backward") || (torch_frame(f) && has(f.filename, "torch/autograd/")) || has(f.name, "autograd::Engine") ||
         has(f.name, "evaluate_function");
}
bool loss_frame(const Frame& f) {
  return has(f.name, "cross_entropy") || has(f.name, "nll_loss") || has(f.name, "log_softmax") ||
         has(f.name, "ForCausalLMLoss") || has(f.filename, "loss_utils") || has(f.filename, "/loss.py");
}
bool setup_frame(const Frame& f) {
  return (torch_frame(f) && has(f.filename, "nn/modules/") &&
          (f.name == "__init__" || f.name == "_apply" || f.name == "to" || f.name == "cuda" || f.name == "reset_parameters")) ||
         f.name == "from_pretrained" || f.name == "from_config" || f.name == "_from_config" ||
         has(f.name, "load_state_dict") || has(f.filename, "nn/init.py");
}

// cuBLAS's workspace is allocated through the caching allocator by the first matmul on a stream
// and kept: 32 MiB (":4096:8", CUDA 12+ on Hopper) or 8 MiB + 128 KiB (":4096:2:16:8").
bool workspace_size(bytes_t size) { return size == 32 * MiB || size == 8 * MiB + 128 * KiB; }

struct Classifier {
  bool trace_has_frames = false;
  bool saw_zero_grad = false;  // some free came from zero_grad / the optimizer: gradients die there
  std::vector<bytes_t> logits_sizes;  // b·s·V × 2 and × 4, rounded to 512

  MemoryTerm classify(const Lifetime& l, const std::vector<Frame>& frames, const std::vector<Frame>& free_frames,
                      std::string& label) const {
    const bool freed = l.died != diagnose::kAliveAtEnd;
    const bool freed_by_step = freed && any_frame(free_frames, zero_grad_frame);
    if (l.born == diagnose::kBeforeRecording) {
      if (frames.empty()) label = "<before recording>";
      if (freed) return freed_by_step ? MemoryTerm::gradients : MemoryTerm::activations;
      return MemoryTerm::parameters;  // split with a model afterwards
    }
    if (any_frame(frames, optimizer_frame)) return MemoryTerm::optimizer_state;
    if (any_frame(frames, setup_frame)) return MemoryTerm::parameters;
    if (!freed && workspace_size(l.size)) {
      label = "<cuBLAS workspace (never freed)>";
      return MemoryTerm::other;
    }
    const bool in_backward = any_frame(frames, backward_frame) || (frames.empty() && trace_has_frames);
    if (in_backward && (freed_by_step || (!freed && !saw_zero_grad))) return MemoryTerm::gradients;
    if (in_backward && !freed) return MemoryTerm::other;  // outlives zero_grad: not a gradient
    const bytes_t rounded = (l.size + 511) / 512 * 512;
    if (std::find(logits_sizes.begin(), logits_sizes.end(), rounded) != logits_sizes.end())
      return MemoryTerm::logits_loss;
    if (any_frame(frames, loss_frame)) return MemoryTerm::logits_loss;
    return MemoryTerm::activations;
  }
};


}  // namespace

namespace diagnose {

std::string user_frame_label(const std::vector<Frame>& frames) { return frame_label(frames); }
bool is_optimizer_frame(const Frame& f) { return optimizer_frame(f); }
bool is_workspace_size(bytes_t size) { return workspace_size(size); }

Attribution attribute_decoded(const DecodedSnapshot& snap, const Budget* budget, const Job& job) {
  Attribution a;
  a.device = snap.device;
  a.has_trace = snap.has_trace;
  a.trace_entries = snap.events.size();
  const diagnose::Replay r = diagnose::replay(snap);
  a.before_recording = r.initial;
  a.inconsistent_events = r.inconsistent;
  a.end_bytes = r.live.empty() ? r.initial : r.live.back();
  // the first moment of the maximum
  a.peak_bytes = r.initial;
  a.peak_index = -1;
  for (std::size_t i = 0; i < r.live.size(); ++i)
    if (r.live[i] > a.peak_bytes) {
      a.peak_bytes = r.live[i];
      a.peak_index = static_cast<std::int64_t>(i);
    }
  if (a.peak_index >= 0) a.peak_time_us = snap.events[static_cast<std::size_t>(a.peak_index)].time_us;
  {  // the curve, max-preserving: every peak of the trace stays visible
    const std::size_t n = r.live.size() + 1;  // the state before the trace, then each event
    const std::size_t stride = (n + Attribution::kTimelinePoints - 1) / Attribution::kTimelinePoints;
    auto at = [&](std::size_t i) { return i == 0 ? r.initial : r.live[i - 1]; };
    for (std::size_t i = 0; i < n; i += stride) {
      bytes_t top = 0;
      for (std::size_t k = i; k < std::min(n, i + stride); ++k) top = std::max(top, at(k));
      a.timeline.push_back(top);
    }
  }

  Classifier cls;
  for (const auto& e : snap.events)
    if (e.frames && e.frames->size() > 0) {
      cls.trace_has_frames = true;
      break;
    }
  for (const auto& e : snap.events) {
    if (e.action != diagnose::Action::free_requested && e.action != diagnose::Action::free_completed) continue;
    if (!e.frames || e.frames->size() == 0) continue;
    if (any_frame(diagnose::frames_of(e.frames, snap.where + ": frames of a free"), zero_grad_frame)) {
      cls.saw_zero_grad = true;
      break;
    }
  }
  if (budget) {
    const bytes_t tv = checked_product("logits size", job.batch, job.seq, budget->model.vocab_size);
    for (bytes_t k : {2ull, 4ull}) cls.logits_sizes.push_back((checked_mul(tv, k, "logits size") + 511) / 512 * 512);
  }

  struct Live {
    const Lifetime* l;
    MemoryTerm term;
    std::string label;
  };
  std::vector<Live> live;
  for (const auto& l : r.lifetimes) {
    if (!(l.born <= a.peak_index && a.peak_index < l.died)) continue;
    const std::string where = snap.where + ": frames of the allocation at " + std::to_string(l.addr);
    const auto frames = diagnose::frames_of(l.frames, where);
    const auto free_frames = diagnose::frames_of(l.free_frames, where);
    Live x{&l, MemoryTerm::activations, {}};
    x.term = cls.classify(l, frames, free_frames, x.label);
    if (x.label.empty()) x.label = frame_label(frames);
    live.push_back(std::move(x));
  }
  // Persistent blocks from before recording: parameters up to the predicted weights, then
  // optimizer state up to the predicted state (+ master weights), then other (address order).
  if (budget) {
    std::vector<Live*> pre;
    for (auto& x : live)
      if (x.l->born == diagnose::kBeforeRecording && x.term == MemoryTerm::parameters) pre.push_back(&x);
    std::sort(pre.begin(), pre.end(), [](const Live* p, const Live* q) { return p->l->addr < q->l->addr; });
    const bytes_t w = budget->states.weights, o = budget->states.optimizer + budget->states.master;
    bytes_t sum = 0;
    for (Live* x : pre) {
      const bytes_t mid = sum + x->l->size / 2;  // a block goes where most of it falls
      x->term = mid < w ? MemoryTerm::parameters : (mid < w + o ? MemoryTerm::optimizer_state : MemoryTerm::other);
      sum += x->l->size;
    }
    a.predicted = predicted_terms(*budget);
    a.predicted_peak = budget->peak;
    a.predicted_phase = budget->peak_phase;
  }
  std::map<std::pair<std::string, MemoryTerm>, AllocationGroup> groups;
  for (const auto& x : live) {
    auto& g = groups[{x.label, x.term}];
    g.frame = x.label;
    g.term = x.term;
    g.bytes += x.l->size;
    g.count += 1;
    a.measured[static_cast<std::size_t>(x.term)] += x.l->size;
  }
  for (auto& [k, g] : groups) a.groups.push_back(std::move(g));
  std::sort(a.groups.begin(), a.groups.end(), [](const AllocationGroup& p, const AllocationGroup& q) {
    return std::tie(q.bytes, p.frame) < std::tie(p.bytes, q.frame);
  });
  return a;
}

}  // namespace diagnose

std::array<bytes_t, kMemoryTerms> predicted_terms(const Budget& b) {
  std::array<bytes_t, kMemoryTerms> out{};
  const PhasePeak* p = b.peak_entry();
  if (!p) return out;
  auto add = [&](MemoryTerm t, bytes_t v) { out[static_cast<std::size_t>(t)] += v; };
  for (const auto& t : p->live) {
    switch (t.role) {
      case Role::parameter:
      case Role::adapter: add(MemoryTerm::parameters, t.bytes); break;
      case Role::gradient: add(MemoryTerm::gradients, t.bytes); break;
      case Role::optimizer_state:
      case Role::master_weight:
      case Role::optimizer_temporary: add(MemoryTerm::optimizer_state, t.bytes); break;
      case Role::logits_loss: add(MemoryTerm::logits_loss, t.bytes); break;
      case Role::workspace:
      case Role::input: add(MemoryTerm::other, t.bytes); break;
      default:
        // the rest follows its term: activations, weight copies and temporaries of the forward
        // and backward, and a loss-side temporary (the logits gradient) with the loss
        add(t.term == Term::logits_loss ? MemoryTerm::logits_loss
            : t.term == Term::other     ? MemoryTerm::other
                                        : MemoryTerm::activations,
            t.bytes);
    }
  }
  return out;
}

}  // namespace membudget
