// The scheduler-facing API: memoized estimates, fit, searches and sweeps (include/membudget/api.hpp).
#include "membudget/api.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <span>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "job_key.hpp"
#include "korthikanti.hpp"
#include "parallel.hpp"
#include "pipeline.hpp"
#include "predictors.hpp"
#include "reserved.hpp"
#include "membudget/input.hpp"
#include "membudget/serving.hpp"
#include "serve_plan.hpp"
#include "step_plan.hpp"

namespace membudget {
namespace {

// A phase label ("backward_peak", "step0.backward_peak") with static storage (Estimate never owns
// a string).
const char* intern_phase(std::string_view label) {
  const bool step0 = label.rfind(kStep0Prefix, 0) == 0;
  if (step0) label.remove_prefix(kStep0Prefix.size());
  Phase p{};
  return parse_phase(label, &p) ? phase_label(p, step0) : "other";
}

using detail::Key;
using detail::KeyHash;
using detail::key_of;

constexpr std::size_t kCacheLimit = 65536;

// (Job::validate refuses every parallel setting but one rank before a plan is compiled.)
// (A pipeline's Korthikanti figure counts the microbatches in flight, which from_plan does not.)
bool plan_applies(const Job& j) {
  return j.mode == Mode::train && j.profile == Profile::torch && detail::StepPlan::covers(j) &&
         !(j.parallel.pipeline > 1 && j.activations == ActivationModel::korthikanti);
}
bool serve_plan_applies(const Job& j) { return j.mode == Mode::infer && j.profile == Profile::torch; }

// The Estimate that summarize(predict(m, j)) gives for a serving job, from its plan.
Estimate from_serve_plan(const detail::ServePlan& plan, const ModelSpec& m, const Job& j) {
  const auto p = plan.evaluate(j.batch, j.seq);
  Estimate e;
  e.states.weights = plan.weights;
  e.terms.model_states = plan.weights;
  e.terms.kv_cache = kv_cache_bytes(m, j.kv_dtype, j.batch, j.seq);
  e.terms.logits_loss = checked_product("serving logits", j.batch, m.vocab_size, 2);
  e.terms.activations = detail::serving_activations(p[1], p[0], e.terms.kv_cache);
  e.terms.overhead = j.overhead.value_or(default_overhead(j.profile));
  e.overhead = e.terms.overhead;
  e.n_phases = detail::ServePlan::kPhases;
  for (std::size_t k = 0; k < detail::ServePlan::kPhases; ++k) {
    e.phases[k] = {to_string(kServePhases[k]), p[k]};
    if (p[k] > e.peak) {
      e.peak = p[k];
      e.peak_phase = to_string(kServePhases[k]);
    }
  }
  e.required = checked_add(e.peak, e.overhead, "peak + overhead");
  return e;
}

// The Estimate that summarize(predict(m, j)) gives, from a plan; `r` is the plan evaluated at the
// job's shape.
Estimate from_plan(const detail::StepPlan& plan, const detail::StepPlan::Result& r, const ModelSpec& m, const Job& j) {
  Estimate e;
  e.states.weights = plan.weights;
  e.states.gradients = plan.gradients;
  e.states.master = plan.master;
  e.states.optimizer = plan.optimizer_state;
  e.terms.model_states = e.states.total();
  e.terms.activations = j.activations == ActivationModel::inventory ? r.activations : detail::korthikanti_total(m, j);
  e.terms.logits_loss = detail::logits_breakdown(m, j).total();
  e.terms.overhead = j.overhead.value_or(default_overhead(j.profile));
  e.overhead = e.terms.overhead;
  e.n_phases = e.n_step0 = detail::StepPlan::kPhases;
  for (std::size_t p = 0; p < detail::StepPlan::kPhases; ++p) {
    e.phases[p] = {to_string(kTrainPhases[p]), r.steady[p]};
    if (r.steady[p] > e.peak) {
      e.peak = r.steady[p];
      e.peak_phase = to_string(kTrainPhases[p]);
    }
  }
  for (std::size_t p = 0; p < detail::StepPlan::kPhases; ++p) {
    e.step0[p] = {to_string(kTrainPhases[p]), r.step0[p]};
    if (r.step0[p] > e.peak) {
      e.peak = r.step0[p];
      e.peak_phase = phase_label(kTrainPhases[p], true);
    }
  }
  e.required = checked_add(e.peak, e.overhead, "peak + overhead");
  return e;
}
Estimate from_plan(const detail::StepPlan& plan, const ModelSpec& m, const Job& j) {
  return from_plan(plan, plan.evaluate(j.batch, j.seq), m, j);
}

std::unordered_map<Key, Estimate, KeyHash>& cache() {
  thread_local std::unordered_map<Key, Estimate, KeyHash> table = [] {
    std::unordered_map<Key, Estimate, KeyHash> t;
    t.reserve(1024);
    return t;
  }();
  return table;
}

// Sizes the searches treat as "does not fit" rather than errors: a job beyond 2^32 tokens, or a
// byte count beyond 64 bits.
std::optional<Estimate> try_estimate(const ModelSpec& model, const Job& job) {
  if (job.batch == 0 || job.seq == 0 || job.batch > (1ull << 32) / job.seq) return std::nullopt;
  try {
    return estimate(model, job);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::overflow) return std::nullopt;
    throw;
  }
}

}  // namespace

