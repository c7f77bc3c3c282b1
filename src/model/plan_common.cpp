// Shared pieces of the compiled plans: see plan_common.hpp.
#include "plan_common.hpp"

#include <algorithm>
#include <cstring>
#include <array>
#include <numeric>

namespace membudget::detail::plan {

u128 monomial(std::uint64_t b, unsigned i, std::uint64_t s, unsigned j, unsigned l) {
  u128 v = 1;
  for (unsigned k = 0; k < i; ++k) v = sat_mul(v, b);
  for (unsigned k = 0; k < j; ++k) v = sat_mul(v, s);
  for (unsigned k = 0; k < l; ++k) v = sat_mul(v, static_cast<u128>(s) + 1);
  return v;
}

Monomial fit_monomial(std::span<const bytes_t> v, std::span<const Probe> p) {
  if (v.size() != p.size() || v.size() < 3) throw Fail{};
  if (v[0] == 0) {
    for (bytes_t x : v)
      if (x) throw Fail{};
    return {};
  }
  if (v[1] % v[0]) throw Fail{};
  std::uint64_t r = v[1] / v[0];
  unsigned i = 0, j = 0;
  while (r % 2 == 0 && i <= 3) r /= 2, ++i;
  while (r % 3 == 0 && j <= 3) r /= 3, ++j;
  if (r != 1 || i > 3 || j > 3) throw Fail{};
  const u128 m0 = monomial(p[0].b, i, p[0].s, j);
  if (m0 > kMax64 || v[0] % static_cast<std::uint64_t>(m0)) throw Fail{};
  const bytes_t c = v[0] / static_cast<std::uint64_t>(m0);
  for (std::size_t k = 2; k < p.size(); ++k)  // (the second probe holds by construction)
    if (sat_mul(c, monomial(p[k].b, i, p[k].s, j)) != v[k]) throw Fail{};
  return {c, i, j};
}

bool basis_values(const std::vector<Basis>& basis, std::uint64_t b, std::uint64_t s, std::uint64_t* out) {
  // In 64 bits with an overflow flag: what monomial() and sat_mul() give (a zero factor makes 0
  // whatever else overflowed), without their 128-bit steps.
  const bool s1_over = s == std::numeric_limits<std::uint64_t>::max();  // s + 1 = 2^64
  for (std::size_t k = 0; k < basis.size(); ++k) {
    const auto& e = basis[k];
    std::uint64_t v = 1;
    bool over = false, zero = false;
    auto times = [&](std::uint64_t x) {
      if (x == 0) zero = true;
      else over |= __builtin_mul_overflow(v, x, &v);
    };
    if (e.kind == Kind::launch) {
      bytes_t raw = 0;
      if (!launch_value(e, b, s, &raw) || raw > std::numeric_limits<std::uint64_t>::max() - 511) return false;
      out[k] = (raw + 511) / 512 * 512;
      continue;
    }
    if (e.kind != Kind::constant) {
      for (unsigned n = 0; n < e.i; ++n) times(b);
      for (unsigned n = 0; n < e.j; ++n) times(s);
      for (unsigned n = 0; n < e.l; ++n) {
        if (s1_over) over = true;
        else times(s + 1);
      }
    }
    if (e.kind == Kind::rounded) {
      times(e.c);
      if (!zero && !over) {
        if (v > std::numeric_limits<std::uint64_t>::max() - 511) return false;  // rounds to 2^64
        v = (v + 511) / 512 * 512;
      }
    }
    if (zero) v = 0;
    else if (over) return false;
    out[k] = v;
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

Basis fit_launch(std::span<const LaunchSize> at_probes, std::span<const Probe> p) {
  if (at_probes.empty() || at_probes.size() != p.size()) throw Fail{};
  Basis e;
  e.kind = Kind::launch;
  e.launch = at_probes[0];
  for (std::size_t k = 0; k < 3; ++k) {
    std::array<bytes_t, 8> v{};
    if (p.size() > v.size()) throw Fail{};
    for (std::size_t q = 0; q < p.size(); ++q) {
      if (at_probes[q].kind != e.launch.kind || at_probes[q].along_fastest != e.launch.along_fastest) throw Fail{};
      v[q] = at_probes[q].args[k];
    }
    const Monomial mo = fit_monomial(std::span<const bytes_t>(v.data(), p.size()), p);
    e.launch.args[k] = mo.c;
    e.arg_i[k] = static_cast<std::uint8_t>(mo.i);
    e.arg_j[k] = static_cast<std::uint8_t>(mo.j);
  }
  return e;
}

bool launch_value(const Basis& e, std::uint64_t b, std::uint64_t s, bytes_t* out) {
  LaunchSize at = e.launch;
  for (std::size_t k = 0; k < 3; ++k) {
    std::uint64_t v = at.args[k];
    for (unsigned n = 0; n < e.arg_i[k]; ++n)
      if (__builtin_mul_overflow(v, b, &v)) return false;
    for (unsigned n = 0; n < e.arg_j[k]; ++n)
      if (__builtin_mul_overflow(v, s, &v)) return false;
    at.args[k] = v;
  }
  // a reduction's buffer and semaphores come in pairs of components with the same arguments:
  // the kernel's configuration is worked out once for both
  thread_local LaunchSize last_at;
  thread_local bytes_t last_bytes[2] = {0, 0};
  const bool reduce = at.kind == LaunchSize::Kind::reduce_buffer || at.kind == LaunchSize::Kind::reduce_semaphores;
  if (reduce) {
    LaunchSize key = at;
    key.kind = LaunchSize::Kind::reduce_buffer;
    if (!(key == last_at)) {
      try {
        const ReduceStaging r = cuda_reduce_staging(at.args[0], at.args[1], at.along_fastest, at.args[2]);
        last_bytes[0] = r.buffer;
        last_bytes[1] = r.semaphores;
      } catch (const Error&) {  // past 2^64
        last_at = {};
        return false;
      }
      last_at = key;
    }
    *out = last_bytes[at.kind == LaunchSize::Kind::reduce_semaphores ? 1 : 0];
    return true;
  }
  try {
    *out = launch_bytes(at);
  } catch (const Error&) {  // past 2^64
    return false;
  }
  return true;
}

Contribution launch_contribution(const Basis& launch, std::vector<Basis>& basis) {
  Contribution out;
  out.component[0] = find_or_add(basis, launch);
  out.coef[0] = 1;
  out.n = 1;
  return out;
}

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

namespace {
constexpr std::size_t kBlockRows = 8;
// a block's eight sums in four pairs of doubles (GCC's and Clang's vector extensions: one SSE2
// register each, which every x86-64 has; wider vectors spill where the target lacks them)
using Pair = double __attribute__((vector_size(2 * sizeof(double))));

// out[0..8) = the eight rows of a column-major block (D components of kBlockRows each) times v.
// Even and odd components go to separate sums, added at the end: two dependency chains of D / 2
// additions each rather than one of D (the sums are exact integers, so the order changes nothing).
inline void block_sums(const double* col, const double* v, std::size_t D, double* out) {
  Pair e0 = {}, e1 = {}, e2 = {}, e3 = {}, o0 = {}, o1 = {}, o2 = {}, o3 = {};
  auto fma4 = [](const double* c, double x, Pair& a0, Pair& a1, Pair& a2, Pair& a3) {
    const Pair xx = {x, x};
    Pair c0, c1, c2, c3;
    std::memcpy(&c0, c, sizeof c0);
    std::memcpy(&c1, c + 2, sizeof c1);
    std::memcpy(&c2, c + 4, sizeof c2);
    std::memcpy(&c3, c + 6, sizeof c3);
    a0 += c0 * xx;
    a1 += c1 * xx;
    a2 += c2 * xx;
    a3 += c3 * xx;
  };
  std::size_t k = 0;
  for (; k + 2 <= D; k += 2, col += 2 * kBlockRows) {
    fma4(col, v[k], e0, e1, e2, e3);
    fma4(col + kBlockRows, v[k + 1], o0, o1, o2, o3);
  }
  if (k < D) fma4(col, v[k], e0, e1, e2, e3);
  e0 += o0;
  e1 += o1;
  e2 += o2;
  e3 += o3;
  std::memcpy(out, &e0, sizeof e0);
  std::memcpy(out + 2, &e1, sizeof e1);
  std::memcpy(out + 4, &e2, sizeof e2);
  std::memcpy(out + 6, &e3, sizeof e3);
}

double max8(const double* a) {
  const double x = std::max(std::max(a[0], a[1]), std::max(a[2], a[3]));
  const double y = std::max(std::max(a[4], a[5]), std::max(a[6], a[7]));
  return std::max(x, y);
}
}  // namespace

void PhaseRows::set(std::vector<Basis> basis, const std::vector<std::vector<std::uint64_t>>& per_phase) {
  static_assert(kBlock == kBlockRows);
  basis_ = std::move(basis);
  const std::size_t D = basis_.size();
  rows_.clear();
  begin_.clear();
  colmax_.assign(D, 0);
  for (const auto& p : per_phase) {
    if (p.empty()) throw Fail{};
    begin_.push_back(static_cast<std::uint32_t>(rows_.size() / D));
    rows_.insert(rows_.end(), p.begin(), p.end());
  }
  begin_.push_back(static_cast<std::uint32_t>(rows_.size() / D));
  const std::size_t n = rows_.size() / D;
  if (n > kMaxRows) throw Fail{};
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t d = 0; d < D; ++d) {
      if (rows_[i * D + d] >= (1ull << 58)) throw Fail{};
      colmax_[d] = std::max(colmax_[d], rows_[i * D + d]);
    }
  // The blocks: consecutive rows, or each phase's rows from a block of their own on.
  bounded_ = n > kSumAll;
  block_begin_.clear();
  std::vector<std::uint32_t> first_row;  // of each block
  for (std::size_t p = 0; p + 1 < begin_.size(); ++p) {
    block_begin_.push_back(static_cast<std::uint32_t>(first_row.size()));
    const std::uint32_t from = bounded_ || p == 0 ? begin_[p] : first_row.back() + kBlock;
    for (std::uint32_t r = from; r < (bounded_ ? begin_[p + 1] : n); r += kBlock) first_row.push_back(r);
    if (!bounded_) break;
  }
  const std::size_t blocks = first_row.size();
  block_begin_.resize(phases() + 1, static_cast<std::uint32_t>(blocks));
  if ((blocks + kBlock - 1) / kBlock * kBlock > kMaxRows) throw Fail{};  // the sums' arrays
  cols_.assign(blocks * D * kBlock, 0.0);
  bound_cols_.assign(bounded_ ? (blocks + kBlock - 1) / kBlock * D * kBlock : 0, 0.0);
  for (std::size_t j = 0; j < blocks; ++j) {
    const std::uint32_t end = bounded_ ? begin_[std::upper_bound(begin_.begin(), begin_.end(), first_row[j]) - begin_.begin()]
                                       : static_cast<std::uint32_t>(n);
    for (std::uint32_t r = first_row[j]; r < std::min<std::uint32_t>(end, first_row[j] + kBlock); ++r)
      for (std::size_t d = 0; d < D; ++d) {
        const double v = static_cast<double>(rows_[r * D + d]);
        cols_[j * D * kBlock + d * kBlock + (r - first_row[j])] = v;
        if (bounded_) {
          double& bound = bound_cols_[(j / kBlock) * D * kBlock + d * kBlock + j % kBlock];
          bound = std::max(bound, v);
        }
      }
  }
}

// The maximum of each phase (`out`, P entries) from the doubles; the caller checked that every
// sum stays below 2^53.
void PhaseRows::maxima(const double* v, bytes_t* out) const {
  const std::size_t D = basis_.size(), P = phases(), blocks = cols_.size() / (D * kBlock);
  std::array<double, kMaxRows> acc;  // set() checked that the blocks fit
  if (!bounded_) {  // few rows: every sum, then each phase's maximum
    for (std::size_t j = 0; j < blocks; ++j) block_sums(&cols_[j * D * kBlock], v, D, &acc[j * kBlock]);
    auto max_of = [&](std::size_t from, std::size_t to) {
      double best[4] = {};  // four independent maxima, not one chain of comparisons
      std::size_t i = from;
      for (; i + 4 <= to; i += 4)
        for (std::size_t q = 0; q < 4; ++q) best[q] = acc[i + q] > best[q] ? acc[i + q] : best[q];
      for (; i < to; ++i) best[0] = acc[i] > best[0] ? acc[i] : best[0];
      return static_cast<bytes_t>(std::max(std::max(best[0], best[1]), std::max(best[2], best[3])));
    };
    for (std::size_t p = 0; p < P; ++p) out[p] = max_of(begin_[p], begin_[p + 1]);
    return;
  }
  // many rows: the blocks' bounds, then per phase the block with the highest bound, whose best row
  // usually leaves the others no room, and only the blocks whose bound passes it
  for (std::size_t j = 0; j < blocks; j += kBlock) block_sums(&bound_cols_[(j / kBlock) * D * kBlock], v, D, &acc[j]);
  std::array<double, kBlock> sums;
  auto best_of = [&](std::size_t from, std::size_t to) {
    std::size_t top = from;
    for (std::size_t j = from + 1; j < to; ++j) top = acc[j] > acc[top] ? j : top;
    block_sums(&cols_[top * D * kBlock], v, D, sums.data());
    double best = max8(sums.data());
    for (std::size_t j = from; j < to; ++j) {
      if (j == top || acc[j] <= best) continue;
      block_sums(&cols_[j * D * kBlock], v, D, sums.data());
      best = std::max(best, max8(sums.data()));
    }
    return static_cast<bytes_t>(best);
  };
  for (std::size_t p = 0; p < P; ++p) out[p] = best_of(block_begin_[p], block_begin_[p + 1]);
}

bytes_t PhaseRows::upper_bound(std::uint64_t b, std::uint64_t s) const {
  std::array<std::uint64_t, kMaxBasis> vals;
  if (!basis_values(basis_, b, s, vals.data())) return kMax64;
  const u128 bound = dot(colmax_.data(), vals.data(), basis_.size());
  return bound > kMax64 ? kMax64 : static_cast<bytes_t>(bound);
}

bool PhaseRows::max_per_phase(std::uint64_t b, std::uint64_t s, std::uint64_t* vals, bytes_t* out) const {
  const std::size_t D = basis_.size(), P = phases();
  if (!basis_values(basis_, b, s, vals)) return false;
  if (dot(colmax_.data(), vals, D) < (u128{1} << 53)) {
    // Every product and partial sum is an integer below 2^53 (the bounds' too: their entries are
    // at most colmax_'s): exact in doubles, in any order.
    std::array<double, kMaxBasis> v;
    for (std::size_t k = 0; k < D; ++k) v[k] = static_cast<double>(vals[k]);
    maxima(v.data(), out);
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
