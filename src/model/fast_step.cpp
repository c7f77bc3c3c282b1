// The fast path of the torch training step: the same simulation, run on 4-, 5- and 6-layer copies
// of the model and extrapolated exactly to the model's layer count.
//
// Why this is exact. Decoder layers are structurally identical, so every allocation of the step
// belongs to one section (before the layers, layer i, after the layers; AutogradSim tags them, and
// backward runs each node in the section that recorded it). At an allocation inside layer i of an
// L-layer model, the live bytes are: parameters (affine in L) + what the earlier layers left
// (affine in i: saved tensors, autocast copies, or in backward the gradients of the later layers,
// affine in L − i) + the layer's own tensors (independent of i and L). So the largest live value of
// a section is affine in L for the sections before and after the layers and for the first and last
// layers, and affine in (L, i) for the interior layers, whose maximum is at i = 1 or i = L − 2.
// A phase's peak is the maximum of those six affine functions evaluated at L; the scalars (weights,
// gradients, floor, saved bytes per name) are affine in L. The optimizer is sized from the full
// model in every small simulation.
//
// Every call checks what it assumes: each function must be affine over L = 4, 5, 6 (two points fit
// it, the third verifies), the interior layers must be affine in i, and every phase peak must equal
// the maximum of its sections. When a check fails (a future inventory with alternating layer types,
// for instance) the full simulation runs instead. tests/test_fast_path.cpp asserts equality with the
// full simulation over every shipped config, recipe and shape.
#include <algorithm>
#include <array>
#include <atomic>
#include <limits>

#include "inventory.hpp"

