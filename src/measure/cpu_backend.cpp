// The CPU reference backend: every kernel of backend.hpp with Eigen on host memory.
//
// Each kernel loads its inputs into fp32 (bf16 storage is Eigen::bfloat16, rounded to nearest
// even on the way back), computes in fp32 as a GPU kernel accumulates in fp32 registers, and stores
// in the output's dtype. Those fp32 copies are host temporaries outside the allocator, the CPU
// analogue of registers and shared memory: the allocator sees exactly the buffers the harness owns.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "measure/backend.hpp"

namespace membudget::measure {
namespace {

using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapM = Eigen::Map<Mat>;
using MapA = Eigen::Map<Eigen::ArrayXf>;

void check_dtype(View v, const char* what) {
  if (v.dtype != DType::fp32 && v.dtype != DType::bf16)
    throw Error(ErrorKind::unsupported, std::string("cpu backend: ") + what + ": only fp32 and bf16 tensors");
}

std::vector<float> load(View v, std::size_t n) {
  std::vector<float> out(n);
  if (v.dtype == DType::fp32) {
    std::memcpy(out.data(), v.data, n * sizeof(float));
  } else {
    check_dtype(v, "load");
    const auto* p = static_cast<const Eigen::bfloat16*>(v.data);
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(p[i]);
  }
  return out;
}

void store(View v, const float* src, std::size_t n) {
  if (v.dtype == DType::fp32) {
    std::memcpy(v.data, src, n * sizeof(float));
  } else {
    check_dtype(v, "store");
    auto* p = static_cast<Eigen::bfloat16*>(v.data);
    for (std::size_t i = 0; i < n; ++i) p[i] = Eigen::bfloat16(src[i]);
  }
}

// v += src (read, add in fp32, round once).
void store_add(View v, const float* src, std::size_t n) {
  std::vector<float> cur = load(v, n);
  for (std::size_t i = 0; i < n; ++i) cur[i] += src[i];
  store(v, cur.data(), n);
}

void store_maybe_add(View v, bool add, const float* src, std::size_t n) {
  if (add) store_add(v, src, n);
  else store(v, src, n);
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(bytes_t capacity) : memory_(make_host_memory(capacity)) {}

  std::string name() const override { return "cpu (Eigen)"; }
  RawMemory& memory() override { return *memory_; }
  bytes_t outside_bytes(bytes_t) const override { return 0; }
  void copy_to_device(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  void zero(View x, std::size_t n) override { std::memset(x.data, 0, n * element_bytes(x.dtype)); }
  void synchronize() override {}

  void cast(View dst, View src, std::size_t n) override {
    std::vector<float> x = load(src, n);
    store(dst, x.data(), n);
  }

  void embedding_forward(View out, const std::int32_t* tokens, View table, int T, int C) override {
    std::vector<float> o(static_cast<std::size_t>(T) * C);
    for (int t = 0; t < T; ++t) {
      std::vector<float> row = load(rows(table, tokens[t], C), C);
      std::copy(row.begin(), row.end(), o.begin() + static_cast<std::size_t>(t) * C);
    }
    store(out, o.data(), o.size());
  }

  void embedding_backward(View dtable, const std::int32_t* tokens, View dout, int T, int C) override {
    std::vector<float> d = load(dout, static_cast<std::size_t>(T) * C);
    for (int t = 0; t < T; ++t) store_add(rows(dtable, tokens[t], C), d.data() + static_cast<std::size_t>(t) * C, C);
  }

  void rmsnorm_forward(View out, float* rstd, View x, View w, int N, int C, float eps) override {
    std::vector<float> xs = load(x, static_cast<std::size_t>(N) * C), ws = load(w, C);
    MapM X(xs.data(), N, C);
    Eigen::Map<Eigen::RowVectorXf> W(ws.data(), C);
    Mat Y(N, C);
    for (int i = 0; i < N; ++i) {
      const float r = 1.0f / std::sqrt(X.row(i).squaredNorm() / static_cast<float>(C) + eps);
      rstd[i] = r;
      Y.row(i) = (X.row(i).array() * r * W.array()).matrix();
    }
    store(out, Y.data(), Y.size());
  }

  void rmsnorm_backward(View dx, bool accumulate_dx, View dw, View dout, View x, View w, const float* rstd, int N,
                        int C) override {
    const std::size_t n = static_cast<std::size_t>(N) * C;
    std::vector<float> xs = load(x, n), ws = load(w, C), ds = load(dout, n);
    MapM X(xs.data(), N, C), D(ds.data(), N, C);
    Eigen::Map<Eigen::RowVectorXf> W(ws.data(), C);
    Mat DX(N, C);
    Eigen::RowVectorXf DW = Eigen::RowVectorXf::Zero(C);
    for (int i = 0; i < N; ++i) {
      const float r = rstd[i];
      Eigen::RowVectorXf xhat = X.row(i) * r;
      Eigen::RowVectorXf g = D.row(i).cwiseProduct(W);  // dL/dxhat
      DW += D.row(i).cwiseProduct(xhat);
      const float m = g.dot(xhat) / static_cast<float>(C);
      DX.row(i) = r * (g - xhat * m);
    }
    store_maybe_add(dx, accumulate_dx, DX.data(), n);
    store_add(dw, DW.data(), C);
  }

  void matmul_forward(View out, View x, View w, View bias, int N, int IC, int OC) override {
    std::vector<float> xs = load(x, static_cast<std::size_t>(N) * IC), ws = load(w, static_cast<std::size_t>(OC) * IC);
    MapM X(xs.data(), N, IC), W(ws.data(), OC, IC);
    Mat Y = X * W.transpose();
    if (bias) {
      std::vector<float> bs = load(bias, OC);
      Y.rowwise() += Eigen::Map<Eigen::RowVectorXf>(bs.data(), OC);
    }
    store(out, Y.data(), Y.size());
  }

  void matmul_backward(View dx, bool accumulate_dx, View dw, View dbias, View dout, View x, View w, int N, int IC,
                       int OC) override {
    std::vector<float> ds = load(dout, static_cast<std::size_t>(N) * OC);
    std::vector<float> xs = load(x, static_cast<std::size_t>(N) * IC), ws = load(w, static_cast<std::size_t>(OC) * IC);
    MapM D(ds.data(), N, OC), X(xs.data(), N, IC), W(ws.data(), OC, IC);
    if (dx) {
      Mat DX = D * W;
      store_maybe_add(dx, accumulate_dx, DX.data(), DX.size());
    }
    if (dw) {
      Mat DW = D.transpose() * X;
      store_add(dw, DW.data(), DW.size());
    }
    if (dbias) {
      Eigen::RowVectorXf DB = D.colwise().sum();
      store_add(dbias, DB.data(), OC);
    }
  }

  void rotary(View x, int B, int S, int heads, int hd, float theta, float sign, int pos0 = 0) {
    const std::size_t n = static_cast<std::size_t>(B) * S * heads * hd;
    std::vector<float> v = load(x, n);
    const int half = hd / 2;
    for (int b = 0; b < B; ++b)
      for (int s = 0; s < S; ++s)
        for (int h = 0; h < heads; ++h) {
          float* p = v.data() + ((static_cast<std::size_t>(b) * S + s) * heads + h) * hd;
          for (int i = 0; i < half; ++i) {
            const double freq = std::pow(static_cast<double>(theta), -2.0 * i / hd);
            const double ang = (pos0 + s) * freq;
            const float c = static_cast<float>(std::cos(ang)), sn = sign * static_cast<float>(std::sin(ang));
            const float a = p[i], bb = p[i + half];
            p[i] = a * c - bb * sn;
            p[i + half] = bb * c + a * sn;
          }
        }
    store(x, v.data(), n);
  }
  void rotary_forward(View x, int B, int S, int heads, int hd, float theta) override { rotary(x, B, S, heads, hd, theta, 1.0f); }
  void rotary_backward(View dx, int B, int S, int heads, int hd, float theta) override {
    rotary(dx, B, S, heads, hd, theta, -1.0f);  // the transpose of a rotation is the inverse rotation
  }

  void rotary_forward_at(View x, int B, int S, int heads, int hd, float theta, int pos0) override {
    rotary(x, B, S, heads, hd, theta, 1.0f, pos0);
  }

  // Online softmax over the keys of each query: running max, running sum and running output, one
  // key at a time (a tile of one); the S×S scores never exist. Keys and values are rows of
  // (B, max_tokens, kv_heads, head_dim); query i of each sequence sits at position past + i and
  // attends rows 0..past + i. The log-sum-exp is written when `lse` is given.
  void online_softmax(View out, float* lse, View q, View k, View v, const AttnShape& a, int past, int max_tokens) {
    const int B = a.B, S = a.S, H = a.heads, KV = a.kv_heads, D = a.head_dim, G = a.group();
    std::vector<float> Q = load(q, static_cast<std::size_t>(B) * S * H * D);
    const std::size_t nk = static_cast<std::size_t>(B) * max_tokens * KV * D;
    std::vector<float> K = load(k, nk), V = load(v, nk);
    std::vector<float> O(Q.size());
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    Eigen::VectorXf acc(D);
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h) {
        const int kh = h / G;
        for (int i = 0; i < S; ++i) {
          Eigen::Map<const Eigen::VectorXf> qi(&Q[((static_cast<std::size_t>(b) * S + i) * H + h) * D], D);
          float m = -INFINITY, l = 0.0f;
          acc.setZero();
          for (int j = 0; j <= past + i; ++j) {
            const std::size_t row = (static_cast<std::size_t>(b) * max_tokens + j) * KV + kh;
            Eigen::Map<const Eigen::VectorXf> kj(&K[row * D], D), vj(&V[row * D], D);
            const float s = qi.dot(kj) * scale;
            const float mn = std::max(m, s);
            const float corr = std::exp(m - mn), p = std::exp(s - mn);
            l = l * corr + p;
            acc = acc * corr + p * vj;
            m = mn;
          }
          Eigen::Map<Eigen::VectorXf>(&O[((static_cast<std::size_t>(b) * S + i) * H + h) * D], D) = acc / l;
          if (lse) lse[(static_cast<std::size_t>(b) * H + h) * S + i] = m + std::log(l);
        }
      }
    store(out, O.data(), O.size());
  }

  void attention_forward(View out, float* lse, View q, View k, View v, const AttnShape& a) override {
    online_softmax(out, lse, q, k, v, a, 0, a.S);
  }

  // The same online softmax, keys and values read from the cache rows of each sequence.
  void attention_forward_cached(View out, View q, View k_cache, View v_cache, const AttnShape& a, int past,
                                int max_tokens) override {
    if (past + a.S > max_tokens)
      throw Error(ErrorKind::invalid_argument, "attention_forward_cached: past + new tokens exceed the cache");
    online_softmax(out, nullptr, q, k_cache, v_cache, a, past, max_tokens);
  }

  void attention_backward(View dq, View dk, View dv, float* delta, View dout, View q, View k, View v, View out,
                          const float* lse, const AttnShape& a) override {
    const int B = a.B, S = a.S, H = a.heads, KV = a.kv_heads, D = a.head_dim, G = a.group();
    const std::size_t nq = static_cast<std::size_t>(B) * S * H * D, nk = static_cast<std::size_t>(B) * S * KV * D;
    std::vector<float> Q = load(q, nq), K = load(k, nk), V = load(v, nk), O = load(out, nq), dO = load(dout, nq);
    std::vector<float> dQ(nq, 0.0f), dK(nk, 0.0f), dV(nk, 0.0f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    auto qi_at = [&](std::vector<float>& X, int b, int i, int h) { return &X[((static_cast<std::size_t>(b) * S + i) * H + h) * D]; };
    auto kj_at = [&](std::vector<float>& X, int b, int j, int h) { return &X[((static_cast<std::size_t>(b) * S + j) * KV + h) * D]; };
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < S; ++i) {
          Eigen::Map<Eigen::VectorXf> o(qi_at(O, b, i, h), D), d(qi_at(dO, b, i, h), D);
          delta[(static_cast<std::size_t>(b) * H + h) * S + i] = o.dot(d);
        }
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h) {
        const int kh = h / G;
        for (int i = 0; i < S; ++i) {
          const std::size_t row = (static_cast<std::size_t>(b) * H + h) * S + i;
          Eigen::Map<Eigen::VectorXf> qi(qi_at(Q, b, i, h), D), doi(qi_at(dO, b, i, h), D), dqi(qi_at(dQ, b, i, h), D);
          for (int j = 0; j <= i; ++j) {
            Eigen::Map<Eigen::VectorXf> kj(kj_at(K, b, j, kh), D), vj(kj_at(V, b, j, kh), D);
            Eigen::Map<Eigen::VectorXf> dkj(kj_at(dK, b, j, kh), D), dvj(kj_at(dV, b, j, kh), D);
            const float p = std::exp(qi.dot(kj) * scale - lse[row]);
            const float dp = doi.dot(vj);
            const float ds = p * (dp - delta[row]) * scale;
            dqi += ds * kj;
            dkj += ds * qi;
            dvj += p * doi;
          }
        }
      }
    store(dq, dQ.data(), nq);
    store(dk, dK.data(), nk);
    store(dv, dV.data(), nk);
  }

