// The inventory of membudget's own synthetic step (profile "harness"), walked from its design.
//
// This follows docs/harness.md ("The step, allocation by allocation"), not the harness's buffer
// table (src/measure/harness_table.hpp): the two are written separately so that `membudget verify`
// compares two readings of one design and catches either being wrong. Every allocation is rounded
// as the caching allocator rounds it (512 B), and the walk keeps the live sum and each phase's peak.
//
// Recipes: fp32 (everything fp32); amp-bf16 (fp32 parameters, gradients and moments; bf16
// activations; a bf16 copy of every parameter made at the start of forward and freed at the end
// of backward); bf16 (everything bf16). Statistics (rmsnorm rstd, attention lse and delta, per-token
// losses) are fp32, token ids int32.
#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd_sim.hpp"
#include "fake_memory.hpp"
#include "measure/allocator.hpp"
#include "predictors.hpp"
#include "membudget/serving.hpp"

namespace membudget::detail {
namespace {

void reject(const std::string& what) { throw Error(ErrorKind::unsupported, "--profile harness: " + what); }

// The decoder the harness implements (both modes): a Llama-family layer.
void check_model_supported(const ModelSpec& m) {
  if (m.mlp != MlpKind::gated_silu) reject("the harness step has a SwiGLU MLP (mlp: gated_silu)");
  if (m.moe.enabled()) reject("the harness step has a dense MLP, not a mixture of experts");
  if (m.norm != NormKind::rmsnorm || m.norms_per_layer != 2) reject("the harness step has two RMSNorms per layer");
  if (m.qk_norm || m.final_logit_softcap != 0 || m.attn_logit_softcap != 0 || m.sliding.enabled() || m.mla.enabled())
    reject("qk_norm, logit soft-capping, sliding windows and MLA are not in the harness step");
  const ArchQuirks& q = m.quirks;
  if (q.fused_qkv || q.fused_gate_up || q.norm_weight_offset || q.embedding_scale || q.partial_rotary)
    reject("fused projections, Gemma's (1 + w) norms and embedding scale, and partial rotary are not in the harness step");
}

void check_supported(const ModelSpec& m, const Job& job) {
  check_model_supported(m);
  if (job.optimizer != Optimizer::adamw) reject("the harness step uses AdamW");
  if (job.recompute == Recompute::selective) reject("--recompute selective: the harness step has none and full");
  if (job.attention != Attention::flash) reject("--attention math: the harness step has flash-style attention");
  if (job.parallel.data != 1 || job.parallel.zero_stage != 0) reject("the harness step runs on one device");
}

struct Bytes {
  bytes_t param, grad, moment, act;
  bool copies;
  bytes_t master;  // bf16-master's fp32 copy per element (harness.cpp: made with the moments), else 0
};

// The recipe's element bytes (membudget::Recipe).
Bytes bytes_of(Precision p) {
  const Recipe r = recipe_of(p);
  return {element_size(r.param), element_size(r.grad), element_size(r.state), element_size(r.compute), r.autocast,
          r.master ? bytes_t{4} : 0};
}

// The harness's allocations replayed through a caching allocator with the policy the harness's
// allocator follows (c10's): `allocated` then counts what memory_allocated() counts, whole blocks,
// including the slack of a cached block that was not split because at most 1 MiB would have
// remained (a 3.5 MiB activation served from a 4 MiB block counts 4 MiB: docs/harness.md). A free
// releases the most recent live allocation of that name and size, which is the harness's
// buffer wherever the walk makes them in the harness's order (layer by layer, freed in reverse).
// One replay lives across the steps, as the harness's allocator does.
class AllocatorReplay {
 public:
  void alloc(const std::string& name, bytes_t logical) {
    live_[{name, logical}].push_back(alloc_.allocate_at(logical));
  }
  void free(const std::string& name, bytes_t logical) {
    auto it = live_.find({name, logical});
    if (it == live_.end() || it->second.empty())
      throw std::logic_error("harness walk: '" + name + "' freed but not allocated");  // a bug in the walk
    alloc_.deallocate_at(it->second.back());
    it->second.pop_back();
  }
  bytes_t allocated() const { return static_cast<bytes_t>(alloc_.stats().allocated.current); }

