// Compiling the torch training step in (b, s): see step_plan.hpp for what a plan is.
//
// How a plan is found. The step is simulated (simulate_torch_train, recording its allocation
// stream) at three probe points P0 = (b0, s0), P1 = (2·b0, 3·s0), P2 = (5·b0, 7·s0). The simulation's
// control flow does not depend on b or s, so the three streams are the same sequence of tensors;
// each tensor's sizes give its class: v1 / v0 = 2^i · 3^j names the monomial, c = v0 / (b0^i · s0^j),
// and P2 must agree. Replaying the stream with each tensor as a basis vector gives, at every moment
// the allocator could peak (each allocation and each phase start), the live bytes as a vector.
//
// The model's depth: decoder layers are alike, so the live bytes at a moment inside layer i are the
// parameters (affine in L), what the other layers left (affine in i and L) and the layer's own
// tensors (docs/api.md). The probes run on 4-, 5- and 6-layer copies (the optimizer sized from the
// full model), each moment's vector is extrapolated affinely in the layer count, and of the
// interior layers only the first and last are kept (a vector affine in the layer index is at most
// the larger of its ends for every b and s). Models of at most six layers are simulated as they are.
// Where the layers alternate with a period P (Gemma 2 in the sliding-mask regime: a masked layer,
// then a plain one), the copies have L0, L0 + P and L0 + 2·P layers with L0 ≡ L (mod P), the
// vectors are affine in the number of periods, and the first and last P interior layers are kept
// (affine in the index along each residue class mod P). A layer low in the stack that frees what
// the layers above it do not (Gemma 2's layer 1 under eager attention and full recompute: its
// checkpoint frame holds the full layers' mask last) is kept too, with the P layers above it.
// Eager attention at micro-batch 1 differs from larger batches by one copy (its output gradient
// is a view): that regime's probes keep b = 1, the others' start at b = 2.
//
// Checks, each of which makes compile() return nullptr: every tensor has a monomial size; the
// streams of the three probes are identical; replaying the vectors reproduces every phase peak of
// every probe simulation exactly; the interior layers are affine in their index; every vector is
// affine in the layer count (three points) and stays non-negative; the basis has at most
// kMaxBasis components. tests/test_step_plan.cpp compares plans with full simulations.
#include "step_plan.hpp"

#include <algorithm>
#include <atomic>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <string>

#include "autograd_sim.hpp"
#include "inventory.hpp"
#include "plan_cache.hpp"
#include "plan_common.hpp"
#include "pipeline.hpp"

