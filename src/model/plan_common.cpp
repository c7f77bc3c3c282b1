// Shared pieces of the compiled plans: see plan_common.hpp.
#include "plan_common.hpp"

#include <algorithm>
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
  cols_.assign(rows_.size(), 0.0);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t d = 0; d < D; ++d) {
      const std::uint64_t v = rows_[i * D + d];
      if (v >= (1ull << 58)) throw Fail{};
      cols_[d * n + i] = static_cast<double>(v);
      colmax_[d] = std::max(colmax_[d], v);
    }
}

bool PhaseRows::max_per_phase(std::uint64_t b, std::uint64_t s, std::uint64_t* vals, bytes_t* out) const {
  const std::size_t D = basis_.size(), P = phases();
  if (!basis_values(basis_, b, s, vals)) return false;
  if (dot(colmax_.data(), vals, D) < (u128{1} << 53)) {
    // Every product and partial sum is an integer below 2^53: exact in doubles; all rows are
    // summed together column by column (vectorised across rows).
    const std::size_t n = rows();
    std::array<double, kMaxRows> acc;
    std::fill_n(acc.begin(), n, 0.0);
    for (std::size_t k = 0; k < D; ++k) {
      const double* col = &cols_[k * n];
      const double v = static_cast<double>(vals[k]);
      for (std::size_t i = 0; i < n; ++i) acc[i] += col[i] * v;
    }
    for (std::size_t p = 0; p < P; ++p) {
      double best = 0;
      for (std::size_t i = begin_[p]; i < begin_[p + 1]; ++i) best = acc[i] > best ? acc[i] : best;
      out[p] = static_cast<bytes_t>(best);
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