namespace membudget::detail {
namespace {

using i128 = __int128;
struct NotAffine {};

constexpr std::uint64_t kL0 = 4;  // the small simulations have kL0, kL0 + 1, kL0 + 2 layers

bytes_t extrapolate(bytes_t v0, bytes_t v1, bytes_t v2, std::uint64_t L) {
  const i128 a = v0, b = v1, c = v2;
  if (c - b != b - a) throw NotAffine{};
  const i128 v = c + (b - a) * (static_cast<i128>(L) - static_cast<i128>(kL0 + 2));
  if (v < 0 || v > static_cast<i128>(std::numeric_limits<bytes_t>::max())) throw NotAffine{};
  return static_cast<bytes_t>(v);
}

bytes_t section(const std::vector<bytes_t>& s, std::size_t i) { return i < s.size() ? s[i] : 0; }

// The six section groups of one phase of a simulation with Ls layers, after checking that the
// interior layers are affine in their index and that the phase peak is their maximum.
std::array<bytes_t, 6> groups(const std::vector<bytes_t>& s, std::uint64_t Ls, bytes_t phase_peak) {
  for (std::size_t i = 3; i + 1 <= Ls - 1; ++i)  // interior layers 1..Ls-2 are sections 2..Ls-1
    if (static_cast<i128>(section(s, i + 1)) - section(s, i) != static_cast<i128>(section(s, i)) - section(s, i - 1))
      throw NotAffine{};
  bytes_t mx = 0;
  for (bytes_t v : s) mx = std::max(mx, v);
  if (mx != phase_peak || s.size() > Ls + 2) throw NotAffine{};
  return {section(s, 0), section(s, 1), section(s, 2), section(s, Ls - 1), section(s, Ls), section(s, Ls + 1)};
}

std::vector<PhasePeak> extrapolate_phases(const TorchStepResult (&r)[3], bool steady, std::uint64_t L) {
  auto phases_of = [&](int k) -> const std::vector<PhasePeak>& { return steady ? r[k].steady : r[k].step0; };
  auto sections_of = [&](int k) -> const std::vector<std::vector<bytes_t>>& {
    return steady ? r[k].steady_sections : r[k].step0_sections;
  };
  const auto& p2 = phases_of(2);
  for (int k = 0; k < 2; ++k)
    if (phases_of(k).size() != p2.size() || sections_of(k).size() != p2.size()) throw NotAffine{};
  if (sections_of(2).size() != p2.size()) throw NotAffine{};
  std::vector<PhasePeak> out(p2.size());
  for (std::size_t j = 0; j < p2.size(); ++j) {
    out[j].name = p2[j].name;
    for (int k = 0; k < 3; ++k)
      if (phases_of(k)[j].name != p2[j].name) throw NotAffine{};
    if (j == 0) {  // the floor: one value, not a maximum over sections
      out[j].bytes = extrapolate(phases_of(0)[0].bytes, phases_of(1)[0].bytes, phases_of(2)[0].bytes, L);
      continue;
    }
    std::array<bytes_t, 6> g[3];
    for (int k = 0; k < 3; ++k) g[k] = groups(sections_of(k)[j], kL0 + k, phases_of(k)[j].bytes);
    bytes_t peak = 0;
    for (std::size_t q = 0; q < 6; ++q) peak = std::max(peak, extrapolate(g[0][q], g[1][q], g[2][q], L));
    out[j].bytes = peak;
  }
  return out;
}

std::vector<TensorBytes> extrapolate_groups(const std::vector<TensorBytes>& a, const std::vector<TensorBytes>& b,
                                            const std::vector<TensorBytes>& c, std::uint64_t L) {
  if (a.size() != c.size() || b.size() != c.size()) throw NotAffine{};
  std::vector<TensorBytes> out = c;
  for (std::size_t i = 0; i < c.size(); ++i) {
    if (a[i].name != c[i].name || b[i].name != c[i].name) throw NotAffine{};
    out[i].count = extrapolate(a[i].count, b[i].count, c[i].count, L);
    out[i].bytes = extrapolate(a[i].bytes, b[i].bytes, c[i].bytes, L);
  }
  return out;
}

TorchStepResult extrapolate_step(const ModelSpec& m, const Job& job) {
  const std::uint64_t L = m.num_layers;
  TorchStepResult r[3];
  ModelSpec small = m;
  for (int k = 0; k < 3; ++k) {
    small.num_layers = kL0 + k;
    r[k] = simulate_torch_train(small, job, false, &m);
  }
  TorchStepResult out;
  out.steady = extrapolate_phases(r, true, L);
  out.step0 = extrapolate_phases(r, false, L);
  auto scalar = [&](bytes_t TorchStepResult::*field) {
    return extrapolate(r[0].*field, r[1].*field, r[2].*field, L);
  };
  out.weights = scalar(&TorchStepResult::weights);
  out.gradients = scalar(&TorchStepResult::gradients);
  out.optimizer_state = scalar(&TorchStepResult::optimizer_state);
  out.master = scalar(&TorchStepResult::master);
  out.after_forward_activations = scalar(&TorchStepResult::after_forward_activations);
  out.after_forward_logits = scalar(&TorchStepResult::after_forward_logits);
  out.after_forward_autocast = scalar(&TorchStepResult::after_forward_autocast);
  out.saved = extrapolate_groups(r[0].saved, r[1].saved, r[2].saved, L);
  out.saved_logits = extrapolate_groups(r[0].saved_logits, r[1].saved_logits, r[2].saved_logits, L);
  return out;
}

std::atomic<std::uint64_t> g_fallbacks{0};

}  // namespace

std::uint64_t fast_path_fallbacks() { return g_fallbacks.load(std::memory_order_relaxed); }

TorchStepResult simulate_torch_train_fast(const ModelSpec& m, const Job& job) {
  if (m.num_layers <= kL0 + 2) return simulate_torch_train(m, job, false);
  try {
    return extrapolate_step(m, job);
  } catch (const NotAffine&) {
    g_fallbacks.fetch_add(1, std::memory_order_relaxed);
    return simulate_torch_train(m, job, false);
  }
}

}  // namespace membudget::detail