namespace membudget::detail {
namespace {

using namespace plan;
constexpr std::uint64_t kL0 = 4;  // the layer counts simulated for deep models: kL0, kL0 + 1, kL0 + 2

Contribution classify(bytes_t v0, bytes_t v1, bytes_t v2, const std::array<Probe, 3>& p,
                      std::vector<Basis>& basis) {
  const std::array<bytes_t, 3> v{v0, v1, v2};
  const Monomial mo = fit_monomial(v, p);
  return mo.c ? contribution(mo.c, mo.i, mo.j, 0, basis) : Contribution{};
}

// Tensors of one name live at the end of the forward.
struct PlanGroup {
  const TensorInfo* first = nullptr;  // op, dtype, shape, term of the first one
  std::uint64_t count = 0;
  std::vector<std::uint64_t> row;
};

// The three probe simulations of one layer count, and the live vectors replayed from them.
struct SimSet {
  std::uint64_t layers = 0;
  std::array<TorchStepResult, 3> res;
  std::array<std::array<SimTrace, 2>, 3> traces;     // [probe][pass]; pass 0 is step 0, 1 steady
  std::array<std::vector<Contribution>, 2> contrib;  // [pass][tensor]
  std::vector<std::uint64_t> rows;                   // candidate vectors, D each
  // [pass][phase][section] → candidate row indices, in time order
  std::array<std::array<std::vector<std::vector<std::uint32_t>>, StepPlan::kPhases>, 2> cand;
  // Live when the steady backward begins (= at the end of the forward): the activations, the
  // logits and the model states as vectors, and the activation and logits tensors by name.
  std::vector<std::uint64_t> act, logits, states;
  std::array<std::map<std::string, PlanGroup>, 2> groups;  // [0] activations, [1] logits/loss
};

void classify_set(SimSet& ss, const std::array<Probe, 3>& probes, std::vector<Basis>& basis) {
  for (int pass = 0; pass < 2; ++pass) {
    const SimTrace& t0 = ss.traces[0][pass];
    for (int k = 1; k < 3; ++k)
      if (!(ss.traces[k][pass].events == t0.events) || ss.traces[k][pass].phases != t0.phases ||
          ss.traces[k][pass].after_forward != t0.after_forward || ss.traces[k][pass].tensors.size() != t0.tensors.size())
        throw Fail{};
    auto& con = ss.contrib[pass];
    con.resize(t0.tensors.size());
    for (std::size_t t = 0; t < t0.tensors.size(); ++t) {
      if (t0.tensors[t].launch.kind != LaunchSize::Kind::none) {  // a kernel's temporary: its rule
        const std::array<LaunchSize, 3> at{t0.tensors[t].launch, ss.traces[1][pass].tensors[t].launch,
                                           ss.traces[2][pass].tensors[t].launch};
        con[t] = launch_contribution(fit_launch(at, probes), basis);
        continue;
      }
      con[t] = classify(t0.tensors[t].bytes, ss.traces[1][pass].tensors[t].bytes, ss.traces[2][pass].tensors[t].bytes,
                        probes, basis);
    }
  }
}

void replay(SimSet& ss, std::size_t D) {
  for (int pass = 0; pass < 2; ++pass) {
    const SimTrace& tr = ss.traces[0][pass];
    const auto& con = ss.contrib[pass];
    LiveVector live(D, con.size());
    const auto& cur = live.cur;
    const auto& alive = live.alive;
    for (auto& ph : ss.cand[pass]) ph.assign(ss.layers + 3, {});
    int phase = -1;
    auto candidate = [&](std::int32_t section) {
      if (phase < 0) return;
      if (section < 0 || static_cast<std::uint64_t>(section) > ss.layers + 2) throw Fail{};
      ss.cand[pass][phase][section].push_back(static_cast<std::uint32_t>(ss.rows.size() / D));
      ss.rows.insert(ss.rows.end(), cur.begin(), cur.end());
    };
    // What the steady pass holds when its backward begins, right after the forward.
    auto end_of_forward = [&] {
      ss.act.assign(D, 0);
      ss.logits.assign(D, 0);
      ss.states.assign(D, 0);
      for (std::size_t t = 0; t < con.size(); ++t) {
        if (!alive[t]) continue;
        const TensorInfo& info = tr.tensors[t];
        const int g = info.term == Term::activations ? 0 : info.term == Term::logits_loss ? 1 : -1;
        std::vector<std::uint64_t>* total = g == 0 ? &ss.act : g == 1 ? &ss.logits
                                          : info.term == Term::model_states ? &ss.states : nullptr;
        if (g >= 0) {
          PlanGroup& grp = ss.groups[g][info.name];
          if (!grp.first) grp.first = &info, grp.row.assign(D, 0);
          ++grp.count;
          con[t].apply(grp.row.data(), true);
        }
        if (total) con[t].apply(total->data(), true);
      }
    };
    // Each phase start names its phase (a pipeline schedule enters forward and backward many
    // times); the steady pass's activation groups are taken where the simulation noted them.
    std::size_t phase_events = 0;
    std::array<bool, StepPlan::kPhases> seen{};
    for (std::size_t e = 0; e < tr.events.size(); ++e) {
      if (pass == 1 && e == tr.after_forward) end_of_forward();
      const auto& ev = tr.events[e];
      if (ev.t == SimTrace::kPhase) {
        if (phase_events >= tr.phases.size()) throw Fail{};
        const Phase ph = tr.phases[phase_events++];
        phase = static_cast<int>(std::find(std::begin(kTrainPhases), std::end(kTrainPhases), ph) - std::begin(kTrainPhases));
        if (phase >= static_cast<int>(StepPlan::kPhases)) throw Fail{};
        seen[static_cast<std::size_t>(phase)] = true;
        candidate(ev.section);
        continue;
      }
      const bool alloc = ev.t >= 0;
      live.apply(static_cast<std::size_t>(alloc ? ev.t : ~ev.t), alloc, con);
      if (alloc) candidate(ev.section);
    }
    if (pass == 1 && tr.after_forward == tr.events.size()) end_of_forward();
    if (std::find(seen.begin(), seen.end(), false) != seen.end()) throw Fail{};
  }
  if (ss.act.size() != D) throw Fail{};
}

// Replaying must reproduce every phase of every probe simulation to the byte.
void self_check(const SimSet& ss, const std::vector<Basis>& basis, const std::array<Probe, 3>& probes) {
  const std::size_t D = basis.size();
  std::vector<std::uint64_t> vals(D);
  for (int k = 0; k < 3; ++k) {
    if (!basis_values(basis, probes[k].b, probes[k].s, vals.data())) throw Fail{};
    for (int pass = 0; pass < 2; ++pass) {
      const auto& phases = pass == 1 ? ss.res[k].steady : ss.res[k].step0;
      if (phases.size() != StepPlan::kPhases) throw Fail{};
      for (std::size_t p = 0; p < StepPlan::kPhases; ++p) {
        if (phases[p].phase != kTrainPhases[p]) throw Fail{};
        u128 best = 0;
        for (const auto& sec : ss.cand[pass][p])
          for (std::uint32_t r : sec) best = std::max(best, dot(&ss.rows[std::size_t{r} * D], vals.data(), D));
        if (best != phases[p].bytes) throw Fail{};
      }
    }
  }
}

// Interior layers (sections 2 … layers − 1) must be affine in their index, moment by moment (with
// period P: along each residue class of the index mod P), from interior layer F − P + 1 on (the
// first F interior layers are kept as they are: the layers below F − P + 1 may be unlike the rest).
void check_interior(const SimSet& ss, std::size_t D, std::uint64_t P, std::uint64_t F) {
  if (ss.layers < F + P + 3) return;
  for (const auto& pass : ss.cand)
    for (const auto& ph : pass) {
      for (std::uint64_t sec = F + 2; sec + P <= ss.layers - 1; ++sec) {
        const auto &a = ph[sec - P], &b = ph[sec], &c = ph[sec + P];
        if (a.size() != b.size() || b.size() != c.size()) throw Fail{};
        for (std::size_t n = 0; n < a.size(); ++n)
          for (std::size_t d = 0; d < D; ++d) {
            const i128 x = ss.rows[a[n] * D + d], y = ss.rows[b[n] * D + d], z = ss.rows[c[n] * D + d];
            if (z - y != y - x) throw Fail{};
          }
      }
    }
}

// The value at L layers from those at L2 − 2·P, L2 − P and L2 layers (L ≡ L2 mod P).
struct Depth {
  std::uint64_t L, L2, P;
};

std::uint64_t extrapolate(std::uint64_t v0, std::uint64_t v1, std::uint64_t v2, const Depth& dp) {
  const i128 a = v0, b = v1, c = v2;
  if (c - b != b - a) throw Fail{};
  const i128 v = c + (b - a) * ((static_cast<i128>(dp.L) - static_cast<i128>(dp.L2)) / static_cast<i128>(dp.P));
  if (v < 0 || v > static_cast<i128>(kMax64)) throw Fail{};
  return static_cast<std::uint64_t>(v);
}

std::atomic<std::uint64_t> g_failures{0};

}  // namespace

std::array<plan::Probe, 3> training_probes(const ModelSpec& m, const Job& job) {
  using namespace plan;
  // Probes inside the job's regime.
  const int regime = StepPlan::regime(m, job);
  // A step whose stream differs at batch 1 (stream_differs_at_batch_one: attention that folds b·a,
  // SP's all-gathers): b = 1 at every probe in its batch-1 regime, b ≥ 2 at every probe outside it
  const bool batch_one = regime & StepPlan::kBatchOne;
  std::uint64_t b0 = stream_differs_at_batch_one(m, job) && !batch_one ? 2 : 1, s0 = 1;
  if (regime & 2) s0 = m.sliding.window;  // s ≥ window at every probe
  if (job.loss == Loss::chunked) {
    if (regime & 1) {  // T ≥ loss_chunk at every probe: through s (at the window or b = 1), or b
      if ((regime & 2) || batch_one) s0 = std::max(s0, job.loss_chunk);
      else b0 = std::max(b0, job.loss_chunk);
    } else if (static_cast<u128>(job.loss_chunk) < static_cast<u128>(batch_one ? 7 : 35 * b0) * s0) {
      throw Fail{};  // the last probe's T = 7·s0 (b = 1) or 35·b0·s0 is above loss_chunk
    }
  }
  if (!(regime & 2)) {  // s = s0, 3·s0, 7·s0 below the window
    Job last = job;
    last.seq = 7 * s0;
    if (sliding_window_mask(m, last)) throw Fail{};
  }
  const std::uint64_t b1 = batch_one ? 1 : 2 * b0, b2 = batch_one ? 1 : 5 * b0;
  const std::array<Probe, 3> probes{{{b0, s0}, {b1, 3 * s0}, {b2, 7 * s0}}};
  // Sequence parallelism: every size is c · b^i · (s / t)^j with integer c (a sharded tensor has
  // s / t rows, a gathered one t · (s / t)), so the plan's variable is the local sequence s / t
  // and the probes simulate t times it. The chunk's and the window's bounds are in whole sequences:
  // not compiled (the batch-1 regime has none).
  const std::uint64_t unit = StepPlan::seq_unit(job);
  if (unit > 1 && (regime & ~StepPlan::kBatchOne) != 0) throw Fail{};
  if (probes[2].s > (1ull << 32) / probes[2].b / unit) throw Fail{};
  return probes;
}

struct PlanBuilder {
  static std::shared_ptr<const StepPlan> build(const ModelSpec& m, const Job& job) {
    const std::uint64_t L = m.num_layers;
    const int regime = StepPlan::regime(m, job);
    const std::array<Probe, 3> probes = training_probes(m, job);
    const std::uint64_t unit = StepPlan::seq_unit(job);

    // Gemma 2's alternating windows: in the mask regime only every P-th layer is masked
    // (inventory_torch.cpp, Step::layer), so the layers repeat with period P.
    const std::uint64_t P = (regime & 2) && m.sliding.every_nth > 1 ? m.sliding.every_nth : 1;
    // The first F interior layers are kept: up to the highest layer that frees what the layers above
    // it do not (a checkpoint frame the last to hold a mask: last_mask_holder), and P more.
    const std::uint64_t F = P + std::min<std::uint64_t>(last_mask_holder(m, job), L);
    // the last P interior layers are interior, and like the layers from F − P + 1 on
    const std::uint64_t base = std::max<std::uint64_t>(kL0, F + 2);
    const std::uint64_t L0 = base + (L > base ? (L - base) % P : 0);
    // A pipeline stage is simulated at its full depth: its share of a smaller copy is another split.
    const bool direct = L <= L0 + 2 * P || job.parallel.pipeline > 1;
    // The copies are the model with fewer layers, so the layers they leave out must be like the
    // interior ones: a mixture of experts qualifies when every layer from 1 on is an MoE layer (a
    // dense layer 0 is a section of its own). Other patterns (decoder_sparse_step, mlp_only_layers,
    // first_k_dense_replace > 1) are simulated.
    if (!direct && m.moe.enabled())
      for (std::uint64_t il = 1; il < L; ++il)
        if (!m.moe_layer(il)) throw Fail{};
    const Depth dp{L, L0 + 2 * P, P};
    std::vector<SimSet> sets(direct ? 1 : 3);
    for (std::size_t n = 0; n < sets.size(); ++n) {
      SimSet& ss = sets[n];
      ss.layers = direct ? L : L0 + n * P;
      ModelSpec small = m;
      small.num_layers = ss.layers;
      for (int k = 0; k < 3; ++k) {
        Job pj = job;
        pj.batch = probes[k].b;
        pj.seq = probes[k].s * unit;
        ss.res[k] = simulate_torch_train(small, pj, false, &m, &ss.traces[k]);
      }
    }
    auto plan = std::make_shared<StepPlan>();
    std::vector<Basis> basis{Basis{}};  // component 0: the constant
    for (auto& ss : sets) classify_set(ss, probes, basis);
    const std::size_t D = basis.size();
    for (auto& ss : sets) {
      replay(ss, D);
      self_check(ss, basis, probes);
      if (!direct) check_interior(ss, D, P, F);
    }

    std::vector<std::uint64_t> weight(D);
    if (!basis_values(basis, 4, 4096, weight.data())) throw Fail{};
    std::vector<std::vector<std::uint64_t>> per_phase;
    for (int pp = 0; pp < 2 * static_cast<int>(StepPlan::kPhases); ++pp) {
      const int pass = pp < static_cast<int>(StepPlan::kPhases) ? 1 : 0;  // steady first
      const std::size_t phase = static_cast<std::size_t>(pp) % StepPlan::kPhases;
      std::vector<std::uint64_t> all;
      if (direct) {
        for (const auto& sec : sets[0].cand[pass][phase])
          for (std::uint32_t r : sec) all.insert(all.end(), &sets[0].rows[r * D], &sets[0].rows[r * D] + D);
      } else {
        // sections kept: before the layers, layer 0, the first F and last P interior layers, the
        // last layer, after the layers, outside the module
        for (std::uint64_t q = 0; q < F + P + 5; ++q) {
          const std::vector<std::uint32_t>* lists[3];
          for (int n = 0; n < 3; ++n) {
            const std::uint64_t ls = sets[n].layers;
            const std::uint64_t sec = q < F + 2 ? q : q < F + P + 2 ? ls - P + (q - F - 2) : ls + (q - F - P - 2);
            lists[n] = &sets[n].cand[pass][phase][sec];
          }
          if (lists[0]->size() != lists[2]->size() || lists[1]->size() != lists[2]->size()) throw Fail{};
          for (std::size_t r = 0; r < lists[2]->size(); ++r)
            for (std::size_t d = 0; d < D; ++d)
              all.push_back(extrapolate(sets[0].rows[(*lists[0])[r] * D + d], sets[1].rows[(*lists[1])[r] * D + d],
                                        sets[2].rows[(*lists[2])[r] * D + d], dp));
        }
      }
      if (all.empty()) throw Fail{};
      per_phase.push_back(prune(all, D, weight));
    }

    auto scalar = [&](auto get) -> bytes_t {
      if (direct) return get(sets[0].res[0]);
      return extrapolate(get(sets[0].res[0]), get(sets[1].res[0]), get(sets[2].res[0]), dp);
    };
    plan->weights = scalar([](const TorchStepResult& r) { return r.weights; });
    plan->gradients = scalar([](const TorchStepResult& r) { return r.gradients; });
    plan->optimizer_state = scalar([](const TorchStepResult& r) { return r.optimizer_state; });
    plan->master = scalar([](const TorchStepResult& r) { return r.master; });
    // FSDP2's CPU offload: the host shards, gradients and optimizer state (0 otherwise)
    plan->host_parameters = scalar([](const TorchStepResult& r) { return r.host_parameters; });
    plan->host_gradients = scalar([](const TorchStepResult& r) { return r.host_gradients; });
    plan->host_optimizer_state = scalar([](const TorchStepResult& r) { return r.host_optimizer_state; });
    auto row = [&](auto get) {
      std::vector<std::uint64_t> out(D);
      for (std::size_t d = 0; d < D; ++d)
        out[d] = direct ? get(sets[0])[d] : extrapolate(get(sets[0])[d], get(sets[1])[d], get(sets[2])[d], dp);
      for (std::uint64_t v : out)
        if (v >= (1ull << 58)) throw Fail{};
      return out;
    };
    plan->activations_ = row([](const SimSet& ss) -> const std::vector<std::uint64_t>& { return ss.act; });
    plan->logits_ = row([](const SimSet& ss) -> const std::vector<std::uint64_t>& { return ss.logits; });
    plan->states_ = row([](const SimSet& ss) -> const std::vector<std::uint64_t>& { return ss.states; });
    // The model-state tensors live after the forward are the weights, the optimizer state and the
    // autocast copies: the constant component must hold the first two.
    if (plan->states_[0] < plan->weights + plan->optimizer_state + plan->master) throw Fail{};
    for (int g = 0; g < 2; ++g) {
      for (std::size_t n = 1; n < sets.size(); ++n)
        if (sets[n].groups[g].size() != sets[0].groups[g].size()) throw Fail{};
      for (const auto& [name, grp] : sets[0].groups[g]) {
        const PlanGroup* per[3] = {&grp, &grp, &grp};
        for (std::size_t n = 1; n < sets.size(); ++n) {
          auto it = sets[n].groups[g].find(name);
          if (it == sets[n].groups[g].end()) throw Fail{};
          per[n] = &it->second;
        }
        StepPlan::Group out;
        out.info = *grp.first;
        out.count = direct ? grp.count : extrapolate(per[0]->count, per[1]->count, per[2]->count, dp);
        out.row = row([&](const SimSet& ss) -> const std::vector<std::uint64_t>& {
          return per[&ss - sets.data()]->row;
        });
        plan->groups_[g].push_back(std::move(out));
      }
    }
    plan->rows_.set(std::move(basis), per_phase);
    plan->seq_unit_ = unit;
    return plan;
  }
};

int StepPlan::regime(const ModelSpec& m, const Job& job) {
  const int chunk = job.loss == Loss::chunked && static_cast<u128>(job.batch) * job.seq > job.loss_chunk ? 1 : 0;
  const bool batch_one = stream_differs_at_batch_one(m, job) && matmul_folds_batch_as_view(job);
  return chunk | (sliding_window_mask(m, job) ? 2 : 0) | (batch_one ? kBatchOne : 0);
}

std::shared_ptr<const StepPlan> StepPlan::compile(const ModelSpec& m, const Job& job) {
  try {
    return PlanBuilder::build(m, job);
  } catch (const Fail&) {
    g_failures.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
}

namespace {
Error overflow_at(std::uint64_t b, std::uint64_t s) {
  return Error(ErrorKind::overflow, "step bytes at batch " + std::to_string(b) + ", seq " + std::to_string(s) +
                                        ": a size does not fit in 64 bits");
}
}  // namespace

std::uint64_t StepPlan::local_seq(std::uint64_t s) const {
  if (s % seq_unit_)  // the job's validation refuses such a sequence under sequence or context parallelism
    throw Error(ErrorKind::invalid_job, "seq " + std::to_string(s) + ": not a multiple of the sequence- and context-parallel degree " +
                                            std::to_string(seq_unit_));
  return s / seq_unit_;
}

StepPlan::Result StepPlan::evaluate(std::uint64_t b, std::uint64_t seq) const {
  const std::uint64_t s = local_seq(seq);
  std::array<std::uint64_t, kMaxBasis> vals;
  std::array<bytes_t, 2 * kPhases> peaks;
  if (!rows_.max_per_phase(b, s, vals.data(), peaks.data())) throw overflow_at(b, s);
  Result r;
  std::copy_n(peaks.begin(), kPhases, r.steady.begin());
  std::copy_n(peaks.begin() + kPhases, kPhases, r.step0.begin());
  const u128 a = dot(activations_.data(), vals.data(), rows_.basis().size());
  if (a > kMax64) throw overflow_at(b, s);
  r.activations = static_cast<bytes_t>(a);
  return r;
}

TorchStepResult StepPlan::result(std::uint64_t b, std::uint64_t seq) const {
  const Result r = evaluate(b, seq);
  const std::uint64_t s = local_seq(seq);
  std::array<std::uint64_t, kMaxBasis> vals;
  basis_values(rows_.basis(), b, s, vals.data());  // fits: evaluate() checked
  const std::size_t D = rows_.basis().size();
  auto bytes = [&](const std::vector<std::uint64_t>& row) {
    const u128 v = dot(row.data(), vals.data(), D);
    if (v > kMax64) throw overflow_at(b, s);
    return static_cast<bytes_t>(v);
  };
  TorchStepResult out;
  for (std::size_t p = 0; p < kPhases; ++p) {
    out.steady.push_back({kTrainPhases[p], r.steady[p], {}});
    out.step0.push_back({kTrainPhases[p], r.step0[p], {}});
  }
  out.weights = weights;
  out.gradients = gradients;
  out.optimizer_state = optimizer_state;
  out.master = master;
  out.host_parameters = host_parameters;
  out.host_gradients = host_gradients;
  out.host_optimizer_state = host_optimizer_state;
  out.after_forward_activations = r.activations;
  out.after_forward_logits = bytes(logits_);
  out.after_forward_autocast = bytes(states_) - weights - optimizer_state - master;
  for (int g = 0; g < 2; ++g) {
    auto& list = g == 0 ? out.saved : out.saved_logits;
    list.reserve(groups_[g].size());
    for (const Group& grp : groups_[g])
      list.push_back({grp.info.name, grp.info.op, grp.info.dtype, grp.info.shape, grp.count, bytes(grp.row),
                      grp.info.term, grp.info.role});
  }
  return out;
}

const StepPlan* StepPlan::cached(const ModelSpec& m, const Job& job) {
  return PlanCache<StepPlan>::mine().get(m, job, static_cast<std::uint64_t>(regime(m, job)), compile);
}

namespace {
struct StagePlans {
  std::vector<std::shared_ptr<const StepPlan>> stages;
};
}  // namespace

const std::vector<std::shared_ptr<const StepPlan>>* StepPlan::stage_plans(const ModelSpec& m, const Job& job) {
  const auto regime_of = static_cast<std::uint64_t>(regime(m, job));
  const StagePlans* plans = PlanCache<StagePlans>::mine().get(m, job, regime_of, [&](const ModelSpec& mm, const Job& jj) {
    auto out = std::make_shared<StagePlans>();
    Job at = jj;
    for (std::uint64_t r = 0; r < jj.parallel.pipeline; ++r) {
      at.parallel.rank = r * ranks_per_stage(jj.parallel);  // each stage's first shard
      auto plan = PlanCache<StepPlan>::mine().shared(mm, at, regime_of, compile);
      if (!plan) return std::shared_ptr<const StagePlans>{};
      out->stages.push_back(std::move(plan));
    }
    return std::shared_ptr<const StagePlans>(std::move(out));
  });
  return plans ? &plans->stages : nullptr;
}

void StepPlan::clear_cache() noexcept {
  PlanCache<StepPlan>::mine().clear();
  PlanCache<StagePlans>::mine().clear();
}

TorchStepResult simulate_torch_train_fast(const ModelSpec& m, const Job& job) {
  if (!StepPlan::covers(job)) return simulate_torch_train(m, job, false);
  if (const StepPlan* plan = StepPlan::cached(m, job)) return plan->result(job.batch, job.seq);
  return simulate_torch_train(m, job, false);
}

std::uint64_t step_plan_failures() { return g_failures.load(std::memory_order_relaxed); }

}  // namespace membudget::detail
