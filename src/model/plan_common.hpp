// src/model/plan_common.hpp: what the compiled plans (step_plan.cpp for training, serve_plan.cpp
// for serving) share: the basis of size classes, classifying a tensor from its sizes at probe
// shapes, pruning dominated vectors, and evaluating per-phase maxima fast and exactly.
//
// A tensor of c · b^i · s^j · (s + 1)^l bytes is counted by the allocator rounded up to 512 B. The
// live bytes at a moment are a sum over a basis: the constant 1, exact terms b^i·s^j·(s+1)^l (all
// tensors whose c is a multiple of 512 share one per monomial, their coefficients summed) and
// round512(c · b^i · s^j · (s+1)^l) per other size class. A moment is a vector of coefficients.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "cuda_reduce.hpp"
#include "membudget/bytes.hpp"

namespace membudget::detail::plan {

using u128 = unsigned __int128;
using i128 = __int128;
inline constexpr u128 kMax64 = std::numeric_limits<std::uint64_t>::max();
inline constexpr std::size_t kMaxBasis = 32;
inline constexpr std::size_t kMaxRows = 1024;  // rows of all phases together

struct Fail {};  // a check failed: no plan

struct Probe {
  std::uint64_t b, s;
};

enum class Kind : std::uint8_t { constant, exact, rounded, launch };
struct Basis {
  Kind kind = Kind::constant;
  std::uint8_t i = 0, j = 0, l = 0;  // b^i · s^j · (s + 1)^l
  bytes_t c = 0;                     // rounded: the size class's coefficient
  // launch: a kernel's temporary (cuda_reduce.hpp), launch_bytes of its arguments, each
  // launch.args[k] · b^arg_i[k] · s^arg_j[k], rounded up to 512
  LaunchSize launch{};
  std::array<std::uint8_t, 3> arg_i{}, arg_j{};
  bool operator==(const Basis&) const = default;
};

// b^i · s^j · (s + 1)^l, saturated at 2^64 ("does not fit").
u128 monomial(std::uint64_t b, unsigned i, std::uint64_t s, unsigned j, unsigned l = 0);
inline u128 sat_mul(u128 a, u128 b) {
  constexpr u128 kOver = kMax64 + 1;  // saturation value
  if (a == 0 || b == 0) return 0;
  if (a >= kOver || b >= kOver) return kOver;
  std::uint64_t r;
  if (__builtin_mul_overflow(static_cast<std::uint64_t>(a), static_cast<std::uint64_t>(b), &r)) return kOver;
  return r;
}
// The monomial c · b^i · s^j (i, j ≤ 3) whose sizes at the probes are v[k] (v.size() == p.size() ≥ 3,
// p[1] = (2·b0, 3·s0)): v[1] / v[0] = 2^i · 3^j names it, c = v[0] / (b0^i · s0^j), and every probe
// after the second checks it. c = 0 when every size is 0. Throws Fail for any other pattern.
struct Monomial {
  bytes_t c = 0;
  unsigned i = 0, j = 0;
};
Monomial fit_monomial(std::span<const bytes_t> v, std::span<const Probe> p);
// The basis at (b, s); false when a component does not fit 64 bits.
bool basis_values(const std::vector<Basis>& basis, std::uint64_t b, std::uint64_t s, std::uint64_t* out);
// A launch component (Kind::launch) fitted to a temporary's arguments at the probes (Fail when an
// argument is not a monomial or the rule differs), and its bytes at (b, s) before the allocator's
// rounding (false when they do not fit 64 bits).
Basis fit_launch(std::span<const LaunchSize> at_probes, std::span<const Probe> p);
bool launch_value(const Basis& e, std::uint64_t b, std::uint64_t s, bytes_t* out);
inline u128 dot(const std::uint64_t* row, const std::uint64_t* vals, std::size_t n) {
  u128 acc = 0;
  for (std::size_t k = 0; k < n; ++k) acc += static_cast<u128>(row[k]) * vals[k];
  return acc;
}

// What one tensor adds to a live vector: coef[k] times component[k], for k < n (n = 0: nothing).
struct Contribution {
  std::uint8_t n = 0;
  std::array<int, 4> component{};
  std::array<std::uint64_t, 4> coef{};
  // Adds (alloc) or removes the tensor; false when removing more than is there.
  bool apply(std::uint64_t* v, bool alloc) const {
    for (std::uint8_t k = 0; k < n; ++k) {
      if (!alloc && v[component[k]] < coef[k]) return false;
      v[component[k]] = alloc ? v[component[k]] + coef[k] : v[component[k]] - coef[k];
    }
    return true;
  }
};
// The contribution of a tensor of c · b^i · s^j · (s+1)^l bytes, adding its class to `basis`
// (component 0 must be the constant). An exact term in s + 1 is expanded into monomials of s
// (b·(s+1) = b·s + b), so that a vector with more of it dominates one with less. Throws Fail when
// the basis would exceed kMaxBasis.
Contribution contribution(bytes_t c, unsigned i, unsigned j, unsigned l, std::vector<Basis>& basis);
// The contribution of a launch-sized temporary (fit_launch's component, once).
Contribution launch_contribution(const Basis& launch, std::vector<Basis>& basis);

// The live vector while replaying an allocation stream: apply(t, alloc) adds or removes tensor t's
// contribution. Throws Fail for a stream that frees what is not live (or allocates twice).
struct LiveVector {
  std::vector<std::uint64_t> cur;
  std::vector<char> alive;
  LiveVector(std::size_t D, std::size_t tensors) : cur(D, 0), alive(tensors, 0) {}
  void apply(std::size_t t, bool alloc, const std::vector<Contribution>& con) {
    if (t >= con.size() || static_cast<bool>(alive[t]) == alloc) throw Fail{};
    alive[t] = alloc;
    if (!con[t].apply(cur.data(), alloc)) throw Fail{};
  }
};

// Keeps the vectors (D each) no other vector dominates componentwise.
std::vector<std::uint64_t> prune(const std::vector<std::uint64_t>& rows, std::size_t D,
                                 const std::vector<std::uint64_t>& weight);

// Vectors grouped by phase over one basis; the maximum of each phase at (b, s).
class PhaseRows {
 public:
  // per_phase[p]: phase p's vectors, D = basis.size() each (already pruned or not). Throws Fail
  // when an entry is 2^58 or more (dot products must stay inside 128 bits) or there are more than
  // kMaxRows vectors.
  void set(std::vector<Basis> basis, const std::vector<std::vector<std::uint64_t>>& per_phase);
  // out[p] = phase p's maximum; vals receives the basis at (b, s). false when something does not
  // fit 64 bits.
  bool max_per_phase(std::uint64_t b, std::uint64_t s, std::uint64_t* vals, bytes_t* out) const;
  // An upper bound of every phase's maximum at (b, s): the componentwise maximum of all rows dotted
  // with the basis (a few multiply-adds). Saturates at 2^64 − 1 where the basis does not fit.
  bytes_t upper_bound(std::uint64_t b, std::uint64_t s) const;
  const std::vector<Basis>& basis() const { return basis_; }
  std::size_t phases() const { return begin_.empty() ? 0 : begin_.size() - 1; }
  std::size_t rows() const { return basis_.empty() ? 0 : rows_.size() / basis_.size(); }