Estimate summarize(const Budget& b) {
  Estimate e;
  e.peak = b.peak;
  e.overhead = b.terms.overhead;
  e.required = checked_add(b.peak, b.terms.overhead, "peak + overhead");
  e.peak_phase = intern_phase(b.peak_phase);
  e.terms = b.terms;
  e.states = b.states;
  for (const auto& p : b.phases)
    if (e.n_phases < e.phases.size()) e.phases[e.n_phases++] = {p.name(), p.bytes};
  for (const auto& p : b.step0)
    if (e.n_step0 < e.step0.size()) e.step0[e.n_step0++] = {p.name(), p.bytes};
  return e;
}

// A pipeline without a stage asked for: the most loaded stage from the stages' plans, the lowest on
// a tie, as predict() chooses it; nullopt where a stage does not compile.
std::optional<Estimate> most_loaded_stage(const ModelSpec& model, const Job& job) {
  const auto* stages = detail::StepPlan::stage_plans(model, job);
  if (!stages) return std::nullopt;
  // Only the peak decides (from_plan's peak: every phase of both steps). The stage with the highest
  // bound is evaluated first; a stage whose bound is below the best peak found cannot hold it and
  // is not evaluated, so most searches evaluate one or two stages.
  constexpr std::size_t kMaxStages = 64;
  const std::size_t n = stages->size();
  std::array<bytes_t, kMaxStages> bound{};
  std::size_t first = 0;
  if (n <= kMaxStages)
    for (std::size_t s = 0; s < n; ++s) {
      bound[s] = (*stages)[s]->peak_bound(job.batch, job.seq);
      if (bound[s] > bound[first]) first = s;
    }
  std::uint64_t best_stage = 0;
  bytes_t best_peak = 0;
  detail::StepPlan::Result best;
  bool found = false;
  auto consider = [&](std::size_t s) {
    const auto r = (*stages)[s]->evaluate(job.batch, job.seq);
    bytes_t peak = 0;
    for (std::size_t p = 0; p < detail::StepPlan::kPhases; ++p) peak = std::max({peak, r.steady[p], r.step0[p]});
    // the lowest stage on a tie, whatever the order of evaluation
    if (!found || peak > best_peak || (peak == best_peak && s < best_stage)) best = r, best_stage = s, best_peak = peak;
    found = true;
  };
  consider(first);
  for (std::size_t s = 0; s < n; ++s)
    if (s != first && (n > kMaxStages || bound[s] >= best_peak)) consider(s);
  Job at = job;
  at.parallel.rank = best_stage * detail::ranks_per_stage(job.parallel);  // the stage's first shard: the fullest
  return from_plan(*(*stages)[best_stage], best, model, at);
}