  void swiglu_forward(View out, View gate, View up, std::size_t n) override {
    std::vector<float> g = load(gate, n), u = load(up, n);
    MapA G(g.data(), n), U(u.data(), n);
    Eigen::ArrayXf Y = G / (1.0f + (-G).exp()) * U;
    store(out, Y.data(), n);
  }

  void swiglu_backward(View dgate, View dup, View dout, View gate, View up, std::size_t n) override {
    std::vector<float> g = load(gate, n), u = load(up, n), d = load(dout, n);
    MapA G(g.data(), n), U(u.data(), n), Dd(d.data(), n);
    Eigen::ArrayXf sig = 1.0f / (1.0f + (-G).exp());
    Eigen::ArrayXf DU = Dd * G * sig;
    Eigen::ArrayXf DG = Dd * U * sig * (1.0f + G * (1.0f - sig));
    store(dgate, DG.data(), n);
    store(dup, DU.data(), n);
  }

  void cross_entropy_forward(float* losses, View logits, const std::int32_t* targets, int N, int V) override {
    for (int i = 0; i < N; ++i) {
      std::vector<float> row = load(rows(logits, i, V), V);
      MapA L(row.data(), V);
      const float m = L.maxCoeff();
      const float lse = m + std::log((L - m).exp().sum());
      losses[i] = lse - row[targets[i]];
    }
  }

