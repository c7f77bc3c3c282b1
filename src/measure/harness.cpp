// The synthetic step: forward, backward and AdamW of a Llama-family decoder on a Backend.
#include "measure/harness.hpp"

#include "measure/harness_buffer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <thread>

namespace membudget::measure {
namespace {

constexpr std::size_t kLeakBytes = 4096;

struct Param {
  std::string name;
  std::size_t n = 0;
  Init init = Init::normal;
  Buffer w, g, m, v, copy, master;
  View use() const { return copy ? copy.view() : w.view(); }  // what the kernels read
};

}  // namespace

void check_harness_supported(const ModelSpec& m, const Job& job) {
  auto no = [](const std::string& what) {
    throw Error(ErrorKind::unsupported, "harness: " + what);
  };
  if (job.mode != Mode::train) no("--mode infer: the harness runs a training step");
  if (m.mlp != MlpKind::gated_silu) no(std::string("mlp ") + to_string(m.mlp) + ": the harness implements SwiGLU (gated_silu)");
  if (m.norm != NormKind::rmsnorm) no("norm layernorm: the harness implements RMSNorm");
  if (m.norms_per_layer != 2) no("norms_per_layer " + std::to_string(m.norms_per_layer) + ": the harness has 2 norms per layer");
  if (m.qk_norm) no("qk_norm: not implemented by the harness");
  if (m.final_logit_softcap != 0) no("final_logit_softcap: not implemented by the harness");
  if (m.sliding.enabled()) no("sliding-window attention: not implemented by the harness");
  if (m.mla.enabled()) no("latent attention (MLA): not implemented by the harness");
  if (m.head_dim % 2 != 0) no("head_dim must be even for rotary embedding");
  if (job.optimizer != Optimizer::adamw) no(std::string("--optimizer ") + to_string(job.optimizer) + ": the harness implements adamw");
  if (job.recompute == Recompute::selective) no("--recompute selective: the harness implements none and full");
  if (job.attention != Attention::flash) no("--attention math: the harness implements flash-style attention only");
  const std::uint64_t T = job.batch * job.seq;
  if (T * std::max(m.vocab_size, m.intermediate_size) > (1ull << 31))
    no("the batch is too large for the harness's 32-bit kernel indices");
}

HarnessDims harness_dims(const ModelSpec& m, const Job& job) {
  HarnessDims d{};
  d.B = job.batch;
  d.S = job.seq;
  d.T = job.batch * job.seq;
  d.h = m.hidden_size;
  d.I = m.intermediate_size;
  d.V = m.vocab_size;
  d.a = m.num_heads;
  d.kv = m.num_kv_heads;
  d.hd = m.head_dim;
  d.L = m.num_layers;
  d.c = std::min<std::uint64_t>(job.loss_chunk, d.T);
  return d;
}

struct Harness::Impl {
  ModelSpec m;
  Job job;
  Backend& be;
  CachingAllocator& alloc;
  HarnessOptions opt;
  HarnessDims d;
  // The job's recipe: amp-bf16's autocast means bf16 copies of every parameter for the forward and
  // backward; bf16-master keeps an fp32 copy of every parameter beside the bf16 one, made with the
  // moments at the first optimizer step, which AdamW updates and rounds into the bf16 parameter.
  Recipe r;
  std::vector<Param> params;
  std::vector<LayerParams> lp;
  int emb = -1, lnf_w = -1, lm_head = -1;
  bool grads_ready = false, moments_ready = false;
  int step_index = 0;
  int adam_steps = 0;
  std::string phase = "init";
  std::vector<std::int32_t> host_tokens, host_targets;

  // activations: per layer [layer][Buf], the residual stream x[0..L], and step-scoped buffers
  std::vector<std::vector<Buffer>> lay;
  std::vector<Buffer> xs;
  std::vector<Buffer> g;  // indexed by Buf (step scope)
  std::vector<Buffer> leaks;
  std::vector<PhaseMark> marks;