Estimate estimate(const ModelSpec& model, const Job& job) {
  detail::check_simulated(model, job);  // before a plan would simulate it
  if (job.parallel.pipeline > 1 && !job.parallel.rank) {
    Job at = job;
    at.parallel.rank = 0;
    if (plan_applies(at)) {
      job.validate();
      detail::check_layout(model, job);
      if (auto e = most_loaded_stage(model, job)) return *e;
    }
  } else if (plan_applies(job)) {
    job.validate();
    detail::check_layout(model, job);  // what predict() checks beyond the job alone
    if (const detail::StepPlan* plan = detail::StepPlan::cached(model, job)) return from_plan(*plan, model, job);
  } else if (serve_plan_applies(job)) {
    job.validate();
    if (const detail::ServePlan* plan = detail::ServePlan::cached(model, job)) return from_serve_plan(*plan, model, job);
  }
  auto& table = cache();
  const Key k = key_of(model, job);
  if (auto it = table.find(k); it != table.end()) return it->second;
  const Estimate e = summarize(predict(model, job));
  if (table.size() >= kCacheLimit) table.clear();
  table.emplace(k, e);
  return e;
}

void clear_estimate_cache() noexcept {
  cache().clear();
  detail::StepPlan::clear_cache();
  detail::ServePlan::clear_cache();
  detail::clear_reserved_streams();
}

bytes_t usable_bytes(const Device& device, double headroom) {
  if (!(headroom >= 0.0 && headroom < 1.0))
    throw Error(ErrorKind::invalid_argument, "headroom: must be in [0, 1), e.g. 0.05 for 5%");
  if (device.capacity == 0) throw Error(ErrorKind::invalid_argument, "device capacity must be positive");
  // The largest integer r ≤ capacity with double(r) ≤ capacity · (1 − headroom), as check_fit
  // compares in doubles. lim may be 2^64 itself (a capacity within 1 KiB of 2^64, headroom 0):
  // every r ≤ capacity passes then, and converting lim would be undefined.
  const double lim = static_cast<double>(device.capacity) * (1.0 - headroom);
  if (lim >= 18446744073709551616.0) return device.capacity;
  bytes_t r = std::min<bytes_t>(static_cast<bytes_t>(lim), device.capacity);
  while (r > 0 && static_cast<double>(r) > lim) --r;
  // Integers above r that still round to a double ≤ lim: at most half an ulp of lim (1024 near
  // 2^64), so the walk is bounded; one step when lim < 2^53.
  while (r < device.capacity && static_cast<double>(r + 1) <= lim) ++r;
  return r;
}

