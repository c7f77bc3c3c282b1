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
#include <array>
#include <bit>
#include <limits>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "autograd_sim.hpp"
#include "inventory.hpp"
#include "plan_cache.hpp"
#include "membudget/error.hpp"
#include "plan_common.hpp"
#include "step_plan.hpp"
#include "fake_memory.hpp"
#include "measure/allocator.hpp"
#include "measure/snapshot.hpp"

namespace membudget::detail {
namespace {

bool is(const char* a, const char* b) { return std::strcmp(a, b) == 0; }

// A recorded pass as the replay reads it: what replaying an event needs of its tensor, worked out
// once per trace rather than at every event (a compiled stream keeps its two: ReservedStream).
struct ReplayScript {
  struct Tensor {
    std::uint32_t name = 0;  // the tensor's name as a number, the same in both passes' scripts
    measure::StreamId stream = 0;
    // 0: one block. Else an optimizer's lump, a block per trainable parameter (AdamW's state: two,
    // exp_avg and exp_avg_sq) in proportion to its size: Replay::pieces.
    std::uint8_t per_param = 0;
    bool own = false;  // the lump is split over its optimizer's parameters only, not every one
    std::uint8_t optimizer = 0;
    bool state = false;  // its optimizer's state lump (its size scales the one-at-a-time temporaries)
    // The for-loop AdamW's temporaries over shards (FSDP2, ZeRO-1, TP, a pipeline stage: over a
    // whole model the trace records them, runs_loop) (_single_tensor_adam, adam.py:545: denom =
    // (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)): per parameter in turn, the sqrt and
    // the quotient, each the parameter's exp_avg_sq in size; the sqrt dies with the statement, the
    // quotient when the next parameter's replaces it (the snapshots in tests/data/reserved_alone/).
    // The simulated step counts only their peak (the largest parameter's two); the replay runs them.
    bool one_parameter_at_a_time = false;
    // The for-loop's temporaries the trace records allocation by allocation (SimTrace::optimizer_loop:
    // Adafactor's; AdamW's over a whole model), run in place of the tensor; nothing is left allocated.
    bool runs_loop = false;
  };
  const SimTrace* trace = nullptr;  // the tensors' names and ops, for the tags of a recorded replay
  // The trace's events (SimTrace::Event::t), less those of the simulator's "caching allocator"
  // tensors (whole segments held by parameters and optimizer state, which it adds to
  // memory_allocated() by hand): the replay's allocator makes those segments itself.
  std::vector<std::int32_t> events;
  std::vector<std::int8_t> phases;  // each phase start's phase, as its index in kTrainPhases (4: none of them)
  std::vector<Tensor> tensors;      // by tensor id
  // The trainable parameters in the order their optimizer state is made: optimizer by optimizer.
  std::vector<std::uint32_t> trainable;
  // Each one's share of its optimizer's lumps (state, temporaries): its elements in the state where
  // the trace gives them (TensorInfo::state_elements: an FSDP2 rank's own chunk), else 0 (its bytes).
  std::vector<std::uint64_t> state_weight;

  // Both passes' scripts of `job`; a tensor name gets one number in both (the steady step's
  // prologue finds step 0's tensors by name and size).
  static std::array<ReplayScript, 2> of(const std::array<SimTrace, 2>& traces, const Job& job) {
    std::array<ReplayScript, 2> out;
    std::unordered_map<std::string_view, std::uint32_t> names;
    for (std::size_t pass = 0; pass < 2; ++pass) {
      const SimTrace& trace = traces[pass];
      ReplayScript& script = out[pass];
      script.trace = &trace;
      script.tensors.resize(trace.tensors.size());
      std::vector<bool> skipped(trace.tensors.size());
      for (std::size_t t = 0; t < trace.tensors.size(); ++t) {
        const TensorInfo& info = trace.tensors[t];
        Tensor& tensor = script.tensors[t];
        tensor.name = names.try_emplace(info.name, static_cast<std::uint32_t>(names.size())).first->second;
        tensor.stream = static_cast<measure::StreamId>(info.stream);
        if (info.role == Role::optimizer_state)
          tensor.per_param = job.optimizer == Optimizer::adamw ? 2 : 1;
        else if (info.role == Role::master_weight || info.role == Role::optimizer_temporary)
          tensor.per_param = 1;
        // an optimizer's state and temporaries are its own parameters' (one state lump and one
        // temporary per optimizer: TensorInfo::optimizer), the master copy every parameter's
        tensor.own = info.role == Role::optimizer_temporary || info.role == Role::optimizer_state;
        tensor.optimizer = info.optimizer;
        tensor.state = info.role == Role::optimizer_state;
        tensor.one_parameter_at_a_time = info.role == Role::optimizer_temporary && trace.optimizer_loop.empty() &&
                                         job.optimizer == Optimizer::adamw &&
                                         effective_optimizer_impl(job) == OptimizerImpl::for_loop &&
                                         !recipe_of(job.precision).master && job.lora_rank == 0;
        tensor.runs_loop = info.role == Role::optimizer_temporary && !trace.optimizer_loop.empty();
        skipped[t] = is(info.op, kCachingAllocatorOp);
      }
      script.events.reserve(trace.events.size());
      for (const SimTrace::Event& ev : trace.events)
        if (ev.t == SimTrace::kPhase || !skipped[static_cast<std::size_t>(ev.t < 0 ? ~ev.t : ev.t)])
          script.events.push_back(ev.t);
      for (Phase p : trace.phases)
        script.phases.push_back(static_cast<std::int8_t>(std::find(std::begin(kTrainPhases), std::end(kTrainPhases), p) -
                                                         std::begin(kTrainPhases)));
      for (std::size_t t = 0; t < trace.tensors.size(); ++t)
        if (trace.tensors[t].param && trace.tensors[t].requires_grad && trace.tensors[t].stepped)
          script.trainable.push_back(static_cast<std::uint32_t>(t));
      std::stable_sort(script.trainable.begin(), script.trainable.end(), [&](std::uint32_t a, std::uint32_t b) {
        const TensorInfo &x = trace.tensors[a], &y = trace.tensors[b];
        return x.optimizer != y.optimizer ? x.optimizer < y.optimizer : x.step_order < y.step_order;
      });
      for (std::uint32_t t : script.trainable) script.state_weight.push_back(trace.tensors[t].state_elements);
      script.find_closed_windows();
    }
    return out;
  }