 private:
  FakeMemory mem_;
  measure::CachingAllocator alloc_{mem_};
  std::map<std::pair<std::string, bytes_t>, std::vector<measure::DeviceAddr>> live_;
};

// Live bytes (the replay's allocated bytes), the current phase's peak and (with explain) what is
// live there, by name.
class Walk {
 public:
  Walk(bool explain, AllocatorReplay& replay) : explain_(explain), replay_(replay) {}

  void add(const std::string& name, bytes_t logical, Term term, Role role) {
    replay_.alloc(name, logical);
    note(name, logical, term, role);
    if (!phases_.empty() && live() > phases_.back().bytes) {
      phases_.back().bytes = live();
      if (explain_) {
        phases_.back().live.clear();
        for (const auto& [_, g] : groups_)
          if (g.count) phases_.back().live.push_back(g);
      }
    }
  }
  // A tensor a previous step left live (in the replay already): named for the explain lists only.
  void note(const std::string& name, bytes_t logical, Term term, Role role) {
    const bytes_t b = round512(logical);
    if (explain_) {
      auto [it, fresh] = groups_.try_emplace(name);
      auto& e = it->second;
      if (fresh) {
        e.name = name;
        e.op = "harness";
        e.count = 0;
      }
      e.term = term;
      e.role = role;
      e.count += 1;
      e.bytes += b;
    }
  }
  void sub(const std::string& name, bytes_t logical) {
    const bytes_t b = round512(logical);
    replay_.free(name, logical);
    if (explain_) {
      auto& e = groups_[name];
      e.count -= 1;
      e.bytes -= b;
    }
  }
  void add(const std::string& name, bytes_t logical, Term term) { add(name, logical, term, default_role(term)); }
  void phase(Phase phase) {
    PhasePeak p;
    p.phase = phase;
    p.bytes = live();
    if (explain_)
      for (const auto& [_, g] : groups_)
        if (g.count) p.live.push_back(g);
    phases_.push_back(std::move(p));
  }
  bytes_t live() const { return replay_.allocated(); }
  std::vector<PhasePeak> take() { return std::move(phases_); }

 private:
  bool explain_;
  AllocatorReplay& replay_;
  std::map<std::string, TensorBytes> groups_;
  std::vector<PhasePeak> phases_;
};

struct Step {
  const ModelSpec& m;
  const Job& job;
  Bytes by;
  bytes_t B, S, T, h, I, V, a, qd, kvd, L, c;
  std::vector<bytes_t> params;  // element counts of the parameter tensors
  bool full_recompute;

  bytes_t Th() const { return T * h; }
  bytes_t TI() const { return T * I; }

  // The tensors of one layer's forward, in the order the layer makes them; `until_act` is the
  // recompute pass, which stops once silu(gate)·up exists.
  void layer_forward(Walk& w, bool until_act) const {
    const bytes_t C = by.act;
    w.add("layers.*.ln1", Th() * C, Term::activations);
    w.add("layers.*.ln1_rstd", T * 4, Term::activations);
    w.add("layers.*.q", T * qd * C, Term::activations);
    w.add("layers.*.k", T * kvd * C, Term::activations);
    w.add("layers.*.v", T * kvd * C, Term::activations);
    w.add("layers.*.att", T * qd * C, Term::activations);
    w.add("layers.*.lse", B * a * S * 4, Term::activations);
    w.add("layers.*.attproj", Th() * C, Term::activations);
    w.add("layers.*.res1", Th() * C, Term::activations);
    w.sub("layers.*.attproj", Th() * C);
    w.add("layers.*.ln2", Th() * C, Term::activations);
    w.add("layers.*.ln2_rstd", T * 4, Term::activations);
    w.add("layers.*.gate", TI() * C, Term::activations);
    w.add("layers.*.up", TI() * C, Term::activations);
    w.add("layers.*.act", TI() * C, Term::activations);
    if (until_act) return;
    w.add("layers.*.mlpout", Th() * C, Term::activations);
    w.add("residual stream x", Th() * C, Term::activations);
    w.sub("layers.*.mlpout", Th() * C);
    if (full_recompute) drop_layer_saved(w);
  }

