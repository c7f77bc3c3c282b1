// membudget/api.hpp: the scheduler-facing API (docs/api.md).
//
// Value types in, value types out:
//   ModelSpec (spec.hpp)  the model: load_model("configs/x.yaml" or a config.json), or fill the fields
//   Job (job.hpp)         what runs: mode, micro-batch, sequence, precision, optimizer, recompute, …
//   Device (job.hpp)      a card: find_device("H100") or {"name", capacity_bytes}
//   Budget (budget.hpp)   the full prediction with breakdowns (predict()); Estimate below is its
//                         allocation-free summary
//
// Errors. Bad input (a spec missing a field, a zero batch, an unknown enum) throws
// membudget::Error with a typed ErrorKind (error.hpp). Expected outcomes are results, never
// exceptions: "does not fit" is FitResult::fits == false, "not even batch 1 fits" is
// MaxBatchResult::max_micro_batch == 0, a sweep point that is invalid (e.g. more than 2^32 tokens)
// is a SweepPoint with ok == false. A sequence beyond the model's max_positions is predicted like
// any other (memory does not depend on whether those positions were trained; RoPE scaling runs
// there), in every function; SweepPoint::beyond_max_positions flags it.
//
// Speed. A training or serving job of the torch profile (the default) is answered from a plan
// compiled once per thread for its (model, recipe): every job field except the micro-batch and the
// sequence length. The first question about a (model, recipe) costs about a millisecond (probe
// simulations); every later one, at any micro-batch and sequence, a few hundred nanoseconds,
// exactly equal to a simulation at that shape (docs/api.md). Harness-profile jobs are simulated
// and memoized per thread: a repeated (model, job) answers from a table of at most 65,536 entries,
// cleared when full. All functions are thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "membudget/budget.hpp"

