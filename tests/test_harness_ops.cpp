// Every CPU kernel's backward against central finite differences (fp32), the flash-style attention
// against a materialised softmax, and the bf16 storage path. The CPU backend's device pointers are
// host pointers, so the tests hand it std::vector storage directly.
#include <doctest/doctest.h>

#include <cstdlib>

#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "measure/backend.hpp"

using namespace membudget;
using namespace membudget::measure;

namespace {

std::vector<float> randn(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

View F(std::vector<float>& v) { return {v.data(), DType::fp32}; }

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Checks analytic[i] ≈ dL/dx[i] by central differences on every element of x, where loss() reads x.
// The tolerance scales with the reference (llm.c's tol + |ref|·eps).
void fd_check(const char* what, std::vector<float>& x, const std::vector<float>& analytic,
              const std::function<double()>& loss, float h = 1e-2f, double atol = 2e-3, double rtol = 2e-2) {
  REQUIRE(x.size() == analytic.size());
  int bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float keep = x[i];
    x[i] = keep + h;
    const double lp = loss();
    x[i] = keep - h;
    const double lm = loss();
    x[i] = keep;
    const double num = (lp - lm) / (2.0 * h);
    if (std::fabs(num - analytic[i]) > atol + rtol * std::fabs(num)) {
      if (bad++ < 5)
        MESSAGE(what << "[" << i << "]: numeric " << num << " analytic " << analytic[i]);
    }
  }
  CHECK_MESSAGE(bad == 0, what << ": " << bad << " of " << x.size() << " gradients disagree");
}

}  // namespace

TEST_CASE("embedding backward scatters into the rows of the tokens") {
  auto be = make_cpu_backend(0);
  const int T = 6, C = 4, V = 5;
  std::vector<std::int32_t> tok{1, 3, 1, 0, 4, 3};
  auto table = randn(V * C, 1), R = randn(T * C, 2);
  std::vector<float> out(T * C), dtable(V * C, 0.0f);
  auto loss = [&] {
    be->embedding_forward(F(out), tok.data(), F(table), T, C);
    return dot(out, R);
  };
  loss();
  be->embedding_backward(F(dtable), tok.data(), F(R), T, C);
  fd_check("dtable", table, dtable, loss);
}

TEST_CASE("rmsnorm backward: dx and dw (and dx accumulates on request)") {
  auto be = make_cpu_backend(0);
  const int N = 5, C = 8;
  auto x = randn(N * C, 3), w = randn(C, 4), R = randn(N * C, 5);
  for (auto& v : w) v += 1.0f;
  std::vector<float> out(N * C), rstd(N), dx(N * C), dw(C, 0.0f);
  auto loss = [&] {
    be->rmsnorm_forward(F(out), rstd.data(), F(x), F(w), N, C, 1e-5f);
    return dot(out, R);
  };
  loss();
  be->rmsnorm_backward(F(dx), false, F(dw), F(R), F(x), F(w), rstd.data(), N, C);
  fd_check("rmsnorm dx", x, dx, loss);
  fd_check("rmsnorm dw", w, dw, loss);
  std::vector<float> acc(N * C, 1.0f), dw2(C, 0.0f);
  be->rmsnorm_backward(F(acc), true, F(dw2), F(R), F(x), F(w), rstd.data(), N, C);
  for (int i = 0; i < N * C; ++i) CHECK(acc[i] == doctest::Approx(1.0f + dx[i]).epsilon(1e-5));
}

TEST_CASE("matmul backward: dx, dw, dbias") {
  auto be = make_cpu_backend(0);
  const int N = 4, IC = 6, OC = 5;
  auto x = randn(N * IC, 6), w = randn(OC * IC, 7), b = randn(OC, 8), R = randn(N * OC, 9);
  std::vector<float> out(N * OC), dx(N * IC), dw(OC * IC, 0.0f), db(OC, 0.0f);
  auto loss = [&] {
    be->matmul_forward(F(out), F(x), F(w), F(b), N, IC, OC);
    return dot(out, R);
  };
  loss();
  be->matmul_backward(F(dx), false, F(dw), F(db), F(R), F(x), F(w), N, IC, OC);
  fd_check("matmul dx", x, dx, loss);
  fd_check("matmul dw", w, dw, loss);
  fd_check("matmul dbias", b, db, loss);
}