  // Closed windows, for Replay::skip_closed_window: window_end[i] is one past the last event of
  // the shortest run of events from allocation i (after the step's first phase start, within
  // one phase) in which every allocation is freed again, each of a one-block tensor (no optimizer
  // lump or loop) of one stream; its frees may also be of tensors allocated before it. 0 where
  // no run from i closes so. The events do not depend on the shape (ReservedStream), so neither
  // do the windows.
  std::vector<std::uint32_t> window_end;
  // Each allocation's free and each free's allocation, by event index; -1 where the other is not
  // in the script or the tensor was allocated again while live (its blocks then add up).
  std::vector<std::int32_t> partner;

 private:
  bool one_block(std::size_t t) const {
    const Tensor& x = tensors[t];
    return x.per_param == 0 && !x.state && !x.one_parameter_at_a_time && !x.runs_loop;
  }
  void find_closed_windows() {
    const std::size_t n = events.size();
    if (n >= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) return;  // (no windows)
    partner.assign(n, -1);
    std::vector<std::int32_t> open(tensors.size(), -1);
    std::vector<bool> again(tensors.size(), false);
    for (std::size_t i = 0; i < n; ++i) {
      const std::int32_t ev = events[i];
      if (ev == SimTrace::kPhase) continue;
      const auto t = static_cast<std::size_t>(ev < 0 ? ~ev : ev);
      if (ev >= 0) {
        if (open[t] >= 0)
          again[t] = true;
        else
          open[t] = static_cast<std::int32_t>(i);
        continue;
      }
      if (open[t] >= 0 && !again[t]) {
        partner[i] = open[t];
        partner[static_cast<std::size_t>(open[t])] = static_cast<std::int32_t>(i);
      }
      open[t] = -1;
      again[t] = false;
    }
    window_end.assign(n, 0);
    const auto first_phase = static_cast<std::size_t>(std::find(events.begin(), events.end(), SimTrace::kPhase) - events.begin());
    // From the last allocation back: a window from i holds the window of every allocation k inside
    // it, so the scan takes k's (already known) in one step and fails where k has none (a window of
    // another stream fails too). Scanning event by event instead was quadratic in the step's
    // length (a forward's saved tensors reach to the phase's end): most of a 70B compile.
    for (std::size_t i = n; i-- > first_phase + 1;) {
      const std::int32_t ev = events[i];
      if (ev < 0 || partner[i] < 0 || !one_block(static_cast<std::size_t>(ev))) continue;
      const measure::StreamId stream = tensors[static_cast<std::size_t>(ev)].stream;
      auto end = static_cast<std::size_t>(partner[i]);
      bool closed = true;
      for (std::size_t k = i + 1; k <= end && closed;) {
        const std::int32_t e = events[k];
        if (e == SimTrace::kPhase) {
          closed = false;
        } else if (e < 0) {
          ++k;
        } else {
          closed = window_end[k] != 0 && tensors[static_cast<std::size_t>(e)].stream == stream;
          if (closed) {
            end = std::max(end, static_cast<std::size_t>(window_end[k]) - 1);
            k = window_end[k];
          }
        }
      }
      if (closed) window_end[i] = static_cast<std::uint32_t>(end + 1);
    }
  }
};

// The tensors' own bytes in each pass (a stream's come from ReservedStream::sizes instead).
std::array<std::vector<bytes_t>, 2> recorded_sizes(const std::array<SimTrace, 2>& traces) {
  std::array<std::vector<bytes_t>, 2> out;
  for (std::size_t pass = 0; pass < 2; ++pass)
    for (const TensorInfo& info : traces[pass].tensors) out[pass].push_back(info.bytes);
  return out;
}

class Replay {
 public:
  explicit Replay(const AllocatorPolicy& policy, bool record = false) : record_(record), alloc_(mem_, options(policy, record)) {}
  const measure::CachingAllocator& allocator() const { return alloc_; }

  // As constructed with `policy`, keeping the room its containers have grown to (a thread's
  // replays reuse one: simulate_reserved).
  void reset(const AllocatorPolicy& policy) {
    alloc_.reset(options(policy, record_));
    mem_.reset();
    lists_used_ = 0;
    carried_.clear();
    state_bytes_.clear();
    allocated_peak_ = 0;
    skipped_events_ = 0;
  }
  // Whether closed windows may be skipped where the policy allows (skip_closed_window): a test
  // replays without to hold the reserved figures to the whole replay's.
  void allow_skipping(bool allow) { allow_skipping_ = allow; }
  std::size_t skipped_events() const { return skipped_events_; }

