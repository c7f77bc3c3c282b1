// src/model/plan_cache.hpp: each thread's compiled plans of one kind (StepPlan, ServePlan).
//
// Keyed by the (model, job) words with the batch and sequence replaced by the job's regime;
// nullptr records a step that does not compile (the caller simulates). The last lookup is
// remembered: a loop over one model and recipe compares keys instead of hashing one. At most
// kPlanLimit plans per kind and thread (256 unless the kind says), cleared when full.
#pragma once

#include <memory>
#include <unordered_map>
#include <unordered_set>

#include "job_key.hpp"

namespace membudget::detail {

template <class P, std::size_t Limit = 256>
struct PlanCache {
  static constexpr std::size_t kPlanLimit = Limit;
  std::unordered_map<Key, std::shared_ptr<const P>, KeyHash> table;
  std::unordered_set<Key, KeyHash> seen_once;  // get_on_second_use's regimes asked about once, not compiled
  Key last_key{};
  const P* last = nullptr;
  bool last_valid = false;

  static PlanCache& mine() {
    thread_local PlanCache c;
    return c;
  }
  void clear() noexcept {
    table.clear();
    seen_once.clear();
    last_valid = false;
  }
  // The plan for (m, job) in `regime`, compiled (after m.validate()) on first use.
  template <class Compile>
  const P* get(const ModelSpec& m, const Job& job, std::uint64_t regime, Compile&& compile) {
    const Key k = key(m, job, regime);
    if (last_valid && last_key == k) return last;
    const std::shared_ptr<const P>& plan = find_or_compile(k, m, job, compile);
    last_key = k;
    last = plan.get();
    last_valid = true;
    return last;
  }
  // The same, compiled when (m, job)'s regime is asked about a second time: nullptr the first time
  // too, and the caller answers that one question without a plan. For a plan whose compile costs
  // several direct answers (ReservedStream: four simulated steps where one answers a question), so
  // that a model and recipe asked about once (the CLI's predict, each stage of a pipeline) pays
  // for one. The regimes seen once are remembered up to 16 × kPlanLimit, then forgotten.
  template <class Compile>
  const P* get_on_second_use(const ModelSpec& m, const Job& job, std::uint64_t regime, Compile&& compile) {
    const Key k = key(m, job, regime);
    if (last_valid && last_key == k) return last;
    if (!table.contains(k)) {
      if (seen_once.size() >= 16 * kPlanLimit) seen_once.clear();
      if (seen_once.insert(k).second) return nullptr;
      seen_once.erase(k);
    }
    return get(m, job, regime, compile);
  }
  // Whether (m, job)'s regime has been compiled (or found not to compile), compiling nothing.
  bool holds(const ModelSpec& m, const Job& job, std::uint64_t regime) const { return table.contains(key(m, job, regime)); }
  // The same plan, shared: for a plan that holds others (a pipeline's stages), which must outlive
  // a clear() of this cache.
  template <class Compile>
  std::shared_ptr<const P> shared(const ModelSpec& m, const Job& job, std::uint64_t regime, Compile&& compile) {
    return find_or_compile(key(m, job, regime), m, job, compile);
  }

 private:
  static Key key(const ModelSpec& m, const Job& job, std::uint64_t regime) {
    Key k = key_of(m, job);
    k[kBatchWord] = 0;
    k[kSeqWord] = regime;
    return k;
  }
  template <class Compile>
  const std::shared_ptr<const P>& find_or_compile(const Key& k, const ModelSpec& m, const Job& job, Compile&& compile) {
    auto it = table.find(k);
    if (it == table.end()) {
      m.validate();
      auto plan = compile(m, job);
      if (table.size() >= kPlanLimit) clear();
      it = table.emplace(k, std::move(plan)).first;
    }
    return it->second;
  }
};

}  // namespace membudget::detail