  Impl(const ModelSpec& model, const Job& j, Backend& b, CachingAllocator& a, HarnessOptions o)
      : m(model), job(j), be(b), alloc(a), opt(o), d(harness_dims(model, j)), r(recipe_of(j.precision)) {}

  // ---- allocation ----
  DType dtype_of(Elem e) const { return e == Elem::act ? r.compute : DType::fp32; }
  static std::size_t elem_bytes(Elem e, DType act) { return e == Elem::act ? element_bytes(act) : 4; }

  Buffer make(std::size_t bytes, DType dt, const std::string& tensor, const char* op) {
    return make_buffer(alloc, bytes, dt, tensor, op, phase, step_index);
  }

  // A buffer of the table; `layer` names it ("layers.3.q"), -1 for step-scoped rows.
  Buffer make(Buf b, int layer, const char* op) {
    const BufRow& row = row_of(b);
    const std::size_t bytes = checked_mul(row.numel(d), elem_bytes(row.elem, r.compute), row.name);
    std::string name = layer < 0 ? std::string(row.name) : "layers." + std::to_string(layer) + "." + row.name;
    return make(bytes, dtype_of(row.elem), name, op);
  }
  Buffer& L(int l, Buf b) { return lay[l][static_cast<std::size_t>(b)]; }
  Buffer& G(Buf b) { return g[static_cast<std::size_t>(b)]; }

  // ---- parameters ----
  View W(int i) const { return i < 0 ? View{} : params[i].use(); }
  View dW(int i) const { return i < 0 ? View{} : params[i].g.view(); }

  void build_params() {
    // Parameters draw normals from one splitmix64 stream in order. The stream is a counter (the
    // k-th draw depends only on seed + k·golden), so each tensor is filled by several threads with
    // exactly the values a sequential loop would give: an 8B model initialises in seconds.
    Rng rng{opt.seed};
    ParamLayout layout = build_decoder_params(m, be, params, r.param, opt.seed, rng, [&](std::size_t bytes, const std::string& name) {
      return make(bytes, r.param, name, "parameter");
    });
    emb = layout.emb;
    lp = std::move(layout.layers);
    lnf_w = layout.lnf_w;
    lm_head = layout.lm_head;
    // the fixed batch: random tokens, each target the next token of its sequence
    host_tokens.resize(d.T);
    host_targets.resize(d.T);
    for (auto& t : host_tokens) t = static_cast<std::int32_t>(rng.next() % d.V);
    for (std::size_t b = 0; b < d.B; ++b)
      for (std::size_t s = 0; s < d.S; ++s) {
        const std::size_t t = b * d.S + s;
        host_targets[t] = s + 1 < d.S ? host_tokens[t + 1] : host_tokens[b * d.S];
      }
  }

  // ---- phases ----
  AttnShape attn_shape() const {
    return {static_cast<int>(d.B), static_cast<int>(d.S), static_cast<int>(d.a), static_cast<int>(d.kv),
            static_cast<int>(d.hd)};
  }