  // `sizes`: each tensor's bytes (the trace's own, or a compiled stream's evaluated at the shape:
  // ReservedStream). `timeline`: memory_allocated() and memory_reserved() after each event from
  // the first phase start on (predict --plot), every event replayed.
  void run(const ReplayScript& script, const std::vector<bytes_t>& sizes, bool steady, std::array<bytes_t, 4>& phase_reserved,
           std::vector<MemoryAt>* timeline = nullptr) {
    sizes_ = &sizes;
    trainable_.clear();
    trainable_optimizer_.clear();
    trainable_bytes_ = 0;
    optimizer_bytes_.assign(script.trainable.empty() ? 0 : script.tensors[script.trainable.back()].optimizer + 1u, 0);
    for (std::size_t i = 0; i < script.trainable.size(); ++i) {
      const std::uint32_t t = script.trainable[i];
      const bytes_t weight = script.state_weight[i] ? script.state_weight[i] : sizes[t];
      trainable_.push_back(weight);
      trainable_optimizer_.push_back(script.tensors[t].optimizer);
      trainable_bytes_ += weight;
      optimizer_bytes_[script.tensors[t].optimizer] += weight;
    }
    live_.assign(script.tensors.size(), Held{});
    // The phase being replayed (its index in kTrainPhases), -1 before the first. A phase that
    // recurs (a pipeline schedule's forwards and backwards) reports the reserved memory at the end
    // of its last occurrence (reserved never shrinks without empty_cache).
    int phase = -1;
    std::size_t phase_events = 0;
    if (timeline) timeline->reserve(timeline->size() + script.events.size());
    phase_allocated_ = {};
    made_at_first_forward_.clear();
    bool rebuild_pending = steady;
    // (a timeline records every event: a skipped window's allocated bytes are not known event by event)
    const bool skips = !timeline && skips_closed_windows() && script.window_end.size() == script.events.size();
    window_sums_ready_ = false;
    window_summed_ = 0;
    for (std::size_t i = 0; i < script.events.size(); ++i) {
      const std::int32_t ev = script.events[i];
      if (rebuild_pending && phase >= 0 && ev >= 0) {
        rebuild_at_first_forward(script, phase);
        rebuild_pending = false;
      }
      if (skips && phase >= 0 && !rebuild_pending && script.window_end[i] && skip_closed_window(script, i, steady, phase)) {
        i = script.window_end[i] - 1;
        continue;
      }
      if (ev == SimTrace::kPhase) {
        if (phase >= 0 && phase < 4) phase_reserved[static_cast<std::size_t>(phase)] = reserved();
        const bool first = phase < 0;
        phase = script.phases.at(phase_events++);
        note_phase_allocated(phase);  // what the phase finds allocated counts too
        if (first && steady) reset_peak();
        continue;
      }
      if (ev < 0)
        free_tensor(static_cast<std::size_t>(~ev));
      else
        allocate_tensor(script, static_cast<std::size_t>(ev), steady, phase);
      if (timeline && phase >= 0) timeline->push_back({static_cast<bytes_t>(alloc_.stats().allocated.current), reserved()});
    }
    if (phase >= 0 && phase < 4) phase_reserved[static_cast<std::size_t>(phase)] = reserved();
    // What this step leaves allocated, for the next step's prologue to find: by name and size, in
    // tensor order (the prologue takes the last of each).
    carried_.clear();
    for (std::size_t t = 0; t < live_.size(); ++t)
      if (live_[t].n) carried_[CarryKey{script.tensors[t].name, sizes[t]}].push_back(live_[t]);
  }

  bytes_t reserved() const { return static_cast<bytes_t>(alloc_.stats().reserved.current); }
  // Windows are skipped (skip_closed_window) unless recording the history (the snapshot shows
  // every block) or under a setting whose best fit is not the smallest block that holds the
  // request (max_split_size, expandable segments) or whose rounding is not a mask.
  bool skips_closed_windows() const {
    const AllocatorPolicy& p = alloc_.policy();
    return allow_skipping_ && !record_ && !p.expandable_segments && p.max_split_size == std::numeric_limits<bytes_t>::max() &&
           !p.rounds_to_divisions() && std::has_single_bit(p.min_block_size);
  }
  bytes_t allocated_peak() const { return allocated_peak_; }
  // max_memory_allocated() within each phase of the last step run (by index in kTrainPhases)
  const std::array<bytes_t, 4>& phase_allocated() const { return phase_allocated_; }

 private:
  // The blocks that make one tensor: none, one (inline) or several (an optimizer lump's pieces,
  // in lists_).
  struct Held {
    std::uint32_t n = 0;
    std::uint32_t list = 0;     // n > 1: lists_[list]
    measure::BlockRef block;    // n == 1
  };
  struct CarryKey {
    std::uint32_t name;  // ReplayScript::Tensor::name
    bytes_t bytes;
    bool operator==(const CarryKey&) const = default;
  };
  struct CarryHash {
    std::size_t operator()(const CarryKey& k) const noexcept {
      return (k.name * 0x9e3779b97f4a7c15ull) ^ (k.bytes * 0xff51afd7ed558ccdull);
    }
  };

  // What the steady step's prologue re-creates but does not find carried from step 0, and what
  // step 0 left that the prologue does not re-create, is DDP's bucket rebuild: Reducer's
  // rebuild_buckets, at the second iteration's first forward, frees step 0's bucket of every
  // parameter and allocates the rebuilt ones. So both wait for the step's first allocation after
  // its start, after the frees that open the step (a last pipeline stage's output chunks of the
  // step before, freed by clear_runtime_states: Llama 3.1 8B's 1F1B x DDP 2 stage,
  // tests/data/mul_order_alone/).
  void rebuild_at_first_forward(const ReplayScript& script, int phase) {
    for (auto& [key, held] : carried_) {
      for (const Held& h : held) release(h);
      held.clear();
    }
    for (const std::size_t t : made_at_first_forward_) allocate_tensor(script, t, true, phase);
  }
  // A lump's pieces go last first: a foreach result is a Python list, whose deallocation drops
  // its items from the end (CPython's list_dealloc; the optimizer's temporaries in the snapshot of
  // OLMoE's uneven FSDP2 ranks, tests/data/fsdp_uneven/: freed in the reverse of their allocation).
  void release(const Held& h) {
    if (h.n == 1) {
      alloc_.deallocate_block(h.block);
    } else if (h.n > 1) {
      const auto& blocks = lists_[h.list];
      for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) alloc_.deallocate_block(*b);
    }
  }

  void free_tensor(std::size_t t) {
    release(live_[t]);
    live_[t] = Held{};
  }
  // The script's allocation of tensor t, `phase` the index of the phase it falls in (-1: before).
  // (Inline in run's loop: as a call, its entry and exit were a tenth of the replay outside the
  // allocator.)
  [[gnu::always_inline]] void allocate_tensor(const ReplayScript& script, std::size_t t, bool steady, int phase) {
    const ReplayScript::Tensor& tensor = script.tensors[t];
    const bytes_t bytes = (*sizes_)[t];
    Held& h = live_[t];
    if (tensor.state) {  // an optimizer's state, made or (a steady step's prologue) found carried
      if (tensor.optimizer >= state_bytes_.size()) state_bytes_.resize(tensor.optimizer + 1u, 0);
      state_bytes_[tensor.optimizer] = bytes;
    }
    if (steady && phase < 0) {  // the steady step's prologue: what step 0 left allocated
      auto it = carried_.find(CarryKey{tensor.name, bytes});
      if (it != carried_.end() && !it->second.empty()) {
        h = it->second.back();
        it->second.pop_back();
      } else {
        made_at_first_forward_.push_back(t);
      }
      return;
    }
    if (tensor.one_parameter_at_a_time) {
      run_one_parameter_at_a_time(script, t, tensor, steady, phase);
      return;
    }
    if (tensor.runs_loop) {
      run_loop(script, t, tensor, steady, phase);
      return;
    }
    if (h.n == 0 && tensor.per_param == 0) {  // the usual tensor: one block
      if (bytes) {
        h.n = 1;
        h.block = alloc_.allocate_block(bytes, tag(script, t, phase), tensor.stream);
      }
    } else if (pieces(tensor, bytes); !pieces_.empty()) {
      const measure::AllocTag& tag = this->tag(script, t, phase);
      if (h.n == 0 && pieces_.size() == 1) {
        h.n = 1;
        h.block = alloc_.allocate_block(pieces_[0], tag, tensor.stream);
      } else {  // several pieces (or a tensor allocated again while live: its blocks add up)
        if (h.n <= 1) {
          const Held had = h;
          h.list = new_list();
          if (had.n == 1) lists_[h.list].push_back(had.block);
        }
        auto& list = lists_[h.list];
        for (bytes_t piece : pieces_) list.push_back(alloc_.allocate_block(piece, tag, tensor.stream));
        h.n = static_cast<std::uint32_t>(list.size());
      }
    }
    note_allocated(steady, phase);
  }