TEST_CASE("rotary backward is the inverse rotation") {
  auto be = make_cpu_backend(0);
  const int B = 2, S = 5, H = 3, D = 8;
  auto x = randn(B * S * H * D, 10), R = randn(B * S * H * D, 11);
  std::vector<float> y;
  auto loss = [&] {
    y = x;
    be->rotary_forward(F(y), B, S, H, D, 10000.0f);
    return dot(y, R);
  };
  loss();
  std::vector<float> dx = R;
  be->rotary_backward(F(dx), B, S, H, D, 10000.0f);
  fd_check("rotary dx", x, dx, loss);
  // position 0 is not rotated; rotation keeps norms
  loss();  // y from the unperturbed x
  CHECK(y[0] == doctest::Approx(x[0]));
  double n0 = 0, n1 = 0;
  for (std::size_t i = 0; i < x.size(); ++i) n0 += static_cast<double>(x[i]) * x[i], n1 += static_cast<double>(y[i]) * y[i];
  CHECK(n1 == doctest::Approx(n0).epsilon(1e-5));
}

TEST_CASE("attention: online softmax equals the materialised softmax; backward with GQA") {
  auto be = make_cpu_backend(0);
  AttnShape a{2, 5, 4, 2, 4};
  const std::size_t nq = a.B * a.S * a.heads * a.head_dim, nk = a.B * a.S * a.kv_heads * a.head_dim;
  auto q = randn(nq, 12), k = randn(nk, 13), v = randn(nk, 14), R = randn(nq, 15);
  std::vector<float> out(nq), lse(a.B * a.heads * a.S);
  be->attention_forward(F(out), lse.data(), F(q), F(k), F(v), a);
  // reference: scores, causal mask, softmax, weighted sum
  const float scale = 1.0f / std::sqrt(static_cast<float>(a.head_dim));
  for (int b = 0; b < a.B; ++b)
    for (int h = 0; h < a.heads; ++h)
      for (int i = 0; i < a.S; ++i) {
        const int kh = h / a.group();
        std::vector<double> s(i + 1);
        double mx = -1e30;
        for (int j = 0; j <= i; ++j) {
          double d = 0;
          for (int c = 0; c < a.head_dim; ++c)
            d += q[((b * a.S + i) * a.heads + h) * a.head_dim + c] * k[((b * a.S + j) * a.kv_heads + kh) * a.head_dim + c];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (auto& e : s) z += std::exp(e - mx);
        CHECK(lse[(b * a.heads + h) * a.S + i] == doctest::Approx(mx + std::log(z)).epsilon(1e-5));
        for (int c = 0; c < a.head_dim; ++c) {
          double o = 0;
          for (int j = 0; j <= i; ++j) o += std::exp(s[j] - mx) / z * v[((b * a.S + j) * a.kv_heads + kh) * a.head_dim + c];
          CHECK(out[((b * a.S + i) * a.heads + h) * a.head_dim + c] == doctest::Approx(o).epsilon(1e-4));
        }
      }
  auto loss = [&] {
    be->attention_forward(F(out), lse.data(), F(q), F(k), F(v), a);
    return dot(out, R);
  };
  loss();
  std::vector<float> dq(nq), dk(nk), dv(nk), delta(a.B * a.heads * a.S);
  be->attention_backward(F(dq), F(dk), F(dv), delta.data(), F(R), F(q), F(k), F(v), F(out), lse.data(), a);
  fd_check("attention dq", q, dq, loss);
  fd_check("attention dk", k, dk, loss);
  fd_check("attention dv", v, dv, loss);
}

TEST_CASE("swiglu backward") {
  auto be = make_cpu_backend(0);
  const std::size_t n = 24;
  auto g = randn(n, 16), u = randn(n, 17), R = randn(n, 18);
  std::vector<float> out(n), dg(n), du(n);
  auto loss = [&] {
    be->swiglu_forward(F(out), F(g), F(u), n);
    return dot(out, R);
  };
  loss();
  be->swiglu_backward(F(dg), F(du), F(R), F(g), F(u), n);
  fd_check("swiglu dgate", g, dg, loss);
  fd_check("swiglu dup", u, du, loss);
}

TEST_CASE("cross-entropy: forward is logsumexp − target logit; backward in place") {
  auto be = make_cpu_backend(0);
  const int N = 4, V = 7;
  auto logits = randn(N * V, 19, 2.0f);
  std::vector<std::int32_t> tgt{3, 0, 6, 2};
  std::vector<float> losses(N);
  const float dloss = 0.7f;
  auto loss = [&] {
    be->cross_entropy_forward(losses.data(), F(logits), tgt.data(), N, V);
    return dloss * std::accumulate(losses.begin(), losses.end(), 0.0);
  };
  loss();
  double lse0 = 0;
  for (int j = 0; j < V; ++j) lse0 += std::exp(static_cast<double>(logits[j]));
  CHECK(losses[0] == doctest::Approx(std::log(lse0) - logits[3]).epsilon(1e-5));
  std::vector<float> d = logits;  // in place, as the harness runs it
  be->cross_entropy_backward(F(d), F(d), tgt.data(), dloss, N, V);
  fd_check("cross-entropy dlogits", logits, d, loss);
}

TEST_CASE("residual add and casts") {
  auto be = make_cpu_backend(0);
  std::vector<float> a{1, 2, 3}, b{0.5f, -2, 4}, out(3);
  be->residual_forward(F(out), F(a), F(b), 3);
  CHECK(out == std::vector<float>{1.5f, 0, 7});
  // bf16 rounds to nearest even: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 → 1
  std::vector<float> src{1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 3.14159f};
  std::vector<std::uint16_t> bits(3);
  std::vector<float> back(3);
  be->cast(View{bits.data(), DType::bf16}, F(src), 3);
  be->cast(F(back), View{bits.data(), DType::bf16}, 3);
  CHECK(back[0] == 1.0f);
  CHECK(back[1] == 1.0f + 4.0f / 256);
  CHECK(back[2] == doctest::Approx(3.14159f).epsilon(1.0 / 128));
}

TEST_CASE("adamw: one fused step equals the textbook update, fp32 and bf16 state") {
  auto be = make_cpu_backend(0);
  AdamWParams hp{0.1f, 0.9f, 0.95f, 1e-8f, 0.01f};
  std::vector<float> p{1.0f, -2.0f}, g{0.5f, -0.25f}, m{0, 0}, v{0, 0};
  std::vector<float> p2 = p;
  std::vector<std::uint16_t> pb(2), gb(2), mb(2, 0), vb(2, 0);
  be->cast(View{pb.data(), DType::bf16}, F(p2), 2);
  be->cast(View{gb.data(), DType::bf16}, F(g), 2);
  AdamWTensor t{F(p), F(g), F(m), F(v), 2, true};
  AdamWTensor tb{{pb.data(), DType::bf16}, {gb.data(), DType::bf16}, {mb.data(), DType::bf16}, {vb.data(), DType::bf16}, 2, true};
  be->adamw(std::span<const AdamWTensor>(&t, 1), hp, 1);
  be->adamw(std::span<const AdamWTensor>(&tb, 1), hp, 1);
  std::vector<float> pback(2);
  be->cast(F(pback), View{pb.data(), DType::bf16}, 2);
  for (int i = 0; i < 2; ++i) {
    const double m1 = 0.1 * g[i], v1 = 0.05 * g[i] * g[i];
    const double mh = m1 / 0.1, vh = v1 / 0.05;
    const double want = p2[i] * (1 - 0.1 * 0.01) - 0.1 * mh / (std::sqrt(vh) + 1e-8);
    CHECK(p[i] == doctest::Approx(want).epsilon(1e-6));
    CHECK(pback[i] == doctest::Approx(want).epsilon(1.0 / 128));
  }
  // bf16-master: the update is computed on the fp32 master copy, which keeps it exactly, and the
  // bf16 parameter receives it rounded (whatever the parameter held before)
  std::vector<float> master = p2, mm{0, 0}, vm{0, 0};
  std::vector<std::uint16_t> pm(2, 0), gm(2);
  be->cast(View{gm.data(), DType::bf16}, F(g), 2);
  AdamWTensor tm{{pm.data(), DType::bf16}, {gm.data(), DType::bf16}, F(mm), F(vm), 2, true, F(master)};
  be->adamw(std::span<const AdamWTensor>(&tm, 1), hp, 1);
  std::vector<float> pmback(2);
  be->cast(F(pmback), View{pm.data(), DType::bf16}, 2);
  for (int i = 0; i < 2; ++i) {
    const double want = p2[i] * (1 - 0.1 * 0.01) - 0.1 * (0.1 * g[i] / 0.1) / (std::sqrt(0.05 * g[i] * g[i] / 0.05) + 1e-8);
    CHECK(master[i] == doctest::Approx(want).epsilon(1e-6));
    CHECK(pmback[i] == doctest::Approx(want).epsilon(1.0 / 128));
  }
}

TEST_CASE("bf16 storage: a bf16 matmul agrees with fp32 within bf16 precision") {
  auto be = make_cpu_backend(0);
  const int N = 8, IC = 32, OC = 16;
  auto x = randn(N * IC, 20), w = randn(OC * IC, 21, 0.2f);
  std::vector<float> ref(N * OC), got(N * OC);
  std::vector<std::uint16_t> xb(x.size()), wb(w.size()), ob(N * OC);
  be->cast(View{xb.data(), DType::bf16}, F(x), x.size());
  be->cast(View{wb.data(), DType::bf16}, F(w), w.size());
  be->matmul_forward(F(ref), F(x), F(w), View{}, N, IC, OC);
  be->matmul_forward(View{ob.data(), DType::bf16}, View{xb.data(), DType::bf16}, View{wb.data(), DType::bf16}, View{},
                     N, IC, OC);
  be->cast(F(got), View{ob.data(), DType::bf16}, got.size());
  double scale = 0;
  for (float r : ref) scale = std::max(scale, static_cast<double>(std::fabs(r)));
  for (std::size_t i = 0; i < ref.size(); ++i) CHECK(std::fabs(got[i] - ref[i]) <= 0.02 * scale);
}

TEST_CASE("the cuda backend: a plugin loaded on demand, a clear error when missing or without a GPU") {
  // A plugin path that does not exist: unsupported, naming the path.
  ::setenv("MEMBUDGET_CUDA_PLUGIN", "/nonexistent/libmembudget_cuda.so", 1);
  CHECK_THROWS_WITH_AS(make_backend("cuda", 0), doctest::Contains("/nonexistent/libmembudget_cuda.so"), Error);
  // A file that is not a shared library: a device error naming it, no crash.
  const std::string junk = std::string(MEMBUDGET_SOURCE_DIR) + "/README.md";
  ::setenv("MEMBUDGET_CUDA_PLUGIN", junk.c_str(), 1);
  CHECK_THROWS_WITH_AS(make_backend("cuda", 0), doctest::Contains("cannot load"), Error);
  ::unsetenv("MEMBUDGET_CUDA_PLUGIN");
  // The default search: a working backend on a machine with a GPU and the plugin; otherwise an
  // Error that says what is missing.
  try {
    const auto be = make_backend("cuda", 0);
    CHECK(be->name().find("cuda") == 0);
  } catch (const Error& e) {
    CHECK((e.kind() == ErrorKind::unsupported || e.kind() == ErrorKind::device));
    CHECK(std::string(e.what()).find("--device-backend cuda") != std::string::npos);
  }
  CHECK_THROWS_AS(make_backend("tpu", 0), Error);
  CHECK(make_backend("cpu", 0)->name().find("cpu") == 0);
}