  // ---- forward ----
  // One decoder layer from x[l]. With `recompute` (backward of recompute full) it stops once the
  // buffers the layer's backward reads exist: the down projection and the output are not needed.
  void layer_forward(int l, bool recompute) {
    const auto& p = lp[l];
    const int T = static_cast<int>(d.T), h = static_cast<int>(d.h), I = static_cast<int>(d.I);
    const int qd = static_cast<int>(d.qd()), kvd = static_cast<int>(d.kvd());
    View x = xs[l].view();
    L(l, Buf::ln1) = make(Buf::ln1, l, "rmsnorm_forward");
    L(l, Buf::ln1_rstd) = make(Buf::ln1_rstd, l, "rmsnorm_forward");
    be.rmsnorm_forward(L(l, Buf::ln1).view(), L(l, Buf::ln1_rstd).f32(), x, W(p.ln1), T, h, opt.norm_eps);
    L(l, Buf::q) = make(Buf::q, l, "matmul_forward");
    be.matmul_forward(L(l, Buf::q).view(), L(l, Buf::ln1).view(), W(p.q), W(p.qb), T, h, qd);
    L(l, Buf::k) = make(Buf::k, l, "matmul_forward");
    be.matmul_forward(L(l, Buf::k).view(), L(l, Buf::ln1).view(), W(p.k), W(p.kb), T, h, kvd);
    L(l, Buf::v) = make(Buf::v, l, "matmul_forward");
    be.matmul_forward(L(l, Buf::v).view(), L(l, Buf::ln1).view(), W(p.v), W(p.vb), T, h, kvd);
    be.rotary_forward(L(l, Buf::q).view(), static_cast<int>(d.B), static_cast<int>(d.S), static_cast<int>(d.a),
                      static_cast<int>(d.hd), opt.rope_theta);
    be.rotary_forward(L(l, Buf::k).view(), static_cast<int>(d.B), static_cast<int>(d.S), static_cast<int>(d.kv),
                      static_cast<int>(d.hd), opt.rope_theta);
    L(l, Buf::att) = make(Buf::att, l, "attention_forward");
    L(l, Buf::lse) = make(Buf::lse, l, "attention_forward");
    be.attention_forward(L(l, Buf::att).view(), L(l, Buf::lse).f32(), L(l, Buf::q).view(), L(l, Buf::k).view(),
                         L(l, Buf::v).view(), attn_shape());
    L(l, Buf::attproj) = make(Buf::attproj, l, "matmul_forward");
    be.matmul_forward(L(l, Buf::attproj).view(), L(l, Buf::att).view(), W(p.o), W(p.ob), T, qd, h);
    L(l, Buf::res1) = make(Buf::res1, l, "residual_forward");
    be.residual_forward(L(l, Buf::res1).view(), x, L(l, Buf::attproj).view(), d.T * d.h);
    L(l, Buf::attproj).reset();
    L(l, Buf::ln2) = make(Buf::ln2, l, "rmsnorm_forward");
    L(l, Buf::ln2_rstd) = make(Buf::ln2_rstd, l, "rmsnorm_forward");
    be.rmsnorm_forward(L(l, Buf::ln2).view(), L(l, Buf::ln2_rstd).f32(), L(l, Buf::res1).view(), W(p.ln2), T, h,
                       opt.norm_eps);
    L(l, Buf::gate) = make(Buf::gate, l, "matmul_forward");
    be.matmul_forward(L(l, Buf::gate).view(), L(l, Buf::ln2).view(), W(p.gate), W(p.gb), T, h, I);
    L(l, Buf::up) = make(Buf::up, l, "matmul_forward");
    be.matmul_forward(L(l, Buf::up).view(), L(l, Buf::ln2).view(), W(p.up), W(p.ub), T, h, I);
    L(l, Buf::act) = make(Buf::act, l, "swiglu_forward");
    be.swiglu_forward(L(l, Buf::act).view(), L(l, Buf::gate).view(), L(l, Buf::up).view(), d.T * d.I);
    if (recompute) return;
    L(l, Buf::mlpout) = make(Buf::mlpout, l, "matmul_forward");
    be.matmul_forward(L(l, Buf::mlpout).view(), L(l, Buf::act).view(), W(p.down), W(p.db), T, I, h);
    xs[l + 1] = make(Buf::x, l + 1, "residual_forward");
    be.residual_forward(xs[l + 1].view(), L(l, Buf::res1).view(), L(l, Buf::mlpout).view(), d.T * d.h);
    L(l, Buf::mlpout).reset();
    if (job.recompute == Recompute::full)  // only the layer input (x[l]) stays: the checkpoint
      for (Buf b : kLayerForward)
        if (row_of(b).rule == Rule::recomputed) L(l, b).reset();
  }