  void cross_entropy_backward(View dlogits, View logits, const std::int32_t* targets, float dloss, int N,
                              int V) override {
    for (int i = 0; i < N; ++i) {
      std::vector<float> row = load(rows(logits, i, V), V);
      MapA L(row.data(), V);
      const float m = L.maxCoeff();
      Eigen::ArrayXf p = (L - m).exp();
      p /= p.sum();
      p[targets[i]] -= 1.0f;
      p *= dloss;
      store(rows(dlogits, i, V), p.data(), V);
    }
  }

  void adamw(std::span<const AdamWTensor> tensors, const AdamWParams& hp, int step) override {
    const float bc1 = 1.0f - std::pow(hp.beta1, static_cast<float>(step));
    const float bc2 = 1.0f - std::pow(hp.beta2, static_cast<float>(step));
    for (const auto& t : tensors) {
      std::vector<float> p = load(t.master ? t.master : t.param, t.n), g = load(t.grad, t.n), m = load(t.m, t.n),
                         v = load(t.v, t.n);
      MapA P(p.data(), t.n), Gr(g.data(), t.n), M(m.data(), t.n), Vv(v.data(), t.n);
      M = hp.beta1 * M + (1.0f - hp.beta1) * Gr;
      Vv = hp.beta2 * Vv + (1.0f - hp.beta2) * Gr.square();
      if (t.decay) P *= 1.0f - hp.lr * hp.weight_decay;
      P -= hp.lr * (M / bc1) / ((Vv / bc2).sqrt() + hp.eps);
      if (t.master) store(t.master, p.data(), t.n);
      store(t.param, p.data(), t.n);
      store(t.m, m.data(), t.n);
      store(t.v, v.data(), t.n);
    }
  }

  void residual_forward(View out, View a, View b, std::size_t n) override {
    std::vector<float> x = load(a, n), y = load(b, n);
    MapA(x.data(), n) += MapA(y.data(), n);
    store(out, x.data(), n);
  }

 private:
  std::unique_ptr<RawMemory> memory_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(bytes_t capacity) { return std::make_unique<CpuBackend>(capacity); }

}  // namespace membudget::measure
