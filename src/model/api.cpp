// The scheduler-facing API: memoized estimates, fit, searches and sweeps (include/membudget/api.hpp).
#include "membudget/api.hpp"

#include <bit>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "korthikanti.hpp"
#include "step_plan.hpp"

namespace membudget {
namespace {

// Phase names with static storage (Estimate never owns a string).
const char* intern_phase(std::string_view name) {
  static const char* const known[] = {"floor",        "forward_peak",       "backward_peak",       "optimizer_peak",
                                      "prefill_peak", "decode_peak",        "step0.floor",         "step0.forward_peak",
                                      "step0.backward_peak", "step0.optimizer_peak", "step0.prefill_peak",
                                      "step0.decode_peak"};
  for (const char* k : known)
    if (name == k) return k;
  return "other";
}

// Every field that can change a number (the family selects Gemma's norms and Phi-3's fused
// projections; the name changes nothing).
constexpr std::size_t kKeyWords = 48;
constexpr std::size_t kBatchWord = 0, kSeqWord = 1;  // where key_of puts job.batch and job.seq
using Key = std::array<std::uint64_t, kKeyWords>;

Key key_of(const ModelSpec& m, const Job& j) {
  Key k{};
  std::size_t i = 0;
  auto put = [&](std::uint64_t v) { k[i++] = v; };
  put(j.batch); put(j.seq);  // words kBatchWord and kSeqWord
  put(m.vocab_size); put(m.hidden_size); put(m.intermediate_size); put(m.num_layers); put(m.num_heads);
  put(m.num_kv_heads); put(m.head_dim); put(m.tied_embeddings); put(static_cast<std::uint64_t>(m.mlp));
  put(static_cast<std::uint64_t>(m.norm)); put(m.bias.qkv | (m.bias.o << 1) | (m.bias.mlp << 2));
  put(m.max_positions); put(m.norms_per_layer); put(m.qk_norm); put(std::bit_cast<std::uint64_t>(m.final_logit_softcap));
  put(m.sliding.window); put(m.sliding.every_nth); put(m.mla.kv_lora_rank); put(m.mla.qk_rope_head_dim);
  put(m.mla.q_lora_rank); put(m.mla.qk_nope_head_dim); put(m.mla.v_head_dim);
  put(static_cast<std::uint64_t>(j.mode)); put(static_cast<std::uint64_t>(j.precision));
  put(static_cast<std::uint64_t>(j.optimizer)); put(static_cast<std::uint64_t>(j.recompute));
  put(static_cast<std::uint64_t>(j.attention)); put(static_cast<std::uint64_t>(j.loss)); put(j.loss_chunk);
  put(static_cast<std::uint64_t>(j.activations)); put(static_cast<std::uint64_t>(j.profile));
  put(j.parallel.tensor); put(j.parallel.pipeline); put(j.parallel.data);
  put(static_cast<std::uint64_t>(j.parallel.zero_stage)); put(j.parallel.sequence_parallel);
  put(j.overhead.has_value()); put(j.overhead.value_or(0)); put(static_cast<std::uint64_t>(j.kv_dtype));
  put(static_cast<std::uint64_t>(j.weights)); put(j.group_size);
  put(std::hash<std::string_view>{}(m.family));
  return k;
}

struct KeyHash {
  std::size_t operator()(const Key& k) const noexcept {
    // Four independent multiply-xor lanes (a serial chain over 48 words costs more than a plan's
    // evaluation), mixed at the end.
    std::uint64_t h[4] = {0x9e3779b97f4a7c15ull, 0xbf58476d1ce4e5b9ull, 0x94d049bb133111ebull, 0x2545f4914f6cdd1dull};
    for (std::size_t i = 0; i < kKeyWords; i += 4)
      for (std::size_t l = 0; l < 4; ++l) h[l] = (h[l] ^ k[i + l]) * 0xff51afd7ed558ccdull;
    std::uint64_t x = h[0] ^ (h[1] >> 17) ^ (h[2] << 23) ^ (h[3] >> 31);
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return static_cast<std::size_t>(x ^ (x >> 29));
  }
};
static_assert(kKeyWords % 4 == 0);

constexpr std::size_t kCacheLimit = 65536;
constexpr std::size_t kPlanLimit = 256;

// Compiled training steps (src/model/step_plan.hpp), per thread: (model, job without its batch and
// sequence, regime) → plan; nullptr records a step that does not compile (the memo path serves it).
using PlanPtr = std::shared_ptr<const detail::StepPlan>;
std::unordered_map<Key, PlanPtr, KeyHash>& plans() {
  thread_local std::unordered_map<Key, PlanPtr, KeyHash> table;
  return table;
}

bool plan_applies(const Job& j) {
  return j.mode == Mode::train && j.profile == Profile::torch && j.parallel.tensor == 1 && j.parallel.pipeline == 1;
}

// The last plan this thread used: a scheduler's loop asks about one model and recipe many times
// in a row, and comparing keys is cheaper than hashing one.
struct LastPlan {
  Key key{};
  const detail::StepPlan* plan = nullptr;
  bool valid = false;
};
LastPlan& last_plan() {
  thread_local LastPlan last;
  return last;
}

// The plan for a validated job, compiled on first use; nullptr when it does not compile.
const detail::StepPlan* plan_for(const ModelSpec& m, const Job& j) {
  Key k = key_of(m, j);
  k[kBatchWord] = 0;
  k[kSeqWord] = static_cast<std::uint64_t>(detail::StepPlan::regime(j));
  LastPlan& last = last_plan();
  if (last.valid && last.key == k) return last.plan;
  auto& table = plans();
  auto it = table.find(k);
  if (it == table.end()) {
    m.validate();
    PlanPtr p = detail::StepPlan::compile(m, j);
    if (table.size() >= kPlanLimit) table.clear();
    it = table.emplace(k, std::move(p)).first;
  }
  last.key = k;
  last.plan = it->second.get();
  last.valid = true;
  return last.plan;
}

// The Estimate that summarize(predict(m, j)) gives, from a plan.
Estimate from_plan(const detail::StepPlan& plan, const ModelSpec& m, const Job& j) {
  const auto r = plan.evaluate(j.batch, j.seq);
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
  const auto& names = detail::StepPlan::phase_names();
  e.n_phases = e.n_step0 = detail::StepPlan::kPhases;
  for (std::size_t p = 0; p < detail::StepPlan::kPhases; ++p) {
    e.phases[p] = {names[p], r.steady[p]};
    if (r.steady[p] > e.peak) {
      e.peak = r.steady[p];
      e.peak_phase = names[p];
    }
  }
  static const char* const step0_names[] = {"step0.floor", "step0.forward_peak", "step0.backward_peak",
                                            "step0.optimizer_peak"};
  for (std::size_t p = 0; p < detail::StepPlan::kPhases; ++p) {
    e.step0[p] = {names[p], r.step0[p]};
    if (r.step0[p] > e.peak) {
      e.peak = r.step0[p];
      e.peak_phase = step0_names[p];
    }
  }
  e.required = checked_add(e.peak, e.overhead, "peak + overhead");
  return e;
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
    if (e.n_phases < e.phases.size()) e.phases[e.n_phases++] = {intern_phase(p.name), p.bytes};
  for (const auto& p : b.step0)
    if (e.n_step0 < e.step0.size()) e.step0[e.n_step0++] = {intern_phase(p.name), p.bytes};
  return e;
}

Estimate estimate(const ModelSpec& model, const Job& job) {
  if (plan_applies(job)) {
    job.validate();
    if (const detail::StepPlan* plan = plan_for(model, job)) return from_plan(*plan, model, job);
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
  plans().clear();
  last_plan().valid = false;
}

bytes_t usable_bytes(const Device& device, double headroom) {
  if (!(headroom >= 0.0 && headroom < 1.0))
    throw Error(ErrorKind::invalid_argument, "headroom: must be in [0, 1), e.g. 0.05 for 5%");
  if (device.capacity == 0) throw Error(ErrorKind::invalid_argument, "device capacity must be positive");
  // The largest integer r with r ≤ capacity · (1 − headroom), as check_fit compares in doubles.
  const double lim = static_cast<double>(device.capacity) * (1.0 - headroom);
  bytes_t r = static_cast<bytes_t>(lim);
  while (r > 0 && static_cast<double>(r) > lim) --r;
  while (static_cast<double>(r + 1) <= lim && r + 1 <= device.capacity) ++r;
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

FitResult fits(const ModelSpec& model, const Job& job, const Device& device, double headroom) {
  FitResult f;
  f.capacity = device.capacity;
  f.limit = usable_bytes(device, headroom);
  f.estimate = estimate(model, job);
  f.required = f.estimate.required;
  f.fits = f.required <= f.limit;
  return f;
}

MaxBatchResult max_micro_batch(const ModelSpec& model, Job job, const Device& device, const SearchOptions& o) {
  MaxBatchResult r;
  r.limit = usable_bytes(device, o.headroom);
  if (o.data_parallel == 0) throw Error(ErrorKind::invalid_argument, "data_parallel: must be at least 1");
  if (o.global_batch && o.global_batch % o.data_parallel)
    throw Error(ErrorKind::invalid_argument, "--global-batch: " + std::to_string(o.global_batch) +
                                                 " is not a multiple of the data-parallel size " +
                                                 std::to_string(o.data_parallel));
  std::uint64_t hi_limit = o.limit ? o.limit : 65536;
  if (job.seq) hi_limit = std::min<std::uint64_t>(hi_limit, std::max<std::uint64_t>(1, (1ull << 32) / job.seq));
  auto ok = [&](std::uint64_t b, Estimate* out) {
    job.batch = b;
    ++r.evaluations;
    auto e = try_estimate(model, job);
    if (!e) return false;
    if (out) *out = *e;
    return e->required <= r.limit;
  };
  // The smallest point: a bad spec or job is an error here (not "does not fit").
  Estimate best;
  job.batch = 1;
  try {
    best = estimate(model, job);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::overflow) throw;
    return r;
  }
  ++r.evaluations;
  r.at_max = best;
  if (best.required > r.limit) return r;
  const std::uint64_t lo = largest_fitting(hi_limit, ok, best);
  r.max_micro_batch = lo;
  r.at_max = best;
  if (o.global_batch) {
    const std::uint64_t per_rank = o.global_batch / o.data_parallel;
    std::uint64_t mb = std::min(lo, per_rank);
    while (mb > 1 && per_rank % mb) --mb;
    r.accum_micro_batch = mb;
    r.grad_accum_steps = per_rank / mb;
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
  auto ok = [&](std::uint64_t k, Estimate* out) {
    job.seq = k * step;
    ++r.evaluations;
    auto e = try_estimate(model, job);
    if (!e) return false;
    if (out) *out = *e;
    return e->required <= r.limit;
  };
  if (kmax == 0) return r;
  Estimate best;
  job.seq = step;
  try {
    best = estimate(model, job);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::overflow) throw;
    return r;
  }
  ++r.evaluations;
  r.at_max = best;
  if (best.required > r.limit) return r;
  const std::uint64_t lo = largest_fitting(kmax, ok, best);
  r.max_seq = lo * step;
  r.at_max = best;
  return r;
}

std::vector<SweepPoint> sweep(const ModelSpec& model, const Job& base, const SweepGrid& grid,
                              const std::optional<Device>& device, double headroom) {
  model.validate();
  const bytes_t limit = device ? usable_bytes(*device, headroom) : 0;
  const std::vector<std::uint64_t> batches = grid.batches.empty() ? std::vector<std::uint64_t>{base.batch} : grid.batches;
  const std::vector<std::uint64_t> seqs = grid.seqs.empty() ? std::vector<std::uint64_t>{base.seq} : grid.seqs;
  const std::vector<Precision> precisions =
      grid.precisions.empty() ? std::vector<Precision>{base.precision} : grid.precisions;
  const std::vector<Recompute> recomputes =
      grid.recomputes.empty() ? std::vector<Recompute>{base.recompute} : grid.recomputes;
  std::vector<SweepPoint> out;
  out.reserve(batches.size() * seqs.size() * precisions.size() * recomputes.size());
  Job j = base;
  for (Precision p : precisions)
    for (Recompute rc : recomputes)
      for (std::uint64_t s : seqs)
        for (std::uint64_t b : batches) {
          SweepPoint pt;
          pt.batch = b;
          pt.seq = s;
          pt.precision = p;
          pt.recompute = rc;
          j.batch = b;
          j.seq = s;
          j.precision = p;
          j.recompute = rc;
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
  return out;
}

void set_job_option(Job& j, std::string_view key, std::string_view value) {
  std::string k(key);
  for (char& c : k)
    if (c == '_') c = '-';
  const std::string v(value);
  auto count = [&](const char* opt) {
    if (v.empty() || v.size() > 19 || v.find_first_not_of("0123456789") != std::string::npos)
      throw Error(ErrorKind::invalid_job, std::string(opt) + ": '" + v + "' is not a positive integer");
    return static_cast<std::uint64_t>(std::stoull(v));
  };
  if (k == "batch") j.batch = count("--batch");
  else if (k == "seq") j.seq = count("--seq");
  else if (k == "mode") j.mode = parse_mode(v);
  else if (k == "precision") j.precision = parse_precision(v);
  else if (k == "optimizer") j.optimizer = parse_optimizer(v);
  else if (k == "recompute") j.recompute = parse_recompute(v);
  else if (k == "attention") j.attention = parse_attention(v);
  else if (k == "loss") j.loss = parse_loss(v);
  else if (k == "loss-chunk") j.loss_chunk = count("--loss-chunk");
  else if (k == "activations") j.activations = parse_activation_model(v);
  else if (k == "profile") j.profile = parse_profile(v);
  else if (k == "overhead") j.overhead = parse_bytes(v, "--overhead");
  else if (k == "kv-dtype") j.kv_dtype = parse_dtype(v, "--kv-dtype");
  else if (k == "weights") j.weights = parse_dtype(v, "--weights");
  else if (k == "group-size") j.group_size = count("--group-size");
  else
    throw Error(ErrorKind::invalid_argument,
                "unknown job option '" + std::string(key) +
                    "' (batch, seq, mode, precision, optimizer, recompute, attention, loss, loss-chunk, activations, "
                    "profile, overhead, kv-dtype, weights, group-size)");
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