  float forward() {
    const int T = static_cast<int>(d.T), h = static_cast<int>(d.h), V = static_cast<int>(d.V);
    if (r.autocast)  // the autocast analogue: bf16 copies of every parameter, made per forward
      for (auto& p : params) {
        p.copy = make(p.n * 2, DType::bf16, p.name + " (bf16 copy)", "cast");
        be.cast(p.copy.view(), p.w.view(), p.n);
      }
    xs[0] = make(Buf::x, 0, "embedding_forward");
    be.embedding_forward(xs[0].view(), G(Buf::tokens).i32(), W(emb), T, h);
    for (int l = 0; l < static_cast<int>(d.L); ++l) layer_forward(l, false);
    G(Buf::lnf) = make(Buf::lnf, -1, "rmsnorm_forward");
    G(Buf::lnf_rstd) = make(Buf::lnf_rstd, -1, "rmsnorm_forward");
    be.rmsnorm_forward(G(Buf::lnf).view(), G(Buf::lnf_rstd).f32(), xs[d.L].view(), W(lnf_w), T, h, opt.norm_eps);
    G(Buf::losses) = make(Buf::losses, -1, "cross_entropy_forward");
    if (job.loss == Loss::full) {
      G(Buf::logits) = make(Buf::logits, -1, "matmul_forward");
      be.matmul_forward(G(Buf::logits).view(), G(Buf::lnf).view(), W(lm_head), View{}, T, h, V);
      be.cross_entropy_forward(G(Buf::losses).f32(), G(Buf::logits).view(), G(Buf::targets).i32(), T, V);
    } else {
      G(Buf::logits_chunk) = make(Buf::logits_chunk, -1, "matmul_forward");
      for (std::uint64_t t0 = 0; t0 < d.T; t0 += d.c) {
        const int n = static_cast<int>(std::min(d.c, d.T - t0));
        be.matmul_forward(G(Buf::logits_chunk).view(), rows(G(Buf::lnf).view(), t0, d.h), W(lm_head), View{}, n, h, V);
        be.cross_entropy_forward(G(Buf::losses).f32() + t0, G(Buf::logits_chunk).view(), G(Buf::targets).i32() + t0,
                                 n, V);
      }
      G(Buf::logits_chunk).reset();
    }
    std::vector<float> losses(d.T);
    be.copy_to_host(losses.data(), G(Buf::losses).f32(), d.T * 4);
    G(Buf::losses).reset();
    return static_cast<float>(std::accumulate(losses.begin(), losses.end(), 0.0) / static_cast<double>(d.T));
  }