// The largest n in [1, n_max] with ok(n), given that ok(1) holds and ok is monotone (memory grows
// with the batch and the sequence): doubling until a miss, then bisection. `best` receives the
// estimate at the answer.
template <class Ok>
std::uint64_t largest_fitting(std::uint64_t n_max, Ok&& ok, Estimate& best) {
  std::uint64_t lo = 1, hi = 0;  // lo fits; hi (when set) does not
  for (std::uint64_t n = 2;; n *= 2) {
    if (n > n_max) {
      n = n_max;
      if (n <= lo) break;
    }
    Estimate e;
    if (ok(n, &e)) {
      lo = n;
      best = e;
      if (n == n_max) break;
    } else {
      hi = n;
      break;
    }
  }
  while (hi && hi - lo > 1) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    Estimate e;
    if (ok(mid, &e)) {
      lo = mid;
      best = e;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// The searches: the largest n in [1, n_max] whose job fits `limit`, set(job, n) placing the point.
// 0 when n = 1 does not fit or its sizes overflow; a bad spec or job at n = 1 throws. `at` gets the
// estimate at the answer (at n = 1 when the answer is 0); `evaluations` counts the estimates made.
template <class Set>
std::uint64_t largest_that_fits(const ModelSpec& model, Job& job, std::uint64_t n_max, bytes_t limit, Set&& set,
                                Estimate& at, std::uint32_t& evaluations) {
  auto ok = [&](std::uint64_t n, Estimate* out) {
    set(job, n);
    ++evaluations;
    auto e = try_estimate(model, job);
    if (!e) return false;
    if (out) *out = *e;
    return e->required <= limit;
  };
  Estimate best;
  set(job, 1);
  try {
    best = estimate(model, job);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::overflow) throw;
    return 0;
  }
  ++evaluations;
  at = best;
  if (best.required > limit) return 0;
  const std::uint64_t lo = largest_fitting(n_max, ok, best);
  at = best;
  return lo;
}

namespace {
// reserved_peak + overhead of `job`, or 0 where the job has no reserved model (serving, FSDP2).
bytes_t reserved_required(const ModelSpec& model, const Job& job, const std::string& allocator_conf) {
  PredictOptions po;
  po.reserved = true;
  po.allocator_conf = allocator_conf;
  const Budget b = predict(model, job, po);
  return b.nvidia_smi();
}
}  // namespace

FitResult fits(const ModelSpec& model, const Job& job, const Device& device, double headroom, bool reserved,
               const std::string& allocator_conf) {
  FitResult f;
  f.capacity = device.capacity;
  f.limit = usable_bytes(device, headroom);
  f.estimate = estimate(model, job);
  f.required = f.estimate.required;
  if (reserved)
    if (const bytes_t r = reserved_required(model, job, allocator_conf)) {
      f.required = r;
      f.on_reserved = true;
    }
  f.fits = f.required <= f.limit;
  return f;
}

MaxBatchResult max_micro_batch(const ModelSpec& model, Job job, const Device& device, const SearchOptions& o) {
  MaxBatchResult r;
  r.limit = usable_bytes(device, o.headroom);
  if (o.data_parallel == 0) throw Error(ErrorKind::invalid_argument, "data_parallel: must be at least 1");
  // The job's own data-parallel ranks share the global batch; a different count given beside them
  // would size the accumulation for another job.
  const std::uint64_t job_data_ranks = job.parallel.data_ranks();
  if (job_data_ranks > 1 && o.data_parallel != 1 && o.data_parallel != job_data_ranks)
    throw Error(ErrorKind::invalid_argument, "--data-parallel " + std::to_string(o.data_parallel) + ": the job's layout has " +
                                                 std::to_string(job_data_ranks) + " data-parallel ranks (--dp × --fsdp)");
  r.data_parallel = job_data_ranks > 1 ? job_data_ranks : o.data_parallel;
  if (o.global_batch && o.global_batch % r.data_parallel)
    throw Error(ErrorKind::invalid_argument, "--global-batch: " + std::to_string(o.global_batch) +
                                                 " is not a multiple of the data-parallel size " +
                                                 std::to_string(r.data_parallel));
  if (o.global_batch && job.grad_accum_steps > 1)
    throw Error(ErrorKind::invalid_argument, "--grad-accum-steps " + std::to_string(job.grad_accum_steps) +
                                                 " with --global-batch: the accumulation steps follow from the global batch "
                                                 "(give one or the other)");
  std::uint64_t hi_limit = o.limit ? o.limit : 65536;
  if (job.seq) hi_limit = std::min<std::uint64_t>(hi_limit, std::max<std::uint64_t>(1, (1ull << 32) / job.seq));
  std::uint64_t lo = largest_that_fits(
      model, job, hi_limit, r.limit, [](Job& j, std::uint64_t b) { j.batch = b; }, r.at_max, r.evaluations);
  auto required = [&](std::uint64_t b) {  // on reserved memory
    Job j = job;
    j.batch = b;
    ++r.reserved_evaluations;
    if (const bytes_t need = reserved_required(model, j, o.allocator_conf)) return need;
    return estimate(model, j).required;  // no reserved model: the allocated figure
  };
  if (o.reserved && lo) {
    // reserved ≥ allocated: only batches up to the allocated answer can fit
    bytes_t at = required(lo);
    if (at > r.limit) {
      // bisection below the allocated answer (the bound is known and the answer usually near it,
      // so not largest_fitting's doubling from 1): `good` fits (0: nothing yet), `bad` does not
      std::uint64_t good = 0, bad = lo;
      bytes_t at_good = 0, at_bad = at;
      while (bad - good > 1) {
        const std::uint64_t mid = good + (bad - good) / 2;
        const bytes_t need = required(mid);
        if (need <= r.limit) {
          good = mid;
          at_good = need;
        } else {
          bad = mid;
          at_bad = need;
        }
      }
      lo = good;
      at = good ? at_good : at_bad;  // nothing fits: `bad` is 1, the figure at batch 1
      Job j = job;
      j.batch = std::max<std::uint64_t>(1, lo);
      r.at_max = estimate(model, j);
      ++r.evaluations;
    }
    r.reserved_required = at;
  }
  r.max_micro_batch = lo;
  r.at_limit = lo == hi_limit;
  if (lo && o.global_batch) {
    // The largest divisor of the rank's share that fits with the accumulation steps it needs. From
    // the second micro-batch on the first's gradients stay allocated (Job::grad_accum_steps), so a
    // divisor below the share is predicted with its steps, not taken from the search above; and
    // reserved memory need not grow with the batch (its segments round: Qwen2.5 0.5B at 2,048
    // tokens reserves less at batch 9 than at 8), so on reserved memory each divisor below the
    // answer is predicted too.
    const std::uint64_t per_rank = o.global_batch / r.data_parallel;
    auto fits_with_steps = [&](std::uint64_t mb) {
      Job j = job;
      j.batch = mb;
      j.grad_accum_steps = per_rank / mb;
      try {
        if (!o.reserved) {
          ++r.evaluations;
          return estimate(model, j).required <= r.limit;
        }
        ++r.reserved_evaluations;
        const bytes_t need = reserved_required(model, j, o.allocator_conf);
        return (need ? need : estimate(model, j).required) <= r.limit;
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::unsupported) throw;
        // the layout's accumulation is not modelled: say which plan needed it
        throw Error(ErrorKind::unsupported, "--global-batch " + std::to_string(o.global_batch) + ": micro-batch " +
                                                std::to_string(mb) + " needs " + std::to_string(j.grad_accum_steps) +
                                                " accumulation steps per rank; " + e.what());
      }
    };
    for (std::uint64_t mb = std::min(lo, per_rank); mb >= 1; --mb) {
      if (per_rank % mb) continue;
      // the share without accumulation is known to fit on allocated memory (it is at most the
      // answer), and on reserved memory where it is the answer
      const bool known = mb == per_rank && (!o.reserved || mb == lo);
      if (!known && !fits_with_steps(mb)) continue;
      r.accum_micro_batch = mb;
      r.grad_accum_steps = per_rank / mb;
      break;
    }
  }
  return r;
}