  void drop_layer_saved(Walk& w) const {
    const bytes_t C = by.act;
    w.sub("layers.*.ln1", Th() * C);
    w.sub("layers.*.ln1_rstd", T * 4);
    w.sub("layers.*.q", T * qd * C);
    w.sub("layers.*.k", T * kvd * C);
    w.sub("layers.*.v", T * kvd * C);
    w.sub("layers.*.att", T * qd * C);
    w.sub("layers.*.lse", B * a * S * 4);
    w.sub("layers.*.res1", Th() * C);
    w.sub("layers.*.ln2", Th() * C);
    w.sub("layers.*.ln2_rstd", T * 4);
    w.sub("layers.*.gate", TI() * C);
    w.sub("layers.*.up", TI() * C);
    w.sub("layers.*.act", TI() * C);
  }

  void forward(Walk& w) const {
    const bytes_t C = by.act;
    if (by.copies)
      for (bytes_t n : params) w.add("bf16 weight copies", n * 2, Term::model_states);
    w.add("residual stream x", Th() * C, Term::activations);  // embedding output
    for (bytes_t l = 0; l < L; ++l) layer_forward(w, false);
    w.add("final norm output", Th() * C, Term::activations);
    w.add("final norm rstd", T * 4, Term::activations);
    w.add("per-token losses", T * 4, Term::logits_loss);
    if (job.loss == Loss::full) {
      w.add("logits", T * V * C, Term::logits_loss);
    } else {
      w.add("logits of one chunk", c * V * C, Term::logits_loss);
      w.sub("logits of one chunk", c * V * C);
    }
    w.sub("per-token losses", T * 4);
  }

  void layer_backward(Walk& w) const {
    const bytes_t C = by.act;
    if (full_recompute) layer_forward(w, true);
    // MLP
    w.add("dact", TI() * C, Term::activations);
    w.sub("layers.*.act", TI() * C);
    w.add("dgate, dup", TI() * C, Term::activations);
    w.add("dgate, dup", TI() * C, Term::activations);
    w.sub("dact", TI() * C);
    w.sub("layers.*.gate", TI() * C);
    w.sub("layers.*.up", TI() * C);
    w.add("dln", Th() * C, Term::activations);
    w.sub("dgate, dup", TI() * C);
    w.sub("dgate, dup", TI() * C);
    w.sub("layers.*.ln2", Th() * C);
    w.sub("dln", Th() * C);
    w.sub("layers.*.res1", Th() * C);
    w.sub("layers.*.ln2_rstd", T * 4);
    // attention
    w.add("datt", T * qd * C, Term::activations);
    w.add("dq, dk, dv", T * qd * C, Term::activations);
    w.add("dq, dk, dv", T * kvd * C, Term::activations);
    w.add("dq, dk, dv", T * kvd * C, Term::activations);
    w.add("attention delta", B * a * S * 4, Term::activations);
    w.sub("attention delta", B * a * S * 4);
    w.sub("datt", T * qd * C);
    w.sub("layers.*.att", T * qd * C);
    w.sub("layers.*.lse", B * a * S * 4);
    w.sub("layers.*.q", T * qd * C);
    w.sub("layers.*.k", T * kvd * C);
    w.sub("layers.*.v", T * kvd * C);
    w.add("dln", Th() * C, Term::activations);
    w.sub("dq, dk, dv", T * qd * C);
    w.sub("dq, dk, dv", T * kvd * C);
    w.sub("dq, dk, dv", T * kvd * C);
    w.sub("layers.*.ln1", Th() * C);
    w.sub("dln", Th() * C);
    w.sub("layers.*.ln1_rstd", T * 4);
    w.sub("residual stream x", Th() * C);
  }

  void backward(Walk& w, bool first) const {
    const bytes_t C = by.act;
    if (first)
      for (bytes_t n : params) w.add("parameter gradients", n * by.grad, Term::model_states, Role::gradient);
    if (job.loss == Loss::full) {
      w.add("dln", Th() * C, Term::activations);  // the logits' gradient overwrites the logits
      w.sub("logits", T * V * C);
    } else {
      w.add("dln", Th() * C, Term::activations);
      w.add("logits of one chunk", c * V * C, Term::logits_loss);  // recomputed, then its gradient in place
      w.sub("logits of one chunk", c * V * C);
    }
    w.sub("final norm output", Th() * C);
    w.add("dres (residual gradient)", Th() * C, Term::activations);
    w.sub("dln", Th() * C);
    w.sub("final norm rstd", T * 4);
    w.sub("residual stream x", Th() * C);
    for (bytes_t l = 0; l < L; ++l) layer_backward(w);
    w.sub("dres (residual gradient)", Th() * C);
    if (by.copies)
      for (bytes_t n : params) w.sub("bf16 weight copies", n * 2);
  }