  // ---- backward ----
  void layer_backward(int l) {
    const auto& p = lp[l];
    const int T = static_cast<int>(d.T), h = static_cast<int>(d.h), I = static_cast<int>(d.I);
    const int qd = static_cast<int>(d.qd()), kvd = static_cast<int>(d.kvd());
    if (job.recompute == Recompute::full) layer_forward(l, true);
    View dres = G(Buf::dres).view();  // d(layer output) on entry, d(layer input) on exit
    // MLP: x[l+1] = res1 + down(silu(gate) · up)
    G(Buf::dact) = make(Buf::dact, l, "matmul_backward");
    be.matmul_backward(G(Buf::dact).view(), false, dW(p.down), dW(p.db), dres, L(l, Buf::act).view(), W(p.down), T, I, h);
    L(l, Buf::act).reset();
    G(Buf::dgate) = make(Buf::dgate, l, "swiglu_backward");
    G(Buf::dup) = make(Buf::dup, l, "swiglu_backward");
    be.swiglu_backward(G(Buf::dgate).view(), G(Buf::dup).view(), G(Buf::dact).view(), L(l, Buf::gate).view(),
                       L(l, Buf::up).view(), d.T * d.I);
    G(Buf::dact).reset();
    L(l, Buf::gate).reset();
    L(l, Buf::up).reset();
    G(Buf::dln) = make(Buf::dln, l, "matmul_backward");
    be.matmul_backward(G(Buf::dln).view(), false, dW(p.gate), dW(p.gb), G(Buf::dgate).view(), L(l, Buf::ln2).view(),
                       W(p.gate), T, h, I);
    be.matmul_backward(G(Buf::dln).view(), true, dW(p.up), dW(p.ub), G(Buf::dup).view(), L(l, Buf::ln2).view(),
                       W(p.up), T, h, I);
    G(Buf::dgate).reset();
    G(Buf::dup).reset();
    L(l, Buf::ln2).reset();
    be.rmsnorm_backward(dres, true, dW(p.ln2), G(Buf::dln).view(), L(l, Buf::res1).view(), W(p.ln2),
                        L(l, Buf::ln2_rstd).f32(), T, h);
    G(Buf::dln).reset();
    L(l, Buf::res1).reset();
    L(l, Buf::ln2_rstd).reset();
    // attention: res1 = x + o(attention(rotary(q(ln1)), rotary(k(ln1)), v(ln1)))
    G(Buf::datt) = make(Buf::datt, l, "matmul_backward");
    be.matmul_backward(G(Buf::datt).view(), false, dW(p.o), dW(p.ob), dres, L(l, Buf::att).view(), W(p.o), T, qd, h);
    G(Buf::dq) = make(Buf::dq, l, "attention_backward");
    G(Buf::dk) = make(Buf::dk, l, "attention_backward");
    G(Buf::dv) = make(Buf::dv, l, "attention_backward");
    G(Buf::delta) = make(Buf::delta, l, "attention_backward");
    be.attention_backward(G(Buf::dq).view(), G(Buf::dk).view(), G(Buf::dv).view(), G(Buf::delta).f32(),
                          G(Buf::datt).view(), L(l, Buf::q).view(), L(l, Buf::k).view(), L(l, Buf::v).view(),
                          L(l, Buf::att).view(), L(l, Buf::lse).f32(), attn_shape());
    G(Buf::delta).reset();
    G(Buf::datt).reset();
    for (Buf b : {Buf::att, Buf::lse, Buf::q, Buf::k, Buf::v}) L(l, b).reset();
    be.rotary_backward(G(Buf::dq).view(), static_cast<int>(d.B), static_cast<int>(d.S), static_cast<int>(d.a),
                       static_cast<int>(d.hd), opt.rope_theta);
    be.rotary_backward(G(Buf::dk).view(), static_cast<int>(d.B), static_cast<int>(d.S), static_cast<int>(d.kv),
                       static_cast<int>(d.hd), opt.rope_theta);
    G(Buf::dln) = make(Buf::dln, l, "matmul_backward");
    const View ln1 = L(l, Buf::ln1).view();
    be.matmul_backward(G(Buf::dln).view(), false, dW(p.q), dW(p.qb), G(Buf::dq).view(), ln1, W(p.q), T, h, qd);
    be.matmul_backward(G(Buf::dln).view(), true, dW(p.k), dW(p.kb), G(Buf::dk).view(), ln1, W(p.k), T, h, kvd);
    be.matmul_backward(G(Buf::dln).view(), true, dW(p.v), dW(p.vb), G(Buf::dv).view(), ln1, W(p.v), T, h, kvd);
    G(Buf::dq).reset();
    G(Buf::dk).reset();
    G(Buf::dv).reset();
    L(l, Buf::ln1).reset();
    be.rmsnorm_backward(dres, true, dW(p.ln1), G(Buf::dln).view(), xs[l].view(), W(p.ln1), L(l, Buf::ln1_rstd).f32(),
                        T, h);
    G(Buf::dln).reset();
    L(l, Buf::ln1_rstd).reset();
    xs[l].reset();
  }