MaxSeqResult max_sequence_length(const ModelSpec& model, Job job, const Device& device, const SearchOptions& o) {
  MaxSeqResult r;
  r.limit = usable_bytes(device, o.headroom);
  const std::uint64_t step = std::max<std::uint64_t>(1, o.multiple_of);
  std::uint64_t max_seq = o.limit ? o.limit : model.max_positions;
  if (job.batch) max_seq = std::min<std::uint64_t>(max_seq, (1ull << 32) / job.batch);
  const std::uint64_t kmax = max_seq / step;
  if (kmax == 0) return r;
  r.max_seq = step * largest_that_fits(
                         model, job, kmax, r.limit, [step](Job& j, std::uint64_t k) { j.seq = k * step; }, r.at_max,
                         r.evaluations);
  return r;
}

namespace {

// sweep(..., reserved): one run of points that differ only in the batch, decided on reserved memory.
void decide_on_reserved(const ModelSpec& model, Job job, bytes_t limit, const std::string& allocator_conf,
                        std::span<SweepPoint> run) {
  std::vector<SweepPoint*> fitting;  // fit on allocated bytes (reserved ≥ allocated: the others cannot)
  for (SweepPoint& p : run)
    if (p.ok && p.fits) fitting.push_back(&p);
  // Each point is predicted: reserved memory need not grow with the batch (its segments round:
  // Qwen2.5 0.5B at 2,048 tokens reserves less at batch 9 than at 8), so a point below one that
  // fits is not known to fit until replayed. (Each is a few milliseconds: the compiled stream.)
  for (SweepPoint* p : fitting) {
    job.batch = p->batch;
    if (!p->reserved_required) p->reserved_required = reserved_required(model, job, allocator_conf);
    if (p->reserved_required == 0) {  // no reserved model for this job: the allocated decision stands
      for (SweepPoint* q : fitting) q->reserved_required = 0;
      return;
    }
  }
  for (SweepPoint& p : run) p.on_reserved = p.ok;
  for (SweepPoint* p : fitting) p->fits = p->reserved_required <= limit;
}
}  // namespace