 private:
  std::vector<Basis> basis_;
  std::vector<std::uint64_t> rows_;   // row-major
  std::vector<std::uint32_t> begin_;  // rows of phase p: [begin_[p], begin_[p + 1])
  // The rows again as doubles in blocks of kBlock rows, each block column-major (component k of
  // the block's row i at block · D · kBlock + k · kBlock + i; missing rows are zeros): when no sum
  // can reach 2^53 they are exact, and a block's kBlock sums stay in registers while its
  // components stream past, a fixed-width loop the compiler vectorises.
  //   * At most kSumAll rows: the blocks are consecutive rows, and every sum is made.
  //   * More (bounded_): each phase's rows start a block of their own (block_begin_[p] is its
  //     first), and each block's componentwise maximum is kept as a row of bound_cols_ (block j is
  //     row j % kBlock of bound block j / kBlock, the same layout): its dot product bounds every
  //     row of block j, so a block whose bound does not pass the best so far is not summed.
  static constexpr std::size_t kBlock = 8, kSumAll = 8 * kBlock;
  bool bounded_ = false;
  std::vector<double> cols_;
  std::vector<std::uint32_t> block_begin_;
  std::vector<double> bound_cols_;
  std::vector<std::uint64_t> colmax_;  // the largest entry of each component
  void maxima(const double* v, bytes_t* out) const;
};

}  // namespace membudget::detail::plan