  void backward() {
    const int T = static_cast<int>(d.T), h = static_cast<int>(d.h), V = static_cast<int>(d.V);
    if (!grads_ready) {
      for (auto& p : params) p.g = make(p.n * element_bytes(r.grad), r.grad, p.name + ".grad", "gradient");
      grads_ready = true;
    }
    for (auto& p : params) be.zero(p.g.view(), p.n);
    const float dloss = 1.0f / static_cast<float>(d.T);  // the loss is the mean over tokens
    if (job.loss == Loss::full) {
      be.cross_entropy_backward(G(Buf::logits).view(), G(Buf::logits).view(), G(Buf::targets).i32(), dloss, T, V);
      G(Buf::dln) = make(Buf::dln, -1, "matmul_backward");
      be.matmul_backward(G(Buf::dln).view(), false, dW(lm_head), View{}, G(Buf::logits).view(), G(Buf::lnf).view(),
                         W(lm_head), T, h, V);
      G(Buf::logits).reset();
    } else {
      G(Buf::dln) = make(Buf::dln, -1, "matmul_backward");
      G(Buf::logits_chunk) = make(Buf::logits_chunk, -1, "matmul_forward");
      const View lc = G(Buf::logits_chunk).view();
      for (std::uint64_t t0 = 0; t0 < d.T; t0 += d.c) {
        const int n = static_cast<int>(std::min(d.c, d.T - t0));
        const View x = rows(G(Buf::lnf).view(), t0, d.h);
        be.matmul_forward(lc, x, W(lm_head), View{}, n, h, V);
        be.cross_entropy_backward(lc, lc, G(Buf::targets).i32() + t0, dloss, n, V);
        be.matmul_backward(rows(G(Buf::dln).view(), t0, d.h), false, dW(lm_head), View{}, lc, x, W(lm_head), n, h, V);
      }
      G(Buf::logits_chunk).reset();
    }
    G(Buf::lnf).reset();
    G(Buf::dres) = make(Buf::dres, -1, "rmsnorm_backward");
    be.rmsnorm_backward(G(Buf::dres).view(), false, dW(lnf_w), G(Buf::dln).view(), xs[d.L].view(), W(lnf_w),
                        G(Buf::lnf_rstd).f32(), T, h);
    G(Buf::dln).reset();
    G(Buf::lnf_rstd).reset();
    xs[d.L].reset();
    for (int l = static_cast<int>(d.L) - 1; l >= 0; --l) layer_backward(l);
    be.embedding_backward(dW(emb), G(Buf::tokens).i32(), G(Buf::dres).view(), T, h);
    G(Buf::dres).reset();
    for (auto& p : params) p.copy.reset();
  }

  void optimizer() {
    if (!moments_ready) {
      for (auto& p : params) {
        p.m = make(p.n * element_bytes(r.state), r.state, p.name + ".exp_avg", "adamw state");
        be.zero(p.m.view(), p.n);
        p.v = make(p.n * element_bytes(r.state), r.state, p.name + ".exp_avg_sq", "adamw state");
        be.zero(p.v.view(), p.n);
        if (r.master) {  // the fp32 master copy starts as the parameter's values
          p.master = make(p.n * 4, DType::fp32, p.name + ".master", "master weights");
          be.cast(p.master.view(), p.w.view(), p.n);
        }
      }
      moments_ready = true;
    }
    std::vector<AdamWTensor> ts;
    ts.reserve(params.size());
    for (auto& p : params)
      ts.push_back({p.w.view(), p.g.view(), p.m.view(), p.v.view(), p.n, p.init == Init::normal,
                    p.master ? p.master.view() : View{}});
    be.adamw(ts, opt.adamw, ++adam_steps);
  }