std::vector<SweepPoint> sweep(const ModelSpec& model, const Job& base, const SweepGrid& grid,
                              const std::optional<Device>& device, double headroom, bool reserved,
                              const std::string& allocator_conf) {
  model.validate();
  const bytes_t limit = device ? usable_bytes(*device, headroom) : 0;
  const std::vector<std::uint64_t> batches = grid.batches.empty() ? std::vector<std::uint64_t>{base.batch} : grid.batches;
  const std::vector<std::uint64_t> seqs = grid.seqs.empty() ? std::vector<std::uint64_t>{base.seq} : grid.seqs;
  const std::vector<Precision> precisions =
      grid.precisions.empty() ? std::vector<Precision>{base.precision} : grid.precisions;
  const std::vector<Recompute> recomputes =
      grid.recomputes.empty() ? std::vector<Recompute>{base.recompute} : grid.recomputes;
  auto degrees = [](const std::vector<std::uint64_t>& v, std::uint64_t job) {
    return v.empty() ? std::vector<std::uint64_t>{job} : v;
  };
  const auto dps = degrees(grid.dps, base.parallel.data), fsdps = degrees(grid.fsdps, base.parallel.fsdp),
             tps = degrees(grid.tps, base.parallel.tensor), pps = degrees(grid.pps, base.parallel.pipeline);
  // The whole grid is bounded before any point is computed (and the product cannot wrap).
  std::uint64_t points = 1;
  for (std::size_t n : {batches.size(), seqs.size(), precisions.size(), recomputes.size(), dps.size(), fsdps.size(),
                        tps.size(), pps.size()})
    if (__builtin_mul_overflow(points, static_cast<std::uint64_t>(n), &points) || points > limits::kMaxSweepPoints)
      throw Error(ErrorKind::invalid_argument,
                  "sweep: the grid has " + std::to_string(batches.size()) + " batches × " + std::to_string(seqs.size()) +
                      " sequences × " + std::to_string(precisions.size()) + " precisions × " +
                      std::to_string(recomputes.size()) + " recompute modes × " +
                      std::to_string(dps.size() * fsdps.size() * tps.size() * pps.size()) +
                      " layouts, more than the limit of " + std::to_string(limits::kMaxSweepPoints) +
                      " points; split it into smaller sweeps");
  if (base.experts == ExpertsImpl::eager && model.moe.enabled()) {
    unsigned __int128 iterations = 0;  // each point walks the loop at its own layout
    for (std::uint64_t pp : pps) {
      Job j = base;
      j.parallel.pipeline = pp;
      iterations += detail::eager_expert_iterations(model, j) * (points / pps.size());
    }
    if (iterations > limits::kMaxSweepEagerIterations)
      throw Error(ErrorKind::unsupported,
                  "sweep --experts eager: " + std::to_string(points) + " points of " + model.display_name() + "'s " +
                      std::to_string(model.moe.local_experts()) + " experts × " + std::to_string(model.moe_layers()) +
                      " MoE layers (each micro-batch a point walks) is more than the " +
                      std::to_string(limits::kMaxSweepEagerIterations) +
                      " expert iterations a sweep walks (each point walks the eager loop at its own shape); sweep "
                      "fewer points, or grouped_mm or batched_mm, which are modelled at any number");
  }
  {  // a pipeline point is simulated at its own shape, layer pass by layer pass
    unsigned __int128 passes = 0;
    for (std::uint64_t pp : pps) {
      Parallelism p = base.parallel;
      p.pipeline = pp;
      passes += static_cast<unsigned __int128>(detail::pipeline_layer_passes(model, p)) * (points / pps.size());
    }
    if (passes > limits::kMaxSweepPipelineLayerPasses)
      throw Error(ErrorKind::unsupported,
                  "sweep: its " + std::to_string(points) + " points simulate more than the " +
                      std::to_string(limits::kMaxSweepPipelineLayerPasses) +
                      " pipeline layer passes a sweep walks (a stage rank's decoder layers × its microbatches, at "
                      "each point); sweep fewer points or microbatches");
  }
  std::vector<SweepPoint> out;
  out.reserve(points);
  Job j = base;
  for (std::uint64_t dp : dps)
  for (std::uint64_t fs : fsdps)
  for (std::uint64_t tp : tps)
  for (std::uint64_t pp : pps)
  for (Precision p : precisions)
    for (Recompute rc : recomputes)
      for (std::uint64_t s : seqs)
        for (std::uint64_t b : batches) {
          SweepPoint pt;
          pt.batch = b;
          pt.seq = s;
          pt.precision = p;
          pt.recompute = rc;
          pt.dp = dp;
          pt.fsdp = fs;
          pt.tp = tp;
          pt.pp = pp;
          j.batch = b;
          j.seq = s;
          j.precision = p;
          j.recompute = rc;
          j.parallel.data = dp;
          j.parallel.fsdp = fs;
          j.parallel.tensor = tp;
          j.parallel.pipeline = pp;
          pt.beyond_max_positions = s > model.max_positions;
          try {
            pt.estimate = estimate(model, j);
            pt.ok = true;
            pt.fits = device ? pt.estimate.required <= limit : false;
          } catch (const Error& e) {
            pt.ok = false;
            pt.error_kind = e.kind();
            pt.error = e.what();
          }
          out.push_back(std::move(pt));
        }
  if (device && reserved) {
    // each run of batches (the innermost loop) shares everything else with its job
    for (std::size_t at = 0; at < out.size(); at += batches.size()) {
      const SweepPoint& first = out[at];
      j.seq = first.seq;
      j.precision = first.precision;
      j.recompute = first.recompute;
      j.parallel.data = first.dp;
      j.parallel.fsdp = first.fsdp;
      j.parallel.tensor = first.tp;
      j.parallel.pipeline = first.pp;
      decide_on_reserved(model, j, limit, allocator_conf, std::span<SweepPoint>(out).subspan(at, batches.size()));
    }
  }
  return out;
}

