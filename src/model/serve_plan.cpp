// Compiling the serving walk in (b, s): see serve_plan.hpp and plan_common.hpp.
//
// Probes P0 = (1, s0), P1 = (2, s0), P2 = (1, s1), P3 = (3, s2), with s0 = 1, s1 = 2, s2 = 4 below
// the sliding window (s0 = w, s1 = w + 1, s2 = w + 3 at or beyond it; s = w - 1, where only the
// decode step is masked, is walked). Each tensor's size is
// c · b^i · s^j · (s+1)^l: v1 / v0 = 2^i; (j, l) is the one pair with v2 / v0 = (s1/s0)^j ·
// ((s1+1)/(s0+1))^l (s and s + 1 are coprime, so the pair is unique); P3 verifies. Then the
// stream is replayed as vectors, and every floor, prefill and decode peak of the four probe walks
// must come out to the byte, or there is no plan.
#include "serve_plan.hpp"

#include <atomic>

#include "plan_cache.hpp"

namespace membudget::detail {
namespace {

using namespace plan;

Contribution classify(const std::array<bytes_t, 4>& v, const std::array<Probe, 4>& p, std::vector<Basis>& basis) {
  if (v[0] == 0) {
    if (v[1] || v[2] || v[3]) throw Fail{};
    return {};
  }
  if (v[1] % v[0]) throw Fail{};
  std::uint64_t r = v[1] / v[0];
  unsigned i = 0;
  while (r % 2 == 0 && i <= 3) r /= 2, ++i;
  if (r != 1 || i > 3) throw Fail{};
  for (unsigned j = 0; j <= 3; ++j)
    for (unsigned l = 0; l <= 3; ++l) {
      const u128 m0 = monomial(1, 0, p[0].s, j, l), m2 = monomial(1, 0, p[2].s, j, l);
      if (m0 > kMax64 || m2 > kMax64) continue;
      if (static_cast<u128>(v[2]) * m0 != static_cast<u128>(v[0]) * m2) continue;
      if (v[0] % m0) throw Fail{};
      const bytes_t c = static_cast<bytes_t>(v[0] / m0);
      if (sat_mul(c, monomial(p[3].b, i, p[3].s, j, l)) != v[3]) throw Fail{};
      return contribution(c, i, j, l, basis);
    }
  throw Fail{};
}

std::atomic<std::uint64_t> g_failures{0};

}  // namespace

struct ServePlanBuilder {
  static std::shared_ptr<const ServePlan> build(const ModelSpec& m, const Job& job) {
    const bool beyond = ServePlan::regime(m, job) == 1;
    const std::uint64_t w = m.sliding.window;
    if (m.sliding.enabled() && !beyond && w < 6) throw Fail{};  // s + 2 ≤ window at every probe
    const std::uint64_t s0 = beyond ? w : 1, s1 = beyond ? w + 1 : 2, s2 = beyond ? w + 3 : 4;
    const std::array<Probe, 4> probes{{{1, s0}, {2, s0}, {1, s1}, {3, s2}}};
    std::array<SimTrace, 4> traces;
    std::array<ServeStepResult, 4> res;
    for (int k = 0; k < 4; ++k) {
      Job pj = job;
      pj.batch = probes[k].b;
      pj.seq = probes[k].s;
      res[k] = simulate_serving(m, pj, false, &traces[k]);
    }
    const SimTrace& t0 = traces[0];
    for (int k = 1; k < 4; ++k)
      if (!(traces[k].events == t0.events) || traces[k].tensors.size() != t0.tensors.size()) throw Fail{};
    std::vector<Basis> basis{Basis{}};  // component 0: the constant
    std::vector<Contribution> con(t0.tensors.size());
    for (std::size_t t = 0; t < con.size(); ++t)
      con[t] = classify({t0.tensors[t].bytes, traces[1].tensors[t].bytes, traces[2].tensors[t].bytes,
                         traces[3].tensors[t].bytes},
                        probes, basis);
    const std::size_t D = basis.size();

    // Replay: the floor is the live vector when the prefill begins; each phase's candidates are
    // its start and every allocation in it.
    std::vector<std::vector<std::uint64_t>> per_phase(ServePlan::kPhases);
    LiveVector live(D, con.size());
    const auto& cur = live.cur;
    int phase = -1;
    for (const auto& ev : t0.events) {
      if (ev.t == SimTrace::kPhase) {
        if (++phase >= 2) throw Fail{};
        if (phase == 0) per_phase[0] = cur;
        per_phase[1 + phase].insert(per_phase[1 + phase].end(), cur.begin(), cur.end());
        continue;
      }
      const bool alloc = ev.t >= 0;
      live.apply(static_cast<std::size_t>(alloc ? ev.t : ~ev.t), alloc, con);
      if (alloc && phase >= 0) per_phase[1 + phase].insert(per_phase[1 + phase].end(), cur.begin(), cur.end());
    }
    if (phase != 1) throw Fail{};

    std::vector<std::uint64_t> weight(D);
    if (!basis_values(basis, 4, s0 + 4096, weight.data())) throw Fail{};
    for (std::size_t p = 1; p < ServePlan::kPhases; ++p) per_phase[p] = prune(per_phase[p], D, weight);
    auto plan = std::make_shared<ServePlan>();
    plan->weights = res[0].weights;
    plan->rows_.set(std::move(basis), per_phase);
    // Every probe walk must come out to the byte.
    for (int k = 0; k < 4; ++k) {
      const auto got = plan->evaluate(probes[k].b, probes[k].s);
      if (res[k].phases.size() != 2 || got[0] != res[k].floor || got[1] != res[k].phases[0].bytes ||
          got[2] != res[k].phases[1].bytes || res[k].weights != plan->weights)
        throw Fail{};
    }
    return plan;
  }
};

int ServePlan::regime(const ModelSpec& m, const Job& job) {
  if (!m.sliding.enabled() || job.seq + 1 < m.sliding.window) return 0;
  // a prompt of window - 1 tokens: the decode step's keys reach the window (its mask) and the
  // prompt's do not
  return job.seq >= m.sliding.window ? 1 : 2;
}

std::shared_ptr<const ServePlan> ServePlan::compile(const ModelSpec& m, const Job& job) {
  if (regime(m, job) == 2) return nullptr;  // one prompt length: the walk runs (no plan failed)
  try {
    return ServePlanBuilder::build(m, job);
  } catch (const Fail&) {
    g_failures.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
}

const ServePlan* ServePlan::cached(const ModelSpec& m, const Job& job) {
  return PlanCache<ServePlan>::mine().get(m, job, static_cast<std::uint64_t>(regime(m, job)), compile);
}

void ServePlan::clear_cache() noexcept { PlanCache<ServePlan>::mine().clear(); }

std::array<bytes_t, ServePlan::kPhases> ServePlan::evaluate(std::uint64_t b, std::uint64_t s) const {
  std::array<std::uint64_t, kMaxBasis> vals;
  std::array<bytes_t, kPhases> out{};
  if (!rows_.max_per_phase(b, s, vals.data(), out.data()))
    throw Error(ErrorKind::overflow, "serving bytes at batch " + std::to_string(b) + ", seq " + std::to_string(s) +
                                         ": a size does not fit in 64 bits");
  return out;
}

std::uint64_t serve_plan_failures() { return g_failures.load(std::memory_order_relaxed); }

}  // namespace membudget::detail