  // A closed window (ReplayScript::window_end) frees every block it allocates, so it leaves the
  // allocator as it would be after just its frees of older tensors, when none of its requests
  // makes a segment: c10 merges a freed block with its free neighbours, so which blocks are free
  // depends only on which are allocated. None makes one when the pool's largest free block could
  // hold every request of the window at once: each request takes at most its rounded size from
  // that block's free end (or, unsplit, the whole block: at most small_size more, should_split),
  // frees only add room, so the end always holds the next. Such a window is replayed as its frees
  // of older tensors alone, its own blocks counted as their rounded sizes in the allocated peaks
  // (an unsplit block's extra bytes are not counted: exact only on the replay's reserved figures).
  bool skip_closed_window(const ReplayScript& script, std::size_t from, bool steady, int phase) {
    const std::size_t end = script.window_end[from];
    const measure::StreamId stream = script.tensors[static_cast<std::size_t>(script.events[from])].stream;
    const auto [small, large] = window_requests(script, from, end);
    if (large && large > alloc_.largest_free_block(false, stream)) return false;
    if (small && small > alloc_.largest_free_block(true, stream)) return false;
    bytes_t own = 0, peak = 0;  // the window's blocks allocated; allocated bytes at most
    for (std::size_t k = from; k < end; ++k) {
      const std::int32_t ev = script.events[k];
      if (ev >= 0) {
        const bytes_t bytes = (*sizes_)[static_cast<std::size_t>(ev)];
        if (bytes) own += rounded_request(bytes);
        peak = std::max(peak, static_cast<bytes_t>(alloc_.stats().allocated.current) + own);
      } else if (script.partner[k] >= static_cast<std::int32_t>(from)) {
        const bytes_t bytes = (*sizes_)[static_cast<std::size_t>(~ev)];
        if (bytes) own -= rounded_request(bytes);
      } else {
        free_tensor(static_cast<std::size_t>(~ev));
      }
    }
    if (steady) allocated_peak_ = std::max(allocated_peak_, peak);
    if (phase < 4) {
      bytes_t& phase_peak = phase_allocated_[static_cast<std::size_t>(phase)];
      phase_peak = std::max(phase_peak, peak);
    }
    skipped_events_ += end - from;
    return true;
  }

  // What skip_closed_window's test sums over the window [from, end): the rounded small-pool
  // requests, and the large-pool ones each with small_size more. A window that fails the test is
  // replayed, and the window of the next allocation inside it tested, so summing each window anew
  // is quadratic where windows nest deep (Mixtral-shaped experts eagerly looped, 8,192 hit in one
  // layer: 5 s). Windows are summed one by one until that has read as many events as four passes
  // over the script, then from running sums over the whole script: linear either way, and a step
  // whose windows are short (the usual) never pays for the running sums (5% of a replay's
  // instructions where they were always made).
  std::pair<unsigned __int128, unsigned __int128> window_requests(const ReplayScript& script, std::size_t from, std::size_t end) {
    const std::size_t n = script.events.size();
    if (!window_sums_ready_ && window_summed_ + (end - from) > 4 * n) {
      small_before_.resize(n + 1);
      large_before_.resize(n + 1);
      small_before_[0] = large_before_[0] = 0;
      for (std::size_t k = 0; k < n; ++k) {
        const auto [small, large] = request_of(script.events[k]);
        small_before_[k + 1] = small_before_[k] + small;
        large_before_[k + 1] = large_before_[k] + large;
      }
      window_sums_ready_ = true;
    }
    if (window_sums_ready_) return {small_before_[end] - small_before_[from], large_before_[end] - large_before_[from]};
    window_summed_ += end - from;
    unsigned __int128 small = 0, large = 0;
    for (std::size_t k = from; k < end; ++k) {
      const auto [s, l] = request_of(script.events[k]);
      small += s;
      large += l;
    }
    return {small, large};
  }
  // An event's part of window_requests' sums: (rounded small request, rounded large request +
  // small_size); a free or an empty tensor (0, 0).
  std::pair<bytes_t, unsigned __int128> request_of(std::int32_t ev) const {
    const bytes_t bytes = ev < 0 ? 0 : (*sizes_)[static_cast<std::size_t>(ev)];
    if (bytes == 0) return {0, 0};
    const AllocatorPolicy& p = alloc_.policy();
    const bytes_t r = rounded_request(bytes);
    if (p.is_small(r)) return {r, 0};
    return {0, static_cast<unsigned __int128>(r) + p.small_size};
  }
  // A request's block size as the allocator rounds it, where skip_closed_window applies (a
  // power-of-two unit, no divisions: skips_closed_windows).
  bytes_t rounded_request(bytes_t bytes) const {
    const bytes_t unit = alloc_.policy().min_block_size;
    return bytes <= unit ? unit : (bytes + unit - 1) & ~(unit - 1);
  }

