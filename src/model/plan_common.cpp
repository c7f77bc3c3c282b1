// Shared pieces of the compiled plans: see plan_common.hpp.
#include "plan_common.hpp"

#include <algorithm>
#include <cstring>
#include <array>
#include <numeric>

namespace membudget::detail::plan {
namespace {
constexpr u128 kOver = kMax64 + 1;  // saturation value
}  // namespace

u128 sat_mul(u128 a, u128 b) {
  if (a == 0 || b == 0) return 0;
  if (a >= kOver || b >= kOver) return kOver;
  std::uint64_t r;
  if (__builtin_mul_overflow(static_cast<std::uint64_t>(a), static_cast<std::uint64_t>(b), &r)) return kOver;
  return r;
}

u128 monomial(std::uint64_t b, unsigned i, std::uint64_t s, unsigned j, unsigned l) {
  u128 v = 1;
  for (unsigned k = 0; k < i; ++k) v = sat_mul(v, b);
  for (unsigned k = 0; k < j; ++k) v = sat_mul(v, s);
  for (unsigned k = 0; k < l; ++k) v = sat_mul(v, static_cast<u128>(s) + 1);
  return v;
}

bool basis_values(const std::vector<Basis>& basis, std::uint64_t b, std::uint64_t s, std::uint64_t* out) {
  for (std::size_t k = 0; k < basis.size(); ++k) {
    const auto& e = basis[k];
    u128 v = 1;
    if (e.kind != Kind::constant) v = monomial(b, e.i, s, e.j, e.l);
    if (e.kind == Kind::rounded) {
      v = sat_mul(v, e.c);
      if (v < kOver) v = ((v + 511) >> 9) << 9;
    }
    if (v > kMax64) return false;
    out[k] = static_cast<std::uint64_t>(v);
  }
  return true;
}

namespace {
int find_or_add(std::vector<Basis>& basis, const Basis& e) {
  for (std::size_t k = 0; k < basis.size(); ++k)
    if (basis[k] == e) return static_cast<int>(k);
  if (basis.size() >= kMaxBasis) throw Fail{};
  basis.push_back(e);
  return static_cast<int>(basis.size() - 1);
}
}  // namespace

Contribution contribution(bytes_t c, unsigned i, unsigned j, unsigned l, std::vector<Basis>& basis) {
  const auto u8 = [](unsigned v) { return static_cast<std::uint8_t>(v); };
  Contribution out;
  auto add = [&](int component, std::uint64_t coef) {
    out.component[out.n] = component;
    out.coef[out.n++] = coef;
  };
  if (i == 0 && j == 0 && l == 0) {
    add(0, (c + 511) / 512 * 512);
  } else if (c % 512 == 0) {
    // A coefficient that is a multiple of 512 is never rounded: all such tensors of one monomial
    // share one exact component, their coefficients summed; (s + 1)^l expands binomially.
    static constexpr std::uint64_t kBinomial[4][4] = {{1, 0, 0, 0}, {1, 1, 0, 0}, {1, 2, 1, 0}, {1, 3, 3, 1}};
    if (l > 3) throw Fail{};
    for (unsigned k = 0; k <= l; ++k) {
      std::uint64_t coef;
      if (__builtin_mul_overflow(c, kBinomial[l][k], &coef)) throw Fail{};
      if (i == 0 && j + k == 0) add(0, coef);  // c · 1: a constant (already a multiple of 512)
      else add(find_or_add(basis, {Kind::exact, u8(i), u8(j + k), 0, 0}), coef);
    }
  } else {
    add(find_or_add(basis, {Kind::rounded, u8(i), u8(j), u8(l), c}), 1);
  }
  return out;
}

// Processing in decreasing order of a strictly positive weighting puts every dominator before
// what it dominates.
std::vector<std::uint64_t> prune(const std::vector<std::uint64_t>& rows, std::size_t D,
                                 const std::vector<std::uint64_t>& weight) {
  const std::size_t n = rows.size() / D;
  std::vector<u128> score(n);
  for (std::size_t r = 0; r < n; ++r) score[r] = dot(&rows[r * D], weight.data(), D);
  std::vector<std::uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](std::uint32_t x, std::uint32_t y) { return score[x] > score[y]; });
  std::vector<std::uint64_t> out;
  for (std::uint32_t r : order) {
    const std::uint64_t* v = &rows[std::size_t{r} * D];
    bool dominated = false;
    for (std::size_t f = 0; f < out.size() && !dominated; f += D) {
      bool le = true;
      for (std::size_t d = 0; d < D && le; ++d) le = v[d] <= out[f + d];
      dominated = le;
    }
    if (!dominated) out.insert(out.end(), v, v + D);
  }
  return out;
}

