// The inference step: weights, a KV pool, a prefill and one decode step on a Backend.
#include "measure/harness_infer.hpp"

#include <algorithm>
#include <cstring>

#include "measure/harness_buffer.hpp"

namespace membudget::measure {
namespace {

constexpr std::size_t kLeakBytes = 4096;

struct IParam {
  std::string name;
  std::size_t n = 0;
  Init init = Init::normal;
  Buffer w;
};

DType weights_dtype(const Job& job) {
  if (job.weights == DType::bf16 || job.weights == DType::fp32) return job.weights;
  throw Error(ErrorKind::unsupported, std::string("harness --mode infer: --weights ") + to_string(job.weights) +
                                          ": the harness serves bf16 or fp32 weights");
}

DType kv_dtype(const Job& job) {
  if (job.kv_dtype == DType::bf16 || job.kv_dtype == DType::fp32) return job.kv_dtype;
  throw Error(ErrorKind::unsupported, std::string("harness --mode infer: --kv-dtype ") + to_string(job.kv_dtype) +
                                          ": the harness's KV pool is bf16 or fp32");
}

float bf16_to_float(std::uint16_t bits) {
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

void check_harness_infer_supported(const ModelSpec& m, const Job& job) {
  // the model limits are the training harness's; the training knobs do not apply
  Job t = job;
  t.mode = Mode::train;
  t.precision = Precision::fp32;
  t.optimizer = Optimizer::adamw;
  t.recompute = Recompute::none;
  t.attention = Attention::flash;
  // the training step's index limit counts T × vocab logits; inference has logits for the last
  // positions only (B × vocab) and its widest (T, ·) activation is the MLP's
  t.batch = 1;
  t.seq = 1;
  try {
    check_harness_supported(m, t);
  } catch (const Error& e) {
    throw Error(e.kind(), std::string(e.what()) + " (--mode infer)");
  }
  weights_dtype(job);
  kv_dtype(job);
  if (job.seq + 1 > (1ull << 30)) throw Error(ErrorKind::unsupported, "harness --mode infer: --seq is too long");
  const std::uint64_t T = job.batch * job.seq;
  const std::uint64_t widest = std::max({m.intermediate_size, m.hidden_size, m.num_heads * m.head_dim});
  if (T * widest > (1ull << 31) || job.batch * m.vocab_size > (1ull << 31))
    throw Error(ErrorKind::unsupported, "harness: the batch is too large for the harness's 32-bit kernel indices (--mode infer)");
}

InferDims harness_infer_dims(const ModelSpec& m, const Job& job) {
  InferDims d{};
  d.B = job.batch;
  d.S = job.seq;
  d.T = job.batch * job.seq;
  d.P = job.seq + 1;
  d.h = m.hidden_size;
  d.I = m.intermediate_size;
  d.V = m.vocab_size;
  d.a = m.num_heads;
  d.kv = m.num_kv_heads;
  d.hd = m.head_dim;
  d.L = m.num_layers;
  return d;
}

struct InferHarness::Impl {
  ModelSpec m;
  Job job;
  Backend& be;
  CachingAllocator& alloc;
  InferOptions opt;
  InferDims d;  // the prefill's
  DType wdt, kvdt;
  std::vector<IParam> params;
  std::vector<LayerParams> lp;
  int emb = -1, lnf_w = -1, lm_head = -1;
  std::vector<Buffer> kpool, vpool;
  std::vector<std::int32_t> prompt;
  std::vector<Buffer> live;  // activations of the forward in flight, indexed by IBuf
  std::vector<Buffer> leaks;
  std::vector<PhaseMark> marks;
  std::string phase = "init";
  int step_index = 0;

  Impl(const ModelSpec& model, const Job& j, Backend& b, CachingAllocator& a, InferOptions o)
      : m(model), job(j), be(b), alloc(a), opt(std::move(o)), d(harness_infer_dims(model, j)), wdt(weights_dtype(j)),
        kvdt(kv_dtype(j)) {
    live.resize(static_cast<std::size_t>(IBuf::count));
  }

  DType dtype_of(IElem e) const {
    switch (e) {
      case IElem::act: return wdt;
      case IElem::kv: return kvdt;
      default: return DType::fp32;  // i32 buffers are never read as a View
    }
  }
  std::size_t elem_bytes(IElem e) const {
    return e == IElem::act ? element_bytes(wdt) : (e == IElem::kv ? element_bytes(kvdt) : 4);
  }

  Buffer make(std::size_t bytes, DType dt, const std::string& tensor, const char* op) {
    return make_buffer(alloc, bytes, dt, tensor, op, phase, step_index);
  }

  // A buffer of the table for a forward of dims `fd`; `layer` names it ("layers.3.q"), -1 for the head.
  Buffer make(IBuf b, const InferDims& fd, int layer, const char* op) {
    const IBufRow& row = row_of(b);
    const std::size_t bytes = checked_mul(row.numel(fd), elem_bytes(row.elem), row.name);
    std::string name = layer < 0 ? std::string(row.name) : "layers." + std::to_string(layer) + "." + row.name;
    return make(bytes, dtype_of(row.elem), name, op);
  }
  Buffer& A(IBuf b) { return live[static_cast<std::size_t>(b)]; }
  void drop(IBuf b) { A(b).reset(); }

  // ---- weights and pool ----
  View W(int i) const { return i < 0 ? View{} : params[i].w.view(); }

  void build() {
    // The values of one sequential splitmix64 stream, drawn by counter on several threads as the
    // training harness does (an 8B model initialises in seconds, not minutes).
    Rng rng{opt.seed};
    ParamLayout layout = build_decoder_params(m, be, params, wdt, opt.seed, rng, [&](std::size_t bytes, const std::string& name) {
      return make(bytes, wdt, name, "weight");
    });
    emb = layout.emb;
    lp = std::move(layout.layers);
    lnf_w = layout.lnf_w;
    lm_head = layout.lm_head;
    for (std::size_t l = 0; l < d.L; ++l) {
      kpool.push_back(make(IBuf::k_pool, d, static_cast<int>(l), "kv pool"));
      be.zero(kpool.back().view(), d.B * d.P * d.kvd());
      vpool.push_back(make(IBuf::v_pool, d, static_cast<int>(l), "kv pool"));
      be.zero(vpool.back().view(), d.B * d.P * d.kvd());
    }
    if (!opt.prompt.empty()) {
      if (opt.prompt.size() != d.T)
        throw Error(ErrorKind::invalid_argument, "harness --mode infer: the prompt must hold batch × seq token ids");
      for (auto t : opt.prompt)
        if (t < 0 || static_cast<std::uint64_t>(t) >= d.V)
          throw Error(ErrorKind::invalid_argument, "harness --mode infer: a prompt token is outside the vocabulary");
      prompt = opt.prompt;
    } else {
      prompt.resize(d.T);
      for (auto& t : prompt) t = static_cast<std::int32_t>(rng.next() % d.V);
    }
  }

  // ---- one forward: S new tokens per sequence after `past` cached ones ----
  std::vector<float> forward(const std::vector<std::int32_t>& tokens, std::uint64_t S, std::uint64_t past) {
    InferDims fd = d;
    fd.S = S;
    fd.T = d.B * S;
    const int B = static_cast<int>(fd.B), T = static_cast<int>(fd.T), h = static_cast<int>(d.h);
    const int I = static_cast<int>(d.I), V = static_cast<int>(d.V), qd = static_cast<int>(d.qd());
    const int kvd = static_cast<int>(d.kvd()), Si = static_cast<int>(S), pi = static_cast<int>(past);
    const int P = static_cast<int>(d.P);
    const AttnShape as{B, Si, static_cast<int>(d.a), static_cast<int>(d.kv), static_cast<int>(d.hd)};

    A(IBuf::tokens) = make(IBuf::tokens, fd, -1, "input");
    be.copy_to_device(A(IBuf::tokens).i32(), tokens.data(), fd.T * 4);
    A(IBuf::x) = make(IBuf::x, fd, 0, "embedding_forward");
    be.embedding_forward(A(IBuf::x).view(), A(IBuf::tokens).i32(), W(emb), T, h);
    drop(IBuf::tokens);
    for (int l = 0; l < static_cast<int>(d.L); ++l) {
      const LayerParams& p = lp[l];
      A(IBuf::ln1) = make(IBuf::ln1, fd, l, "rmsnorm_forward");
      A(IBuf::ln1_rstd) = make(IBuf::ln1_rstd, fd, l, "rmsnorm_forward");
      be.rmsnorm_forward(A(IBuf::ln1).view(), A(IBuf::ln1_rstd).f32(), A(IBuf::x).view(), W(p.ln1), T, h, opt.norm_eps);
      drop(IBuf::ln1_rstd);
      A(IBuf::q) = make(IBuf::q, fd, l, "matmul_forward");
      be.matmul_forward(A(IBuf::q).view(), A(IBuf::ln1).view(), W(p.q), W(p.qb), T, h, qd);
      A(IBuf::k) = make(IBuf::k, fd, l, "matmul_forward");
      be.matmul_forward(A(IBuf::k).view(), A(IBuf::ln1).view(), W(p.k), W(p.kb), T, h, kvd);
      A(IBuf::v) = make(IBuf::v, fd, l, "matmul_forward");
      be.matmul_forward(A(IBuf::v).view(), A(IBuf::ln1).view(), W(p.v), W(p.vb), T, h, kvd);
      drop(IBuf::ln1);
      be.rotary_forward_at(A(IBuf::q).view(), B, Si, as.heads, as.head_dim, opt.rope_theta, pi);
      be.rotary_forward_at(A(IBuf::k).view(), B, Si, as.kv_heads, as.head_dim, opt.rope_theta, pi);
      // keys and values into the pool: rows past … past+S−1 of each sequence
      for (std::uint64_t b = 0; b < d.B; ++b) {
        be.cast(rows(kpool[l].view(), b * d.P + past, d.kvd()), rows(A(IBuf::k).view(), b * S, d.kvd()), S * d.kvd());
        be.cast(rows(vpool[l].view(), b * d.P + past, d.kvd()), rows(A(IBuf::v).view(), b * S, d.kvd()), S * d.kvd());
      }
      drop(IBuf::k);
      drop(IBuf::v);
      A(IBuf::att) = make(IBuf::att, fd, l, "attention_forward_cached");
      be.attention_forward_cached(A(IBuf::att).view(), A(IBuf::q).view(), kpool[l].view(), vpool[l].view(), as, pi, P);
      drop(IBuf::q);
      A(IBuf::attproj) = make(IBuf::attproj, fd, l, "matmul_forward");
      be.matmul_forward(A(IBuf::attproj).view(), A(IBuf::att).view(), W(p.o), W(p.ob), T, qd, h);
      drop(IBuf::att);
      A(IBuf::res1) = make(IBuf::res1, fd, l, "residual_forward");
      be.residual_forward(A(IBuf::res1).view(), A(IBuf::x).view(), A(IBuf::attproj).view(), fd.T * d.h);
      drop(IBuf::attproj);
      drop(IBuf::x);
      A(IBuf::ln2) = make(IBuf::ln2, fd, l, "rmsnorm_forward");
      A(IBuf::ln2_rstd) = make(IBuf::ln2_rstd, fd, l, "rmsnorm_forward");
      be.rmsnorm_forward(A(IBuf::ln2).view(), A(IBuf::ln2_rstd).f32(), A(IBuf::res1).view(), W(p.ln2), T, h,
                         opt.norm_eps);
      drop(IBuf::ln2_rstd);
      A(IBuf::gate) = make(IBuf::gate, fd, l, "matmul_forward");
      be.matmul_forward(A(IBuf::gate).view(), A(IBuf::ln2).view(), W(p.gate), W(p.gb), T, h, I);
      A(IBuf::up) = make(IBuf::up, fd, l, "matmul_forward");
      be.matmul_forward(A(IBuf::up).view(), A(IBuf::ln2).view(), W(p.up), W(p.ub), T, h, I);
      drop(IBuf::ln2);
      A(IBuf::act) = make(IBuf::act, fd, l, "swiglu_forward");
      be.swiglu_forward(A(IBuf::act).view(), A(IBuf::gate).view(), A(IBuf::up).view(), fd.T * d.I);
      drop(IBuf::gate);
      drop(IBuf::up);
      A(IBuf::mlpout) = make(IBuf::mlpout, fd, l, "matmul_forward");
      be.matmul_forward(A(IBuf::mlpout).view(), A(IBuf::act).view(), W(p.down), W(p.db), T, I, h);
      drop(IBuf::act);
      Buffer next = make(IBuf::x, fd, l + 1, "residual_forward");
      be.residual_forward(next.view(), A(IBuf::res1).view(), A(IBuf::mlpout).view(), fd.T * d.h);
      A(IBuf::x) = std::move(next);
      drop(IBuf::res1);
      drop(IBuf::mlpout);
    }
    // the head, on the last position of each sequence only
    A(IBuf::last) = make(IBuf::last, fd, -1, "cast (gather)");
    for (std::uint64_t b = 0; b < d.B; ++b)
      be.cast(rows(A(IBuf::last).view(), b, d.h), rows(A(IBuf::x).view(), b * S + S - 1, d.h), d.h);
    drop(IBuf::x);
    A(IBuf::lnf) = make(IBuf::lnf, fd, -1, "rmsnorm_forward");
    A(IBuf::lnf_rstd) = make(IBuf::lnf_rstd, fd, -1, "rmsnorm_forward");
    be.rmsnorm_forward(A(IBuf::lnf).view(), A(IBuf::lnf_rstd).f32(), A(IBuf::last).view(), W(lnf_w), B, h,
                       opt.norm_eps);
    drop(IBuf::lnf_rstd);
    drop(IBuf::last);
    A(IBuf::logits) = make(IBuf::logits, fd, -1, "matmul_forward");
    be.matmul_forward(A(IBuf::logits).view(), A(IBuf::lnf).view(), W(lm_head), View{}, B, h, V);
    drop(IBuf::lnf);
    std::vector<float> out(d.B * d.V);
    if (wdt == DType::fp32) {
      be.copy_to_host(out.data(), A(IBuf::logits).view().data, out.size() * 4);
    } else {
      std::vector<std::uint16_t> bits(out.size());
      be.copy_to_host(bits.data(), A(IBuf::logits).view().data, bits.size() * 2);
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_float(bits[i]);
    }
    drop(IBuf::logits);
    return out;
  }

  InferStep step() {
    InferStep st;
    StepMeasure& sm = st.measure;
    sm.index = step_index;
    {
      PhaseScope<Impl> s(*this, "prefill", &sm.prefill_peak, &sm.reserved_peak);
      sm.floor = static_cast<bytes_t>(alloc.stats().allocated.current);
      st.prefill_logits = forward(prompt, d.S, 0);
    }
    // greedy: the next token of each sequence, chosen on the host
    st.next_tokens.resize(d.B);
    for (std::uint64_t b = 0; b < d.B; ++b) {
      const float* row = st.prefill_logits.data() + b * d.V;
      st.next_tokens[b] = static_cast<std::int32_t>(std::max_element(row, row + d.V) - row);
    }
    {
      PhaseScope<Impl> s(*this, "decode", &sm.decode_peak, &sm.reserved_peak);
      st.decode_logits = forward(st.next_tokens, 1, d.S);
    }
    phase = "step";
    if (opt.leak_per_step) leaks.push_back(make(kLeakBytes, DType::fp32, "debug leak", "leak_per_step"));
    marks.push_back({step_index, "end", alloc.history().size()});
    sm.allocated_end = static_cast<bytes_t>(alloc.stats().allocated.current);
    ++step_index;
    return st;
  }

  void release_all() {
    for (auto& b : live) b.reset();
    leaks.clear();
    vpool.clear();
    kpool.clear();
    params.clear();
  }
};

InferHarness::InferHarness(const ModelSpec& model, const Job& job, Backend& backend, CachingAllocator& allocator,
                           InferOptions options) {
  model.validate();
  job.validate();
  check_harness_infer_supported(model, job);
  impl_ = std::make_unique<Impl>(model, job, backend, allocator, std::move(options));
  try {
    impl_->build();
  } catch (...) {
    impl_->release_all();
    throw;
  }
}

InferHarness::~InferHarness() {
  if (impl_) impl_->release_all();
}

InferStep InferHarness::step() {
  try {
    return impl_->step();
  } catch (...) {
    for (auto& b : impl_->live) b.reset();  // a failed step leaves no activation behind
    throw;
  }
}

const InferDims& InferHarness::dims() const { return impl_->d; }
const std::vector<PhaseMark>& InferHarness::marks() const { return impl_->marks; }

bytes_t InferHarness::weight_bytes() const {
  bytes_t s = 0;
  for (const auto& p : impl_->params) s += p.w.bytes();
  return s;
}

bytes_t InferHarness::kv_pool_bytes() const {
  bytes_t s = 0;
  for (const auto& b : impl_->kpool) s += b.bytes();
  for (const auto& b : impl_->vpool) s += b.bytes();
  return s;
}

}  // namespace membudget::measure