  // ReplayScript::Tensor::one_parameter_at_a_time: each of the optimizer's parameters' sqrt and
  // quotient, the quotient freed after the next parameter's sqrt; nothing is left allocated.
  void run_one_parameter_at_a_time(const ReplayScript& script, std::size_t t, const ReplayScript::Tensor& tensor, bool steady,
                                   int phase) {
    const bytes_t state = of_optimizer(state_bytes_, tensor.optimizer);
    const bytes_t over = of_optimizer(optimizer_bytes_, tensor.optimizer);
    if (state == 0 || over == 0) return;
    const measure::AllocTag& tag = this->tag(script, t, phase);
    measure::BlockRef previous{};
    bool has_previous = false;
    for (std::size_t i = 0; i < trainable_.size(); ++i) {
      if (trainable_optimizer_[i] != tensor.optimizer) continue;
      // the parameter's exp_avg_sq: its share of the state (exp_avg and exp_avg_sq)
      const bytes_t each = static_cast<bytes_t>(static_cast<unsigned __int128>(state) * trainable_[i] / over / 2);
      if (each == 0) continue;
      const measure::BlockRef sqrt = alloc_.allocate_block(each, tag, tensor.stream);
      const measure::BlockRef quotient = alloc_.allocate_block(each, tag, tensor.stream);
      note_allocated(steady, phase);
      alloc_.deallocate_block(sqrt);
      if (has_previous) alloc_.deallocate_block(previous);
      previous = quotient;
      has_previous = true;
    }
    if (has_previous) alloc_.deallocate_block(previous);
  }

  // ReplayScript::Tensor::runs_loop: the trace's optimizer loop, block by block.
  void run_loop(const ReplayScript& script, std::size_t t, const ReplayScript::Tensor& tensor, bool steady, int phase) {
    const measure::AllocTag& tag = this->tag(script, t, phase);
    for (const LoopOp& op : script.trace->optimizer_loop) {
      if (op.id >= loop_blocks_.size()) loop_blocks_.resize(op.id + 1u);
      if (op.bytes == 0) {
        alloc_.deallocate_block(loop_blocks_[op.id]);
        continue;
      }
      loop_blocks_[op.id] = alloc_.allocate_block(op.bytes, tag, tensor.stream);
      note_allocated(steady, phase);
    }
  }

  // An optimizer's entry of a by-optimizer figure; 0 for an optimizer with no parameters.
  static bytes_t of_optimizer(const std::vector<bytes_t>& by_optimizer, std::uint8_t o) {
    return o < by_optimizer.size() ? by_optimizer[o] : 0;
  }

  static measure::AllocatorOptions options(const AllocatorPolicy& policy, bool record) {
    measure::AllocatorOptions o;
    o.policy = policy;
    o.record_history = record;
    return o;
  }
  // predict --snapshot: each block names its phase, tensor and op (no strings otherwise)
  const measure::AllocTag& tag(const ReplayScript& script, std::size_t t, int phase) {
    return record_ ? tag_of(script, t, phase) : untagged_;
  }
  const measure::AllocTag& tag_of(const ReplayScript& script, std::size_t t, int phase) {
    const TensorInfo& info = script.trace->tensors[t];
    return tag_ = {info.op, info.name, phase >= 0 && phase < 4 ? to_string(kTrainPhases[phase]) : "before the step"};
  }
  void reset_peak() { allocated_peak_ = static_cast<bytes_t>(alloc_.stats().allocated.current); }
  // memory_allocated() after an allocation of `phase` (its index in kTrainPhases): the steady
  // steps' peak, and each phase's of this step.
  void note_allocated(bool steady, int phase) {
    if (steady) allocated_peak_ = std::max<bytes_t>(allocated_peak_, alloc_.stats().allocated.current);
    note_phase_allocated(phase);
  }
  void note_phase_allocated(int phase) {
    if (phase < 0 || phase >= 4) return;
    bytes_t& peak = phase_allocated_[static_cast<std::size_t>(phase)];
    peak = std::max<bytes_t>(peak, alloc_.stats().allocated.current);
  }
  // An empty list of lists_ (the next of those a reset left).
  std::uint32_t new_list() {
    if (lists_used_ == lists_.size()) lists_.emplace_back();
    lists_[lists_used_].clear();
    return static_cast<std::uint32_t>(lists_used_++);
  }

  // The blocks PyTorch asks for to make the simulator's tensor `t` of `bytes`, into pieces_: the
  // optimizer's lumps (state, fp32 master copy, step temporaries) split over the trainable
  // parameters in proportion to their size, in parameter order, as torch.optim's zeros_like per
  // parameter and foreach lists allocate them (AdamW: exp_avg then exp_avg_sq).
  void pieces(const ReplayScript::Tensor& t, bytes_t bytes) {
    pieces_.clear();
    if (bytes == 0) return;
    const int per_param = t.per_param;
    const bool own = t.own;
    const bytes_t over = own ? of_optimizer(optimizer_bytes_, t.optimizer) : trainable_bytes_;
    if (per_param == 0 || over == 0) {
      pieces_.push_back(bytes);
      return;
    }
    bytes_t given = 0;
    for (std::size_t i = 0; i < trainable_.size(); ++i) {
      if (own && trainable_optimizer_[i] != t.optimizer) continue;
      const bytes_t share = static_cast<bytes_t>(static_cast<unsigned __int128>(bytes) * trainable_[i] / over);
      for (int k = 0; k < per_param; ++k) {
        const bytes_t piece = share / per_param + (k == 0 ? share % per_param : 0);
        if (piece) pieces_.push_back(piece);
        given += piece;
      }
    }
    if (given < bytes) {
      if (pieces_.empty()) pieces_.push_back(0);
      pieces_.back() += bytes - given;
    }
  }