namespace membudget {

// The numbers of a Budget without its lists and strings: no heap allocation.
struct Estimate {
  struct Phase {
    const char* name = "";  // static storage: "floor", "forward_peak", "backward_peak", …
    bytes_t bytes = 0;
  };
  bytes_t peak = 0;         // max over the phases and step 0 (bytes the allocator counts)
  bytes_t overhead = 0;     // memory outside the allocator (CUDA context, handles)
  bytes_t required = 0;     // peak + overhead: what the card must hold
  const char* peak_phase = "";  // static storage: "backward_peak", "step0.optimizer_peak", …
  Terms terms;
  ModelStates states;
  std::array<Phase, 4> phases{};  // steady state (training) or serving phases
  std::uint8_t n_phases = 0;
  std::array<Phase, 4> step0{};   // training only: the first step
  std::uint8_t n_step0 = 0;
};

// predict(model, job) reduced to an Estimate (the same numbers, to the byte). Throws Error for bad
// input.
Estimate estimate(const ModelSpec& model, const Job& job);
Estimate summarize(const Budget& budget);
// Empties this thread's plans, reserved-memory streams and memo table (benchmarks of the first
// question; memory control).
void clear_estimate_cache() noexcept;

// The largest number of bytes the card may hold: capacity · (1 − headroom). Throws
// Error(invalid_argument) for a headroom outside [0, 1) or a zero capacity.
bytes_t usable_bytes(const Device& device, double headroom = 0.05);

struct FitResult {
  bool fits = false;      // required ≤ limit
  bytes_t required = 0;   // peak + overhead; reserved_peak + overhead (what nvidia-smi shows) where on_reserved
  bool on_reserved = false;
  bytes_t limit = 0;      // capacity · (1 − headroom)
  bytes_t capacity = 0;
  Estimate estimate;
};
// With `reserved`, the fit is decided on the reserved memory (PredictOptions::reserved: the step
// replayed through the caching allocator, a few milliseconds; `allocator_conf` its
// PYTORCH_CUDA_ALLOC_CONF) where the job has that model, as `membudget predict --device` decides.
FitResult fits(const ModelSpec& model, const Job& job, const Device& device, double headroom = 0.05,
               bool reserved = false, const std::string& allocator_conf = "");

struct SearchOptions {
  double headroom = 0.05;
  std::uint64_t limit = 0;  // largest value tried (0: 65,536 micro-batches; max_positions tokens;
                            // a larger limit searches beyond max_positions)
  // max_sequence_length: only multiples of this (e.g. 128). max_micro_batch: ignored.
  std::uint64_t multiple_of = 1;
  // max_micro_batch: the global batch to reach with gradient accumulation over data_parallel
  // ranks (0: none). A job with data-parallel ranks of its own (Parallelism::data_ranks: --dp ×
  // --fsdp) is divided over those; data_parallel other than 1 must then be the same number.
  std::uint64_t global_batch = 0;
  std::uint64_t data_parallel = 1;
  // max_micro_batch: decide on the reserved memory (reserved_peak + overhead, PredictOptions::reserved;
  // a few milliseconds per batch tried) instead of the allocated peak + overhead. The search runs on
  // the allocated figures first (reserved ≥ allocated) and then only below that answer.
  bool reserved = false;
  std::string allocator_conf;  // PYTORCH_CUDA_ALLOC_CONF for the reserved replay (PredictOptions)
};

struct MaxBatchResult {
  std::uint64_t max_micro_batch = 0;  // 0: not even a micro-batch of 1 fits
  // max_micro_batch is the search's limit (SearchOptions::limit, 65,536 unless given, and at most
  // 2^32 tokens a micro-batch): every batch tried fits, and a larger one may too
  bool at_limit = false;
  Estimate at_max;                    // the estimate at max_micro_batch (at 1 when it is 0)
  bytes_t limit = 0;                  // capacity · (1 − headroom)
  // With global_batch: the largest micro-batch ≤ max_micro_batch dividing global_batch / data_parallel
  // that fits with the accumulation steps it needs (global_batch = micro_batch · steps ·
  // data_parallel; predicted with Job::grad_accum_steps = steps, the first micro-batch's gradients
  // kept through the rest); 0 (both) where none fits with its steps. A job given with
  // grad_accum_steps > 1 and a global batch is refused.
  std::uint64_t accum_micro_batch = 0;
  std::uint64_t grad_accum_steps = 0;
  std::uint64_t data_parallel = 1;    // the data-parallel ranks the global batch was divided over
  std::uint32_t evaluations = 0;      // estimates the search made
  // With SearchOptions::reserved: reserved_peak + overhead at max_micro_batch (0 where the job has
  // no reserved model: serving, the harness, FSDP2), and how many reserved predictions it took.
  bytes_t reserved_required = 0;
  std::uint32_t reserved_evaluations = 0;
};
// Largest micro-batch whose step fits (the peak grows monotonically with the batch; galloping then
// binary search). job.batch is ignored.
MaxBatchResult max_micro_batch(const ModelSpec& model, Job job, const Device& device,
                               const SearchOptions& options = {});

struct MaxSeqResult {
  std::uint64_t max_seq = 0;  // 0: not even the shortest sequence fits
  Estimate at_max;
  bytes_t limit = 0;
  std::uint32_t evaluations = 0;
};
// Longest sequence (≤ options.limit, by default the model's max_positions) whose step fits at
// job.batch.
MaxSeqResult max_sequence_length(const ModelSpec& model, Job job, const Device& device,
                                 const SearchOptions& options = {});

struct SweepGrid {
  std::vector<std::uint64_t> batches;    // empty: {job.batch}
  std::vector<std::uint64_t> seqs;       // empty: {job.seq}
  std::vector<Precision> precisions;     // empty: {job.precision}
  std::vector<Recompute> recomputes;     // empty: {job.recompute}
  // Parallel layouts (docs/distributed.md): every combination of these degrees; empty: the job's.
  std::vector<std::uint64_t> dps, fsdps, tps, pps;
};
struct SweepPoint {
  std::uint64_t batch = 0, seq = 0;
  Precision precision = Precision::amp_bf16;
  Recompute recompute = Recompute::none;
  std::uint64_t dp = 1, fsdp = 1, tp = 1, pp = 1;  // the layout (Job::parallel's degrees)
  bool ok = false;         // false: the point is invalid (see error)
  bool fits = false;       // with a device: required ≤ limit (on reserved memory where on_reserved)
  // With a device and sweep(..., reserved = true): fits was decided on reserved_peak + overhead
  // (what nvidia-smi shows), as max_micro_batch does; false where the job has no reserved model.
  bool on_reserved = false;
  // reserved_peak + overhead, at the points whose reserved memory was replayed (0 elsewhere: a point
  // is decided by the replayed points around it, reserved memory growing with the batch).
  bytes_t reserved_required = 0;
  bool beyond_max_positions = false;  // seq > the model's max_positions (predicted all the same)
  Estimate estimate;
  ErrorKind error_kind = ErrorKind::invalid_job;
  std::string error;       // only when !ok
};
// Every combination of the grid (layout, precision, recompute, seq, batch order, batch fastest); a
// layout membudget does not model, or that does not divide the model, is an invalid point.
// Throws only for a bad model spec or headroom; invalid points are reported in the result.
// With a device, fits is decided on the allocated peak + overhead; with `reserved` as well, on the
// reserved memory + overhead wherever the job has a reserved model: for each run of batches (the
// same layout, precision, recompute and sequence) only the batches that fit on allocated bytes can
// fit (reserved ≥ allocated), and each of them is replayed (a few milliseconds each): reserved
// memory need not grow with the batch, so no point is decided by its neighbours.
std::vector<SweepPoint> sweep(const ModelSpec& model, const Job& base, const SweepGrid& grid,
                              const std::optional<Device>& device = std::nullopt, double headroom = 0.05,
                              bool reserved = false, const std::string& allocator_conf = "");

// Sets one job option by its command-line name ("batch", "seq", "precision", "recompute",
// "loss-chunk" or "loss_chunk", …; docs/api.md lists them) from text. Throws Error(invalid_job) for
// a bad value and Error(invalid_argument) for an unknown key. The C ABI and the Python module use it.
void set_job_option(Job& job, std::string_view key, std::string_view value);

// The job's settings that the model must have a part for: --experts, --routing and
// --router-aux-loss need a mixture of experts; otherwise Error(invalid_job) naming the flag. Every
// question checks it; the CLI also checks it with check_options_apply, so that a setting read from
// a spec's job: section is named there (JobSources).
void check_options_apply_to(const ModelSpec& model, const Job& job);

// The estimate as JSON (integer bytes), the same keys as docs/api.md lists.
std::string to_json(const Estimate& e, int indent = -1);

}  // namespace membudget
