// src/model/reserved.hpp: memory_reserved() of a training step, by replaying the simulated step's
// allocations and frees through the c10-policy caching allocator (internal).
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "common/allocator_policy.hpp"
#include "inventory.hpp"
#include "membudget/budget.hpp"

namespace membudget::detail {

// The replay recorded as a torch.cuda.memory._dump_snapshot pickle (memory_viz opens it): step 0
// then the steady steps, every block's frame "phase:tensor (op)" from the simulation.
std::string predicted_snapshot_pickle(const ModelSpec& m, const Job& job, const AllocatorPolicy& policy);

struct ReservedResult {
  // memory_reserved() at the end of each phase (reserved only grows within a step) of step 0 and of
  // the last steady step, indexed as kTrainPhases: floor, forward_peak, backward_peak, optimizer_peak.
  std::array<bytes_t, 4> step0{}, steady{};
  bytes_t reserved_peak = 0;   // memory_reserved() after the last steady step
  bytes_t allocated_peak = 0;  // max_memory_allocated() over the steady steps, as replayed
  // max_memory_allocated() within each phase, as replayed, of step 0 and of the last steady step
  std::array<bytes_t, 4> allocated_step0{}, allocated_steady{};
  int steady_steps = 0;        // how many steady steps ran before one repeated the last
  // Events of the steps replayed that were closed windows' (reserved.cpp, skip_closed_window):
  // the allocated figures above count those windows' blocks at their rounded sizes.
  std::size_t skipped_events = 0;
  bool step_simulated = false;  // the step was simulated at the shape (simulate_reserved's `step` set)
};

// Replays step 0, then steady steps until the allocator's layout repeats, of `job` (mode train,
// profile torch) through a CachingAllocator on fake device memory (addresses only) with `policy`.
// A model and recipe asked about before replays its compiled stream (reserved.cpp's
// ReservedStream: the streams simulated once, their sizes evaluated at the shape, compiled at the
// second question) where it has one; the result is simulate_reserved_full's.
// `step`, when given, receives simulate_torch_train's result where the step was simulated at the
// shape for the replay (the regime's first question: ReservedResult::step_simulated), so that the
// caller's estimate costs no second simulation.
ReservedResult simulate_reserved(const ModelSpec& m, const Job& job, const AllocatorPolicy& policy,
                                 TorchStepResult* step = nullptr);
// The same, the step simulated at the shape every time (what the compiled stream is tested against);
// `skip_closed_windows` false replays every event (what the skipping is tested against).
ReservedResult simulate_reserved_full(const ModelSpec& m, const Job& job, const AllocatorPolicy& policy,
                                      bool skip_closed_windows = true, TorchStepResult* step = nullptr);
// Whether (m, job)'s regime has a compiled stream (compiling it now; for tests).
bool reserved_stream_compiles(const ModelSpec& m, const Job& job);
// Whether this thread has compiled (m, job)'s regime (or found it does not compile), compiling
// nothing (for tests).
bool reserved_stream_held(const ModelSpec& m, const Job& job);
// Empties this thread's compiled streams and its recent answers (clear_estimate_cache).
void clear_reserved_streams() noexcept;
// Forgets this thread's recent answers only (simulate_reserved answers a question asked again as
// before; for tests that hold a fresh answer to an earlier one).
void clear_reserved_answers() noexcept;

// The same replay of step 0 and the steady steps as simulate_torch_train recorded them (`traces`),
// giving memory_allocated() and memory_reserved() after each allocation or free of the last steady
// step from its first phase start on: one value per event, as predict --plot samples the stream it
// drew from those traces (the allocated bytes above the tensors' are the allocator's slack).
struct SimTrace;
struct MemoryAt {
  bytes_t allocated = 0, reserved = 0;
};
std::vector<MemoryAt> memory_timeline(const std::array<SimTrace, 2>& traces, const Job& job, const AllocatorPolicy& policy);

// The phases of `b` (steady and step 0) as the replay `r` counted memory_allocated() in them, which
// predict reports wherever the replay runs: its allocator places every block as c10 does, so its
// phases count the blocks taken whole (a remainder of 1 MiB or less is not split off) and the
// rounding of the job's PYTORCH_CUDA_ALLOC_CONF (roundup_power2_divisions), where the simulation
// counts 512-byte blocks and estimates the slack of parameters and optimizer state alone. Each
// phase's tensors (explain) trade the simulation's slack entries for one kAllocatorSlack entry
// with the replay's (none where the replay counts no more than the tensors).
inline constexpr const char* kAllocatorSlack = "allocator slack";
void allocated_as_replayed(Budget& b, const ReservedResult& r);

// PYTORCH_CUDA_ALLOC_CONF ("expandable_segments:True,max_split_size_mb:128") into a policy.
// garbage_collection_threshold is accepted and kept (it only acts near the memory fraction's limit,
// which the replay on unlimited fake memory never reaches). Any other key: Error(invalid_job).
struct AllocatorConf {
  AllocatorPolicy policy;
  double garbage_collection_threshold = 0.0;
};
AllocatorConf parse_allocator_conf(std::string_view conf);

}  // namespace membudget::detail