  bool record_;
  bool allow_skipping_ = true;
  std::size_t skipped_events_ = 0;  // since the last reset: skip_closed_window's events
  const std::vector<bytes_t>* sizes_ = nullptr;
  FakeMemory mem_;
  measure::CachingAllocator alloc_;
  std::vector<bytes_t> trainable_;                 // the trainable parameters' shares of the state (ReplayScript::state_weight), in state order
  std::vector<std::uint8_t> trainable_optimizer_;  // and the optimizer of each
  bytes_t trainable_bytes_ = 0;
  std::vector<bytes_t> optimizer_bytes_;           // by optimizer
  std::vector<bytes_t> state_bytes_;               // each optimizer's state lump, once allocated
  std::vector<bytes_t> pieces_;
  std::vector<measure::BlockRef> loop_blocks_;  // run_loop's blocks, by LoopOp::id
  measure::AllocTag tag_;  // the allocation's tag when recording
  const measure::AllocTag untagged_;
  std::vector<Held> live_;                                // by tensor id: its blocks
  std::vector<std::vector<measure::BlockRef>> lists_;     // the blocks of tensors made of several
  std::size_t lists_used_ = 0;                            // lists_ in use since the last reset
  std::unordered_map<CarryKey, std::vector<Held>, CarryHash> carried_;  // live after a step, by name and size
  // window_requests': the running sums (once a run has summed enough windows one by one)
  std::vector<unsigned __int128> small_before_, large_before_;
  bool window_sums_ready_ = false;
  std::size_t window_summed_ = 0;  // events summed one window at a time in this run
  std::vector<std::size_t> made_at_first_forward_;  // the steady prologue's tensors not carried (rebuild_at_first_forward)
  bytes_t allocated_peak_ = 0;
  std::array<bytes_t, 4> phase_allocated_{};  // the last step's, by phase (note_allocated)
};


// The two steps' streams compiled in the micro-batch and the sequence, for a new shape of a model
// and recipe already seen (a scheduler asks predict() with the reserved memory at many shapes).
//
// Within a regime (StepPlan::regime: the chunked loss's side of b·s = loss_chunk, the sliding
// window's side of s = window) the simulation's control flow does not depend on b or s, as the
// compiled plans (step_plan.cpp) rely on too: the same tensors are allocated and freed in the same
// order, and each tensor's size is c · b^i · (s / seq_unit)^j. So the streams are simulated once,
// at the plans' three probe shapes plus a fourth, (b0 + 1, s0 + 1), whose sizes are not multiples
// of the others' (a size that is a monomial only at the first three, like an eager MoE layer's
// tokens per expert, S / E_hit, fails there). Every check below must hold or there is no stream and
// simulate_reserved simulates the shape in full: the four streams are the same events and phases,
// their tensors the same names, ops, roles and parameter flags, and every size is one monomial at
// all four. A new shape then costs the sizes (one monomial per tensor) and the replay, which runs
// exactly as on a simulated stream (tests/test_reserved_stream.cpp compares the two).
// The eager MoE experts under balanced routing are excluded outright: how many experts a layer
// runs, min(E, T·k), is control flow in b·s.
class ReservedStream {
 public:
  static std::shared_ptr<const ReservedStream> compile(const ModelSpec& m, const Job& job) {
    try {
      return build(m, job);
    } catch (const plan::Fail&) {
      return nullptr;
    } catch (const Error&) {  // a probe the simulator refuses: the shape itself decides, simulated
      return nullptr;
    }
  }

  // This thread's stream for (m, job)'s regime; nullptr: simulate. Compiled when the regime is asked
  // about a second time: the compile simulates four steps where the first question needs one
  // (PlanCache::get_on_second_use). At most 16 streams per thread (a 70B one holds some 2 MB),
  // cleared when full.
  static const ReservedStream* cached(const ModelSpec& m, const Job& job) {
    return PlanCache<ReservedStream, 16>::mine().get_on_second_use(m, job, regime(m, job), compile);
  }
  static bool held(const ModelSpec& m, const Job& job) { return PlanCache<ReservedStream, 16>::mine().holds(m, job, regime(m, job)); }
  // The same, compiled now (for tests).
  static const ReservedStream* compiled(const ModelSpec& m, const Job& job) {
    return PlanCache<ReservedStream, 16>::mine().get(m, job, regime(m, job), compile);
  }

  static void clear_cache() noexcept { PlanCache<ReservedStream, 16>::mine().clear(); }
  static std::uint64_t regime(const ModelSpec& m, const Job& job) { return static_cast<std::uint64_t>(StepPlan::regime(m, job)); }

  // The recorded streams (the first probe's) as the replay reads them; sizes() gives their bytes.
  const std::array<ReplayScript, 2>& scripts() const { return scripts_; }
  // Every tensor's bytes at (b, seq); false where the shape is not the plan's (a sequence that is
  // not a multiple of seq_unit) or a size does not fit 64 bits: simulate it.
  bool sizes(std::uint64_t b, std::uint64_t seq, std::array<std::vector<bytes_t>, 2>& out) const {
    if (b == 0 || seq == 0 || seq % seq_unit_) return false;
    const std::uint64_t s = seq / seq_unit_;
    std::array<std::uint64_t, 16> pow{};  // b^i · s^j at [4i + j]
    for (unsigned i = 0; i < 4; ++i)
      for (unsigned j = 0; j < 4; ++j) {
        const plan::u128 v = plan::monomial(b, i, s, j);
        pow[4 * i + j] = v > plan::kMax64 ? 0 : static_cast<std::uint64_t>(v);  // 0: does not fit
      }
    for (int pass = 0; pass < 2; ++pass) {
      const auto& mono = mono_[pass];
      auto& o = out[pass];
      o.resize(mono.size());
      for (std::size_t t = 0; t < mono.size(); ++t) {
        const Mono& mo = mono[t];
        if (mo.launch >= 0) {  // a kernel's temporary: its rule at the shape
          if (!plan::launch_value(launch_[static_cast<std::size_t>(mo.launch)], b, s, &o[t])) return false;
          continue;
        }
        if (mo.c == 0 || mo.ij == 0) {
          o[t] = mo.c;
          continue;
        }
        const std::uint64_t x = pow[mo.ij];
        const plan::u128 v = static_cast<plan::u128>(mo.c) * x;
        if (x == 0 || v > plan::kMax64) return false;
        o[t] = static_cast<bytes_t>(v);
      }
    }
    return true;
  }

 private:
  struct Mono {
    bytes_t c = 0;
    std::uint8_t ij = 0;  // 4 · i + j: the size is c · b^i · s^j
    std::int32_t launch = -1;  // else launch_[launch]'s value (a kernel's temporary)
  };

  static bool same_tensor(const TensorInfo& a, const TensorInfo& b) {
    return std::strcmp(a.name, b.name) == 0 && std::strcmp(a.op, b.op) == 0 && a.role == b.role && a.param == b.param &&
           a.requires_grad == b.requires_grad && a.stream == b.stream && a.optimizer == b.optimizer;
  }