void set_job_option(Job& j, std::string_view key, std::string_view value) {
  const std::string k = dashed(key);
  const std::string v(value);
  auto count = [&](const char* opt) { return parse_count(v, opt); };
  if (k == "batch") j.batch = count("--batch");
  else if (k == "seq") j.seq = count("--seq");
  else if (k == "mode") j.mode = parse_mode(v);
  else if (k == "precision") j.precision = parse_precision(v);
  else if (k == "optimizer") j.optimizer = parse_optimizer(v);
  else if (k == "optimizer-impl") j.optimizer_impl = parse_optimizer_impl(v);
  else if (k == "recompute") j.recompute = parse_recompute(v);
  else if (k == "attention") j.attention = parse_attention(v);
  else if (k == "loss") j.loss = parse_loss(v);
  else if (k == "loss-chunk") j.loss_chunk = count("--loss-chunk");
  else if (k == "activations") j.activations = parse_activation_model(v);
  else if (k == "profile") j.profile = parse_profile(v);
  else if (k == "overhead") j.overhead = parse_bytes(v, "--overhead");
  else if (k == "kv-dtype") j.kv_dtype = parse_kv_dtype(v);
  else if (k == "weights") j.weights = parse_dtype(v, "--weights");
  else if (k == "group-size") j.group_size = count("--group-size");
  else if (k == "lora") j.lora_rank = v == "0" ? 0 : count("--lora");
  else if (k == "grad-accum-steps") j.grad_accum_steps = count("--grad-accum-steps");
  else if (set_parallel_option(j, k, v, k) || set_moe_option(j, k, v, "--" + k)) {
  } else
    throw Error(ErrorKind::invalid_argument,
                "unknown job option '" + std::string(key) +
                    "' (batch, seq, mode, precision, optimizer, optimizer-impl, recompute, attention, loss, loss-chunk, activations, "
                    "profile, overhead, kv-dtype, weights, group-size, lora, grad-accum-steps, dp, fsdp, zero, reshard-after-forward, "
                    "ddp-bucket-view, rank, tp, pp, sp, experts, routing, router-aux-loss)");
}

std::string to_json(const Estimate& e, int indent) {
  nlohmann::ordered_json o;
  o["peak"] = e.peak;
  o["peak_phase"] = e.peak_phase;
  o["overhead"] = e.overhead;
  o["required"] = e.required;
  o["terms"] = {{"model_states", e.terms.model_states}, {"activations", e.terms.activations},
                {"logits_loss", e.terms.logits_loss},   {"kv_cache", e.terms.kv_cache},
                {"overhead", e.terms.overhead}};
  o["model_states"] = {{"weights", e.states.weights}, {"gradients", e.states.gradients},
                       {"master", e.states.master}, {"optimizer", e.states.optimizer}};
  nlohmann::ordered_json ph = nlohmann::ordered_json::object();
  for (std::size_t i = 0; i < e.n_phases; ++i) ph[e.phases[i].name] = e.phases[i].bytes;
  o["phases"] = ph;
  nlohmann::ordered_json s0 = nlohmann::ordered_json::object();
  for (std::size_t i = 0; i < e.n_step0; ++i) s0[e.step0[i].name] = e.step0[i].bytes;
  o["step0"] = s0;
  return o.dump(indent);
}

}  // namespace membudget