  StepMeasure step() {
    StepMeasure sm;
    sm.index = step_index;
    const auto t0 = std::chrono::steady_clock::now();
    phase = "step";
    G(Buf::tokens) = make(Buf::tokens, -1, "input");
    G(Buf::targets) = make(Buf::targets, -1, "input");
    be.copy_to_device(G(Buf::tokens).i32(), host_tokens.data(), d.T * 4);
    be.copy_to_device(G(Buf::targets).i32(), host_targets.data(), d.T * 4);
    {
      PhaseScope<Impl> s(*this, "forward", &sm.forward_peak, &sm.reserved_peak);
      sm.floor = static_cast<bytes_t>(alloc.stats().allocated.current);
      sm.loss = forward();
    }
    {
      PhaseScope<Impl> s(*this, "backward", &sm.backward_peak, &sm.reserved_peak);
      backward();
    }
    {
      PhaseScope<Impl> s(*this, "optimizer", &sm.optimizer_peak, &sm.reserved_peak);
      optimizer();
    }
    phase = "step";
    G(Buf::tokens).reset();
    G(Buf::targets).reset();
    if (opt.leak_per_step) leaks.push_back(make(kLeakBytes, DType::fp32, "debug leak", "leak_per_step"));
    marks.push_back({step_index, "end", alloc.history().size()});
    sm.allocated_end = static_cast<bytes_t>(alloc.stats().allocated.current);
    be.synchronize();
    sm.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++step_index;
    return sm;
  }

  // Buffers die before the parameters (reverse order of creation, roughly as a program would).
  void release_all() {
    for (auto& row : lay)
      for (auto& b : row) b.reset();
    for (auto& b : xs) b.reset();
    for (auto& b : g) b.reset();
    leaks.clear();
    params.clear();
  }
};

Harness::Harness(const ModelSpec& model, const Job& job, Backend& backend, CachingAllocator& allocator,
                 HarnessOptions options) {
  model.validate();
  job.validate();
  check_harness_supported(model, job);
  impl_ = std::make_unique<Impl>(model, job, backend, allocator, options);
  auto& I = *impl_;
  I.lay.resize(I.d.L);
  for (auto& row : I.lay) row.resize(static_cast<std::size_t>(Buf::count));
  I.xs.resize(I.d.L + 1);
  I.g.resize(static_cast<std::size_t>(Buf::count));
  try {
    I.build_params();
  } catch (...) {
    I.release_all();
    throw;
  }
}

Harness::~Harness() {
  if (impl_) impl_->release_all();
}

StepMeasure Harness::step() {
  try {
    return impl_->step();
  } catch (...) {
    // a failed step leaves no half-built activations behind
    for (auto& row : impl_->lay)
      for (auto& b : row) b.reset();
    for (auto& b : impl_->xs) b.reset();
    for (auto& b : impl_->g) b.reset();
    for (auto& p : impl_->params) p.copy.reset();
    throw;
  }
}

const HarnessDims& Harness::dims() const { return impl_->d; }
const std::vector<PhaseMark>& Harness::marks() const { return impl_->marks; }
std::uint64_t Harness::parameter_tensors() const { return impl_->params.size(); }

std::string Harness::parameter_name(std::size_t i) const { return impl_->params.at(i).name; }

std::vector<float> Harness::gradient(std::size_t i) const {
  const Param& p = impl_->params.at(i);
  if (!p.g) throw Error(ErrorKind::invalid_argument, "Harness::gradient: no backward has run yet");
  std::vector<float> out(p.n);
  if (impl_->r.grad == DType::fp32) {
    impl_->be.copy_to_host(out.data(), p.g.view().data, p.n * 4);
  } else {
    std::vector<std::uint16_t> bits(p.n);
    impl_->be.copy_to_host(bits.data(), p.g.view().data, p.n * 2);
    for (std::size_t k = 0; k < p.n; ++k) {
      const std::uint32_t u = static_cast<std::uint32_t>(bits[k]) << 16;
      std::memcpy(&out[k], &u, 4);
    }
  }
  return out;
}

}  // namespace membudget::measure