  bytes_t sum(bytes_t per_elem) const {
    bytes_t s = 0;
    for (bytes_t n : params) s = checked_add(s, round512(checked_mul(n, per_elem, "parameter bytes")), "parameters");
    return s;
  }
};

// Elements of each parameter tensor, in the order the harness allocates them (harness_buffer.hpp):
// the embedding, the decoder layers, the final norm, an untied lm_head.
std::vector<bytes_t> parameter_tensors(const ModelSpec& m) {
  const auto outer = m.outer_tensors();
  std::vector<bytes_t> p{outer.front().elements()};
  for (std::uint64_t il = 0; il < m.num_layers; ++il)
    for (const ParamTensor& t : m.layer_tensors(il)) p.push_back(t.elements());
  for (std::size_t i = 1; i < outer.size(); ++i) p.push_back(outer[i].elements());
  return p;
}

}  // namespace

// ---- inference mode (docs/harness.md, "Inference mode") ----

namespace {

void check_supported_infer(const ModelSpec& m, const Job& job) {
  check_model_supported(m);
  if (job.weights != DType::bf16 && job.weights != DType::fp32)
    reject(std::string("--mode infer --weights ") + to_string(job.weights) + ": the harness serves bf16 or fp32 weights");
  if (job.kv_dtype != DType::bf16 && job.kv_dtype != DType::fp32)
    reject(std::string("--mode infer --kv-dtype ") + to_string(job.kv_dtype) + ": the harness's KV pool is bf16 or fp32");
  if (job.parallel.tensor != 1 || job.parallel.pipeline != 1 || job.parallel.data != 1 || job.parallel.zero_stage != 0)
    reject("the harness step runs on one device");
}

// One forward of `T` = batch × new tokens, nothing kept but the pool: each buffer dies as soon as
// the op that reads it last has run. e: weight/activation bytes.
void infer_forward(Walk& w, bytes_t Bt, bytes_t T, bytes_t h, bytes_t I, bytes_t V, bytes_t qd, bytes_t kvd,
                   bytes_t L, bytes_t e) {
  const bytes_t Th = T * h * e, TI = T * I * e, st = T * 4;
  w.add("token ids", T * 4, Term::other, Role::input);
  w.add("hidden states x", Th, Term::activations);
  w.sub("token ids", T * 4);
  for (bytes_t l = 0; l < L; ++l) {
    w.add("input norm output", Th, Term::activations);
    w.add("norm rstd", st, Term::activations);
    w.sub("norm rstd", st);
    w.add("q", T * qd * e, Term::activations);
    w.add("new keys, values", T * kvd * e, Term::activations);
    w.add("new keys, values", T * kvd * e, Term::activations);
    w.sub("input norm output", Th);
    w.sub("new keys, values", T * kvd * e);  // copied into the pool
    w.sub("new keys, values", T * kvd * e);
    w.add("attention output", T * qd * e, Term::activations);
    w.sub("q", T * qd * e);
    w.add("o projection", Th, Term::activations);
    w.sub("attention output", T * qd * e);
    w.add("residual after attention", Th, Term::activations);
    w.sub("o projection", Th);
    w.sub("hidden states x", Th);
    w.add("post-attention norm output", Th, Term::activations);
    w.add("norm rstd", st, Term::activations);
    w.sub("norm rstd", st);
    w.add("gate, up", TI, Term::activations);
    w.add("gate, up", TI, Term::activations);
    w.sub("post-attention norm output", Th);
    w.add("silu(gate)·up", TI, Term::activations);
    w.sub("gate, up", TI);
    w.sub("gate, up", TI);
    w.add("down projection", Th, Term::activations);
    w.sub("silu(gate)·up", TI);
    w.add("hidden states x", Th, Term::activations);
    w.sub("residual after attention", Th);
    w.sub("down projection", Th);
  }
  w.add("last positions", Bt * h * e, Term::activations);
  w.sub("hidden states x", Th);
  w.add("final norm output", Bt * h * e, Term::activations);
  w.add("norm rstd", Bt * 4, Term::activations);
  w.sub("norm rstd", Bt * 4);
  w.sub("last positions", Bt * h * e);
  w.add("logits (last position)", Bt * V * e, Term::logits_loss);
  w.sub("final norm output", Bt * h * e);
  w.sub("logits (last position)", Bt * V * e);  // read back to the host for the greedy token
}

}  // namespace

void predict_harness_infer(Budget& b, const PredictOptions& options) {
  const ModelSpec& m = b.model;
  const Job& job = b.job;
  check_supported_infer(m, job);
  const bytes_t e = job.weights == DType::fp32 ? 4 : 2;
  const bytes_t kve = kv_dtype_bytes(job.kv_dtype);
  const bytes_t B = job.batch, S = job.seq, P = checked_add(S, 1, "pool tokens");
  const bytes_t T = checked_mul(B, S, "tokens");
  const bytes_t h = m.hidden_size, I = m.intermediate_size, V = m.vocab_size, L = m.num_layers;
  const bytes_t qd = m.q_dim(), kvd = m.kv_dim();
  checked_product("harness prefill", T, std::max({V, I, qd, h}), 4);
  checked_product("harness KV pool", B, P, kvd, kve);

  AllocatorReplay replay;
  Walk w(options.explain, replay);
  bytes_t weights = 0;
  for (bytes_t n : parameter_tensors(m)) {
    w.add("weights", n * e, Term::model_states, Role::parameter);
    weights += round512(n * e);
  }
  const bytes_t per_buffer = B * P * kvd * kve;  // one K or V buffer of one layer
  for (bytes_t l = 0; l < 2 * L; ++l) w.add("KV pool", per_buffer, Term::kv_cache, Role::kv_cache);
  w.phase(Phase::floor);
  w.phase(Phase::prefill_peak);
  infer_forward(w, B, T, h, I, V, qd, kvd, L, e);
  w.phase(Phase::decode_peak);
  infer_forward(w, B, B, h, I, V, qd, kvd, L, e);
  b.phases = w.take();
  b.step0.clear();

  b.states.weights = weights;
  b.terms.kv_cache = kv_cache_bytes(m, job.kv_dtype, B, P);  // exactly the pool's requested bytes
  b.logits = {};
  b.logits.logits = round512(B * V * e);
  b.activations = {};
  const bytes_t floor = b.phase(Phase::floor), pre = b.phase(Phase::prefill_peak);
  b.activations.other = pre > floor ? pre - floor : 0;
}

void predict_harness(Budget& b, const PredictOptions& options) {
  const ModelSpec& m = b.model;
  const Job& job = b.job;
  check_supported(m, job);
  Step st{m, job, bytes_of(job.precision), job.batch, job.seq, 0, m.hidden_size, m.intermediate_size,
          m.vocab_size, m.num_heads, m.q_dim(), m.kv_dim(), m.num_layers, 0, parameter_tensors(m),
          job.recompute == Recompute::full};
  st.T = checked_mul(job.batch, job.seq, "tokens");
  st.c = std::min<bytes_t>(job.loss_chunk, st.T);
  // guard every product the walk forms against overflow once, at its largest
  checked_product("harness logits", st.T, std::max(st.V, st.I), 4);

  const bytes_t weights = st.sum(st.by.param), grads = st.sum(st.by.grad), moments = 2 * st.sum(st.by.moment);
  const bytes_t master = st.by.master ? st.sum(st.by.master) : 0;

  // Step 0, then two steady steps through one allocator replay, as the harness runs them: the
  // second steady step is the one predicted (the first can still place blocks otherwise, finding
  // the cache as step 0 left it).
  AllocatorReplay replay;
  for (int pass = 0; pass < 3; ++pass) {
    const bool first = pass == 0;
    Walk w(options.explain, replay);
    for (bytes_t n : st.params)
      first ? w.add("parameters", n * st.by.param, Term::model_states, Role::parameter)
            : w.note("parameters", n * st.by.param, Term::model_states, Role::parameter);
    if (!first) {  // what step 0 left allocated: the gradients, the moments (and the master copy)
      for (bytes_t n : st.params) w.note("parameter gradients", n * st.by.grad, Term::model_states, Role::gradient);
      for (bytes_t n : st.params) {
        w.note("adamw moments", n * st.by.moment, Term::model_states, Role::optimizer_state);
        w.note("adamw moments", n * st.by.moment, Term::model_states, Role::optimizer_state);
        if (st.by.master) w.note("master weights (fp32)", n * st.by.master, Term::model_states, Role::master_weight);
      }
    }
    w.add("tokens, targets", st.T * 4, Term::other, Role::input);
    w.add("tokens, targets", st.T * 4, Term::other, Role::input);
    w.phase(Phase::floor);
    w.phase(Phase::forward_peak);
    st.forward(w);
    if (!first) {
      // what the forward leaves for backward, by term
      const bytes_t C = st.by.act;
      bytes_t per_layer = 0;
      std::vector<TensorBytes> lt;
      auto row = [&](const char* name, const char* shape, const char* dtype, bytes_t bytes) {
        lt.push_back({name, "harness", dtype, shape, 1, round512(bytes), Term::activations});
        per_layer += round512(bytes);
      };
      const char* an = C == 4 ? "fp32" : "bf16";
      row("layers.*.x (layer output)", "T·h", an, st.Th() * C);
      if (!st.full_recompute) {
        row("layers.*.ln1", "T·h", an, st.Th() * C);
        row("layers.*.ln1_rstd", "T", "fp32", st.T * 4);
        row("layers.*.q", "T·a·hd", an, st.T * st.qd * C);
        row("layers.*.k", "T·kv·hd", an, st.T * st.kvd * C);
        row("layers.*.v", "T·kv·hd", an, st.T * st.kvd * C);
        row("layers.*.att", "T·a·hd", an, st.T * st.qd * C);
        row("layers.*.lse", "B·a·S", "fp32", st.B * st.a * st.S * 4);
        row("layers.*.res1", "T·h", an, st.Th() * C);
        row("layers.*.ln2", "T·h", an, st.Th() * C);
        row("layers.*.ln2_rstd", "T", "fp32", st.T * 4);
        row("layers.*.gate", "T·I", an, st.TI() * C);
        row("layers.*.up", "T·I", an, st.TI() * C);
        row("layers.*.act", "T·I", an, st.TI() * C);
      }
      b.activations.per_layer = per_layer;
      b.activations.layers = st.L;
      b.activations.layer_tensors = std::move(lt);
      const bytes_t x0 = round512(st.Th() * C), lnf = round512(st.Th() * C), rstd = round512(st.T * 4);
      b.activations.other = x0 + lnf + rstd;
      b.activations.other_tensors = {{"embedding output (x[0])", "embedding", an, "T·h", 1, x0, Term::activations},
                                     {"final norm output and rstd", "rmsnorm", an, "T·h + T", 1, lnf + rstd, Term::activations}};
      b.logits = {};
      b.logits.logits = round512((job.loss == Loss::full ? st.T : st.c) * st.V * C);
    }
    w.phase(Phase::backward_peak);
    st.backward(w, first);
    w.phase(Phase::optimizer_peak);
    if (first)
      for (bytes_t n : st.params) {
        w.add("adamw moments", n * st.by.moment, Term::model_states, Role::optimizer_state);
        w.add("adamw moments", n * st.by.moment, Term::model_states, Role::optimizer_state);
        if (st.by.master) w.add("master weights (fp32)", n * st.by.master, Term::model_states, Role::master_weight);
      }
    w.sub("tokens, targets", st.T * 4);  // the step's end
    w.sub("tokens, targets", st.T * 4);
    // floor (nothing is allocated between it and the forward), forward, backward, optimizer peaks
    (first ? b.step0 : b.phases) = w.take();
  }
  b.states.weights = weights;
  b.states.gradients = grads;
  b.states.optimizer = moments;
  b.states.master = master;
  b.autocast_cache = st.by.copies ? st.sum(2) : 0;
}

}  // namespace membudget::detail