void PhaseRows::set(std::vector<Basis> basis, const std::vector<std::vector<std::uint64_t>>& per_phase) {
  basis_ = std::move(basis);
  const std::size_t D = basis_.size();
  rows_.clear();
  begin_.clear();
  for (const auto& p : per_phase) {
    if (p.empty()) throw Fail{};
    begin_.push_back(static_cast<std::uint32_t>(rows_.size() / D));
    rows_.insert(rows_.end(), p.begin(), p.end());
  }
  begin_.push_back(static_cast<std::uint32_t>(rows_.size() / D));
  const std::size_t n = rows_.size() / D;
  if (n > kMaxRows) throw Fail{};
  colmax_.assign(D, 0);
  const std::size_t blocks = (n + kBlock - 1) / kBlock;
  cols_.assign(blocks * D * kBlock, 0.0);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t d = 0; d < D; ++d) {
      const std::uint64_t v = rows_[i * D + d];
      if (v >= (1ull << 58)) throw Fail{};
      cols_[(i / kBlock) * D * kBlock + d * kBlock + i % kBlock] = static_cast<double>(v);
      colmax_[d] = std::max(colmax_[d], v);
    }
}

bool PhaseRows::max_per_phase(std::uint64_t b, std::uint64_t s, std::uint64_t* vals, bytes_t* out) const {
  const std::size_t D = basis_.size(), P = phases();
  if (!basis_values(basis_, b, s, vals)) return false;
  if (dot(colmax_.data(), vals, D) < (u128{1} << 53)) {
    // Every product and partial sum is an integer below 2^53: exact in doubles, in any order; the
    // rows are summed a block of eight at a time, component by component.
    const std::size_t n = rows(), blocks = (n + kBlock - 1) / kBlock;
    std::array<double, kMaxBasis> v;
    for (std::size_t k = 0; k < D; ++k) v[k] = static_cast<double>(vals[k]);
    std::array<double, kMaxRows + kBlock> acc;
    // a block's eight rows in four pairs of doubles (GCC's and Clang's vector extensions: one SSE2
    // register each, which every x86-64 has; wider vectors spill where the target lacks them)
    using Pair = double __attribute__((vector_size(2 * sizeof(double))));
    static_assert(kBlock == 8);
    for (std::size_t blk = 0; blk < blocks; ++blk) {
      const double* col = &cols_[blk * D * kBlock];
      Pair s0 = {}, s1 = {}, s2 = {}, s3 = {};
      for (std::size_t k = 0; k < D; ++k, col += kBlock) {
        const Pair x = {v[k], v[k]};
        Pair c0, c1, c2, c3;
        std::memcpy(&c0, col, sizeof c0);
        std::memcpy(&c1, col + 2, sizeof c1);
        std::memcpy(&c2, col + 4, sizeof c2);
        std::memcpy(&c3, col + 6, sizeof c3);
        s0 += c0 * x;
        s1 += c1 * x;
        s2 += c2 * x;
        s3 += c3 * x;
      }
      double* a = &acc[blk * kBlock];
      std::memcpy(a, &s0, sizeof s0);
      std::memcpy(a + 2, &s1, sizeof s1);
      std::memcpy(a + 4, &s2, sizeof s2);
      std::memcpy(a + 6, &s3, sizeof s3);
    }
    for (std::size_t p = 0; p < P; ++p) {
      double best[4] = {};  // four independent maxima, not one chain of comparisons
      std::size_t i = begin_[p];
      for (; i + 4 <= begin_[p + 1]; i += 4)
        for (std::size_t q = 0; q < 4; ++q) best[q] = acc[i + q] > best[q] ? acc[i + q] : best[q];
      for (; i < begin_[p + 1]; ++i) best[0] = acc[i] > best[0] ? acc[i] : best[0];
      out[p] = static_cast<bytes_t>(std::max(std::max(best[0], best[1]), std::max(best[2], best[3])));
    }
    return true;
  }
  for (std::size_t p = 0; p < P; ++p) {
    u128 best = 0;
    for (std::uint32_t row = begin_[p]; row < begin_[p + 1]; ++row)
      best = std::max(best, dot(&rows_[std::size_t{row} * D], vals, D));
    if (best > kMax64) return false;
    out[p] = static_cast<bytes_t>(best);
  }
  return true;
}

}  // namespace membudget::detail::plan