  static std::shared_ptr<const ReservedStream> build(const ModelSpec& m, const Job& job) {
    if (m.moe.enabled() && job.experts == ExpertsImpl::eager && job.routing == Routing::balanced) throw plan::Fail{};
    const std::array<plan::Probe, 3> three = training_probes(m, job);
    const bool batch_one = StepPlan::regime(m, job) & StepPlan::kBatchOne;  // the probes keep b = 1
    const std::array<plan::Probe, 4> probes{three[0], three[1], three[2],
                                            {batch_one ? 1 : three[0].b + 1, three[0].s + 1}};
    auto out = std::make_shared<ReservedStream>();
    out->seq_unit_ = StepPlan::seq_unit(job);
    std::array<std::array<SimTrace, 2>, 4> tr;
    for (std::size_t k = 0; k < probes.size(); ++k) {
      Job pj = job;
      pj.batch = probes[k].b;
      pj.seq = probes[k].s * out->seq_unit_;
      if (StepPlan::regime(m, pj) != StepPlan::regime(m, job)) throw plan::Fail{};
      simulate_torch_train(m, pj, false, nullptr, &tr[k]);
    }
    for (int pass = 0; pass < 2; ++pass) {
      const SimTrace& t0 = tr[0][pass];
      for (std::size_t k = 1; k < probes.size(); ++k) {
        const SimTrace& tk = tr[k][pass];
        if (!(tk.events == t0.events) || tk.phases != t0.phases || tk.tensors.size() != t0.tensors.size()) throw plan::Fail{};
        for (std::size_t t = 0; t < t0.tensors.size(); ++t)
          if (!same_tensor(t0.tensors[t], tk.tensors[t])) throw plan::Fail{};
      }
      auto& mono = out->mono_[pass];
      mono.resize(t0.tensors.size());
      for (std::size_t t = 0; t < t0.tensors.size(); ++t) {
        if (t0.tensors[t].launch.kind != LaunchSize::Kind::none) {
          std::array<LaunchSize, 4> at;
          for (std::size_t k = 0; k < probes.size(); ++k) at[k] = tr[k][pass].tensors[t].launch;
          mono[t].launch = static_cast<std::int32_t>(out->launch_.size());
          out->launch_.push_back(plan::fit_launch(at, probes));
          continue;
        }
        std::array<bytes_t, 4> v;
        for (std::size_t k = 0; k < probes.size(); ++k) v[k] = tr[k][pass].tensors[t].bytes;
        mono[t] = classify(v, probes);
      }
    }
    out->traces_ = std::move(tr[0]);
    out->scripts_ = ReplayScript::of(out->traces_, job);
    return out;
  }

  // The monomial c · b^i · s^j (i, j ≤ 3) that gives the four probes' sizes, or Fail.
  static Mono classify(const std::array<bytes_t, 4>& v, const std::array<plan::Probe, 4>& p) {
    const plan::Monomial mo = plan::fit_monomial(v, p);
    return Mono{mo.c, static_cast<std::uint8_t>(4 * mo.i + mo.j)};
  }

  std::array<SimTrace, 2> traces_;
  std::array<ReplayScript, 2> scripts_;  // of traces_
  std::array<std::vector<Mono>, 2> mono_;
  std::vector<plan::Basis> launch_;  // the kernels' temporaries (Mono::launch)
  std::uint64_t seq_unit_ = 1;
};

constexpr int kMaxSteadySteps = 8;

// Step 0, then steady steps until one leaves the allocator as the step before it left it (no
// segment added and every block where it was): from there every step repeats. A step can still
// grow the reserved memory after an earlier one placed the blocks differently (FSDP2 under
// amp-bf16 grows at its second and third steps: tests/data/torch_train_fsdp_reserved_fakepg_h200.json),
// so the first steady step is not enough; kMaxSteadySteps bounds a layout that never repeats.
// `sizes`: the tensors' bytes in each pass; `timeline`: the memory after each event of the
// last steady step.
ReservedResult replay_steps(Replay& replay, const std::array<ReplayScript, 2>& scripts,
                            const std::array<std::vector<bytes_t>, 2>& sizes, std::vector<MemoryAt>* timeline = nullptr) {
  ReservedResult r;
  replay.run(scripts[0], sizes[0], false, r.step0);
  r.allocated_step0 = replay.phase_allocated();
  std::uint64_t layout = replay.allocator().layout_hash();
  for (int i = 0; i < kMaxSteadySteps; ++i) {
    const bytes_t before = replay.reserved();
    if (timeline) timeline->clear();
    replay.run(scripts[1], sizes[1], true, r.steady, timeline);
    r.allocated_steady = replay.phase_allocated();
    r.steady_steps = i + 1;
    const std::uint64_t now = replay.allocator().layout_hash();
    if (replay.reserved() == before && now == layout) break;
    layout = now;
  }
  r.reserved_peak = replay.reserved();
  r.allocated_peak = replay.allocated_peak();
  r.skipped_events = replay.skipped_events();
  return r;
}

// The replay of steps simulated at the shape (`traces`, as simulate_torch_train records them).
ReservedResult replay_traces(Replay& replay, const std::array<SimTrace, 2>& traces, const Job& job,
                             std::vector<MemoryAt>* timeline = nullptr) {
  return replay_steps(replay, ReplayScript::of(traces, job), recorded_sizes(traces), timeline);
}

}  // namespace

std::string predicted_snapshot_pickle(const ModelSpec& m, const Job& job, const AllocatorPolicy& policy) {
  std::array<SimTrace, 2> traces;
  simulate_torch_train(m, job, false, nullptr, &traces);
  Replay replay(policy, true);
  replay_traces(replay, traces, job);
  return measure::snapshot_pickle(replay.allocator());
}

std::vector<MemoryAt> memory_timeline(const std::array<SimTrace, 2>& traces, const Job& job, const AllocatorPolicy& policy) {
  Replay replay(policy);
  std::vector<MemoryAt> timeline;
  replay_traces(replay, traces, job, &timeline);
  return timeline;
}

namespace {
// The answers this thread gave last, by question (the job's key, its shape included, and the
// allocator's policy). A question asked again is answered as before, replaying and compiling
// nothing: predict() asks a pipeline's chosen stage again for the lists --explain adds, and as the
// regime's second question that compiled its stream, four simulated steps for an answer at hand.
// Up to 64 answers, forgotten all at once when full.
class RecentAnswers {
 public:
  static RecentAnswers& mine() {
    thread_local RecentAnswers answers;
    return answers;
  }
  const ReservedResult* find(const Key& key, const AllocatorPolicy& policy) const {
    for (const Answer& a : answers_)
      if (a.key == key && a.policy == policy) return &a.result;
    return nullptr;
  }
  void remember(const Key& key, const AllocatorPolicy& policy, const ReservedResult& result) {
    if (answers_.size() >= 64) answers_.clear();
    answers_.push_back({key, policy, result});
    answers_.back().result.step_simulated = false;  // (no step is handed back with it)
  }
  void clear() noexcept { answers_.clear(); }

