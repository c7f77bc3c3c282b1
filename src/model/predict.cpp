// predict(): assembles the five terms and the phase peaks.
#include <algorithm>
#include <cstdio>
#include <iterator>
#include <optional>

#include "inventory.hpp"
#include "korthikanti.hpp"
#include "parallel.hpp"
#include "pipeline.hpp"
#include "predictors.hpp"
#include "reserved.hpp"
#include "membudget/api.hpp"
#include "membudget/budget.hpp"
#include "membudget/input.hpp"

namespace membudget {

bytes_t default_overhead(Profile profile) {
  // CUDA context, cuBLAS handle and kernels outside the allocator: PyTorch 2.11 with CUDA 13 on an
  // H200 (docs/model.md); the harness loads no PyTorch kernels, so its context is smaller.
  return profile == Profile::harness ? 560 * MiB : 767 * MiB;
}

void check_options_apply_to(const ModelSpec& m, const Job& job) {
  if (m.moe.enabled()) return;
  // a setting the model does not cover is an error, not ignored
  const char* given = job.experts != ExpertsImpl::grouped_mm ? "--experts"
                      : job.routing != Routing::balanced     ? "--routing"
                      : job.router_aux_loss                  ? "--router-aux-loss"
                                                             : nullptr;
  if (given) throw Error(ErrorKind::invalid_job, std::string(given) + ": " + m.display_name() + " has no mixture of experts");
}

namespace detail {
unsigned __int128 eager_expert_iterations(const ModelSpec& m, const Job& job) {
  const std::uint64_t stages = std::max<std::uint64_t>(1, job.parallel.pipeline);
  const std::uint64_t microbatches =
      stages == 1 ? simulated_accum_steps(job) : job.parallel.microbatches ? job.parallel.microbatches : stages;
  return static_cast<unsigned __int128>(m.moe.local_experts()) * m.moe_layers() * microbatches / stages;
}

void check_simulated(const ModelSpec& m, const Job& job) {
  check_options_apply_to(m, job);
  // A pipeline stage is walked layer by layer for every microbatch it runs (membudget/input.hpp).
  // (more microbatches than modelled at all: Job::validate refuses them by that limit)
  const std::uint64_t layers = most_layers_of_a_stage_rank(m, job.parallel);
  if (layers && job.parallel.microbatches <= limits::kMaxMicrobatches) {
    const std::uint64_t microbatches = job.parallel.microbatches ? job.parallel.microbatches : job.parallel.pipeline;
    if (pipeline_layer_passes(m, job.parallel) > limits::kMaxPipelineLayerPasses)
      throw Error(ErrorKind::unsupported,
                  "--microbatches " + std::to_string(microbatches) + " over --pp " + std::to_string(job.parallel.pipeline) +
                      ": a stage rank runs " + std::to_string(layers) + " of " + m.display_name() + "'s decoder layers for each of " +
                      std::to_string(microbatches) + " microbatches, more than the " +
                      std::to_string(limits::kMaxPipelineLayerPasses) +
                      " layer passes walked (each is simulated); use fewer microbatches or more stages");
  }
  if (!m.moe.enabled()) return;
  // --experts eager is walked as transformers loops, expert by expert, in every MoE layer and, in a
  // pipeline, every microbatch a stage runs (membudget/input.hpp). (Before Job::validate: the
  // counts may be anything, so the product is taken in 128 bits.)
  if (job.experts == ExpertsImpl::eager) {
    using limits::kMaxEagerExpertIterations;
    const std::uint64_t stages = std::max<std::uint64_t>(1, job.parallel.pipeline);
    const std::uint64_t microbatches = stages == 1 ? 1 : job.parallel.microbatches ? job.parallel.microbatches : stages;
    const std::uint64_t accumulated = simulated_accum_steps(job);
    if (eager_expert_iterations(m, job) > kMaxEagerExpertIterations)
      throw Error(ErrorKind::unsupported,
                  "--experts eager: " + m.display_name() + "'s " + std::to_string(m.moe.local_experts()) + " experts × " +
                      std::to_string(m.moe_layers()) + " MoE layers" +
                      (stages == 1 ? accumulated > 1 ? " × " + std::to_string(accumulated) + " accumulation micro-batches walked"
                                                     : std::string()
                                   : " × " + std::to_string(microbatches) + " microbatches over " + std::to_string(stages) +
                                         " stages") +
                      " is more than the " + std::to_string(kMaxEagerExpertIterations) +
                      " expert iterations modelled (the eager loop is walked expert by expert); grouped_mm and "
                      "batched_mm are modelled at any size");
  }
  // Training: check_torch_coverage says which MoE jobs the inventory walks; the harness refuses MoE.
  if (job.mode == Mode::train) return;
  if (job.weights != DType::bf16 && job.weights != DType::fp16)
    throw Error(ErrorKind::unsupported, m.display_name() + ": --weights " +
                                            to_string(job.weights) +
                                            " on a mixture of experts is not modelled (its experts are served in bf16 or fp16)");
}

// What each group of ranks is predicted with (Budget::ranks, the pipeline's most loaded rank): the
// job's options, so that every group's phases are on this rank's footing (replayed where it is),
// without the lists or the groups of its own.
PredictOptions group_options(const PredictOptions& options) {
  PredictOptions one = options;
  one.ranks = one.explain = false;
  return one;
}

// A group of ranks whose figures are `src`'s (Budget::ranks).
Budget::RankGroup rank_group(std::vector<std::uint64_t> ranks, const Budget& src) {
  Budget::RankGroup g;
  g.ranks = std::move(ranks);
  for (const auto& p : src.phases) g.phases.push_back({p.phase, p.bytes, {}});
  for (const auto& p : src.step0) g.step0.push_back({p.phase, p.bytes, {}});
  g.peak = src.peak;
  return g;
}
}  // namespace detail

Budget predict(const ModelSpec& model, const Job& job, const PredictOptions& options) {
  model.validate();
  detail::check_simulated(model, job);
  job.validate();  // refuses parallel layouts not modelled (docs/distributed.md)
  detail::check_layout(model, job);
  if (job.parallel.pipeline > 1 && !job.parallel.rank) {
    // The most loaded rank: one of each distinct group predicted (every stage is its own: their
    // layers, embedding or head and schedule position all differ; with FSDP2 within the stages,
    // shards of one stage group by their sizes), the highest peak kept, the lowest rank on a tie.
    // The groups' figures are the `ranks` list, so none is predicted twice for it.
    Job at = job;
    std::vector<std::vector<std::uint64_t>> groups = detail::distinct_ranks(model, job);
    std::vector<Budget> each;
    std::size_t best = 0;
    const PredictOptions one = detail::group_options(options);
    for (const auto& group : groups) {
      at.parallel.rank = group.front();
      each.push_back(predict(model, at, one));
      if (each.back().peak > each[best].peak) best = each.size() - 1;
    }
    at.parallel.rank = groups[best].front();
    PredictOptions chosen = options;
    chosen.ranks = false;
    // Asked again only for the lists --explain adds: the rank's second question would compile its
    // reserved stream (PlanCache::get_on_second_use) for an answer already at hand.
    Budget b = options.explain ? predict(model, at, chosen) : std::move(each[best]);
    if (options.ranks)
      for (std::size_t g = 0; g < groups.size(); ++g)
        b.ranks.push_back(detail::rank_group(std::move(groups[g]), g == best ? b : each[g]));
    b.job.parallel.rank.reset();  // the job as given: the rank was chosen, not asked for
    return b;
  }
  Budget b;
  b.model = model;
  b.job = job;
  b.parameters = model.parameters();
  b.terms.overhead = job.overhead.value_or(default_overhead(job.profile));

  // Parsed whenever given (a bad key is an error even without the replay); nothing on the fast path.
  const detail::AllocatorConf conf =
      options.allocator_conf.empty() ? detail::AllocatorConf{} : detail::parse_allocator_conf(options.allocator_conf);
  // Where the replay runs, its allocator's per-phase peaks stand for the phases
  // (allocated_as_replayed): it places every block as c10 does, so it counts the blocks a request
  // takes whole and the job's rounding, where the simulation counts 512-byte blocks (measured on
  // every committed single-GPU step: docs/accuracy.md, "The replay's phases"; tests/test_reserved.cpp
  // holds them). roundup_power2_divisions rounds blocks up to a step of their power-of-two
  // interval, 5-6% more than 512-byte blocks, so such a setting runs the replay, asked or not.
  const bool rounds = conf.policy.rounds_to_divisions();
  const bool replays = (options.reserved || rounds) && job.mode == Mode::train && job.profile == Profile::torch;
  std::optional<detail::ReservedResult> replayed;
  if (job.mode == Mode::infer && job.profile == Profile::harness) {
    detail::predict_harness_infer(b, options);
  } else if (job.mode == Mode::infer) {
    detail::predict_infer(b, options);
  } else if (job.profile == Profile::harness) {
    detail::predict_harness(b, options);
  } else {
    detail::TorchStepResult r;
    if (options.explain || options.full_simulation) {
      r = detail::simulate_torch_train(model, job, options.explain);
    } else {
      // The replay's first question about a regime simulates the step at the shape: that
      // simulation's result is the estimate too, with no plan compiled for one question.
      if (replays) replayed = detail::simulate_reserved(model, job, conf.policy, &r);
      if (!replayed || !replayed->step_simulated) r = detail::simulate_torch_train_fast(model, job);
    }
    b.states.weights = r.weights;
    b.states.gradients = r.gradients;
    b.states.optimizer = r.optimizer_state;
    b.states.master = r.master;
    b.host = {r.host_parameters, r.host_gradients, r.host_optimizer_state};
    b.autocast_cache = r.after_forward_autocast;
    // a pipeline stage's figures are its own layers' (with every microbatch in flight at the time)
    const std::uint64_t layers =
        job.parallel.pipeline > 1 ? detail::pipeline_stage(model, job, *job.parallel.rank).layers : model.num_layers;
    b.activations.layers = layers;
    b.activations.layer_tensors = r.saved;
    b.logits = detail::logits_breakdown(model, job);  // the rank's (its stage, its vocabulary shard)
    b.phases = std::move(r.steady);
    b.step0 = std::move(r.step0);
    if (job.activations == ActivationModel::inventory) {
      b.activations.per_layer = r.after_forward_activations / std::max<std::uint64_t>(1, layers);
      b.activations.other = r.after_forward_activations - b.activations.per_layer * layers;
    } else {
      // Table 2 of Korthikanti et al.: a tensor-parallel rank keeps the split terms at 1/t
      b.activations = detail::korthikanti(detail::rank_spec(model, job.parallel), job);
      if (job.parallel.pipeline > 1) {
        // §4.2.3: a stage holds its layers' activations for each microbatch in flight — M under
        // GPipe, min(M, stages − stage) under 1F1B (the first stage's factor: p microbatches of L/p
        // layers), and under interleaved 1F1B each chunk's layers for its microbatches in flight
        b.activations.layers = detail::most_layers_in_flight(detail::pipeline_stage(model, job, *job.parallel.rank));
      }
    }
  }
  b.terms.model_states = b.states.total();
  b.terms.activations = b.activations.total();
  b.terms.logits_loss = b.logits.total();
  if (replays) {
    const detail::ReservedResult r = replayed ? *replayed : detail::simulate_reserved(model, job, conf.policy);
    for (std::size_t i = 0; i < std::size(kTrainPhases); ++i) {
      b.reserved.push_back({kTrainPhases[i], r.steady[i], {}});
      b.reserved_step0.push_back({kTrainPhases[i], r.step0[i], {}});
    }
    b.reserved_peak = r.reserved_peak;
    detail::allocated_as_replayed(b, r);
  } else if (rounds) {
    throw Error(ErrorKind::invalid_job,
                "--allocator-conf: roundup_power2_divisions is modelled for training steps as PyTorch runs them "
                "(the reserved replay); this job's phases count 512-byte blocks");
  }
  // The peak and where it is.
  for (const auto& p : b.phases)
    if (p.bytes > b.peak) {
      b.peak = p.bytes;
      b.peak_phase = p.name();
    }
  for (const auto& p : b.step0)
    if (p.bytes > b.peak) {
      b.peak = p.bytes;
      b.peak_phase = phase_label(p.phase, true);
    }
  const detail::RankLayout layout = detail::layout_of(model, job);
  if (!job.parallel.single()) {
    b.rank = layout.rank;
    b.world = layout.world;
    if (options.ranks) {
      const PredictOptions one = detail::group_options(options);
      for (auto& group : detail::distinct_ranks(model, job)) {
        Job at = job;
        at.parallel.rank = group.front();
        const bool mine = group.front() == b.rank;
        const Budget r = mine ? Budget{} : predict(model, at, one);
        b.ranks.push_back(detail::rank_group(std::move(group), mine ? b : r));
      }
    }
  }
  if (!options.explain) {
    for (auto& p : b.phases) p.live.clear();
    for (auto& p : b.step0) p.live.clear();
  }
  return b;
}

Fit check_fit(const Budget& budget, const Device& device, double headroom) {
  if (!(headroom >= 0.0 && headroom < 1.0))
    throw Error(ErrorKind::invalid_argument, "--headroom: must be in [0, 1), e.g. 0.05 for 5%");
  if (device.capacity == 0) throw Error(ErrorKind::invalid_argument, "--device-memory: capacity must be positive");
  Fit f;
  f.device = device;
  f.capacity = device.capacity;
  f.headroom = headroom;
  f.allocated_required = checked_add(budget.peak, budget.terms.overhead, "peak + overhead");
  f.on_reserved = budget.reserved_peak > 0;
  f.required = f.on_reserved ? checked_add(budget.reserved_peak, budget.terms.overhead, "reserved_peak + overhead")
                             : f.allocated_required;
  f.fits = static_cast<double>(f.required) <= static_cast<double>(device.capacity) * (1.0 - headroom);
  return f;
}

}  // namespace membudget