 private:
  struct Answer {
    Key key;
    AllocatorPolicy policy;
    ReservedResult result;
  };
  std::vector<Answer> answers_;
};

ReservedResult answer(const ModelSpec& m, const Job& job, const AllocatorPolicy& policy, TorchStepResult* step) {
  if (const ReservedStream* stream = ReservedStream::cached(m, job)) {
    thread_local std::array<std::vector<bytes_t>, 2> sizes;
    if (stream->sizes(job.batch, job.seq, sizes)) {
      thread_local Replay replay(policy);
      replay.reset(policy);
      return replay_steps(replay, stream->scripts(), sizes);
    }
  }
  return simulate_reserved_full(m, job, policy, true, step);
}
}  // namespace

ReservedResult simulate_reserved(const ModelSpec& m, const Job& job, const AllocatorPolicy& policy, TorchStepResult* step) {
  RecentAnswers& recent = RecentAnswers::mine();
  const Key key = key_of(m, job);
  if (!step)  // (a caller that wants the step simulated is answered afresh)
    if (const ReservedResult* known = recent.find(key, policy)) return *known;
  ReservedResult r = answer(m, job, policy, step);
  recent.remember(key, policy, r);
  return r;
}

ReservedResult simulate_reserved_full(const ModelSpec& m, const Job& job, const AllocatorPolicy& policy,
                                      bool skip_closed_windows, TorchStepResult* step) {
  std::array<SimTrace, 2> traces;
  TorchStepResult simulated = simulate_torch_train(m, job, false, nullptr, &traces);
  Replay replay(policy);
  replay.allow_skipping(skip_closed_windows);
  ReservedResult r = replay_traces(replay, traces, job);
  if (step) {
    *step = std::move(simulated);
    r.step_simulated = true;
  }
  return r;
}

bool reserved_stream_compiles(const ModelSpec& m, const Job& job) { return ReservedStream::compiled(m, job) != nullptr; }

bool reserved_stream_held(const ModelSpec& m, const Job& job) { return ReservedStream::held(m, job); }

void clear_reserved_streams() noexcept {
  ReservedStream::clear_cache();
  RecentAnswers::mine().clear();
}

void clear_reserved_answers() noexcept { RecentAnswers::mine().clear(); }

void allocated_as_replayed(Budget& b, const ReservedResult& r) {
  auto replace = [](std::vector<PhasePeak>& phases, const std::array<bytes_t, 4>& replayed) {
    for (PhasePeak& p : phases) {
      const auto i = static_cast<std::size_t>(std::find(std::begin(kTrainPhases), std::end(kTrainPhases), p.phase) -
                                              std::begin(kTrainPhases));
      if (i >= replayed.size() || replayed[i] == 0) continue;
      if (!p.live.empty()) {  // (predict clears the lists unless it explains)
        // The simulation's own estimate of the allocator's slack (the blocks parameters and
        // optimizer state take whole: its kCachingAllocatorOp entries) gives way to the replay's,
        // which places every block; the tensors stay as the simulation lists them.
        bytes_t tensors = p.bytes;
        std::erase_if(p.live, [&tensors](const TensorBytes& t) {
          const bool slack = t.op == kCachingAllocatorOp;
          if (slack) tensors -= std::min(tensors, t.bytes);
          return slack;
        });
        if (replayed[i] > tensors) {
          TensorBytes slack;
          slack.name = kAllocatorSlack;
          slack.op = "the caching allocator's blocks as replayed: rounding, remainders taken whole";
          slack.bytes = replayed[i] - tensors;
          slack.term = Term::other;
          slack.role = Role::workspace;
          p.live.push_back(std::move(slack));
        }
      }
      p.bytes = replayed[i];
    }
  };
  replace(b.phases, r.allocated_steady);
  replace(b.step0, r.allocated_step0);
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
// (a size in MiB up to 2^43 still fits 64 bits in bytes)
std::uint64_t conf_count(const std::string& key, const std::string& v) {
  try {
    return parse_count(v, key, 0, std::uint64_t{1} << 43);
  } catch (const Error& e) {
    throw conf_error(e.what());
  }
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
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::string item = trim(items[i]);
    // c10's tokenizer takes a trailing comma, but reads the comma after an empty item as a key
    if (item.empty() && i + 1 < items.size())
      throw conf_error("an empty item before a ',' (PyTorch reads that ',' as a key and refuses it at startup: "
                       "Unrecognized key)");
    if (item.empty()) continue;
    const auto colon = item.find(':');
    if (colon == std::string::npos) throw conf_error("'" + item + "' is not key:value");
    const std::string k = trim(std::string_view(item).substr(0, colon));
    const std::string v = trim(std::string_view(item).substr(colon + 1));
    if (k == "expandable_segments") {
      // as c10 spells them (parseExpandableSegments: "Expected a single True/False argument for
      // expandable_segments"; a lowercase true stops PyTorch at startup)
      if (v == "True") out.policy.expandable_segments = true;
      else if (v == "False") out.policy.expandable_segments = false;
      else throw conf_error("expandable_segments: '" + v + "' is not True or False (PyTorch refuses it at startup: Expected a single True/False argument)");
    } else if (k == "max_split_size_mb") {
      const std::uint64_t mb = conf_count(k, v);
      // c10 refuses less than a large segment at startup (AcceleratorAllocatorConfig::
      // parseMaxSplitSize: "max_split_size_mb too small, must be >= 20"); unset, it is larger
      // than any request
      if (mb < 20) throw conf_error("max_split_size_mb: " + v + " is below 20 (PyTorch refuses it at startup: too small, must be >= 20)");
      out.policy.max_split_size = mb * MiB;
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
          // c10 takes "[]" and a trailing comma, but reads an empty item before a ',' as a size
          // (",") and stops at startup (std::stoull, or "expected :" before 2.9)
          if (e.empty() && comma < body.size())
            throw conf_error("roundup_power2_divisions: an empty item before a ',' in '" + v +
                             "' (PyTorch refuses it at startup)");
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
