// src/measure/harness_buffer.hpp: pieces shared by the training and inference harnesses
// (internal): the deterministic RNG, an owning allocation of the CachingAllocator, bf16 rounding.
#pragma once

#include <algorithm>
#include <thread>
#include <vector>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "measure/backend.hpp"
#include "membudget/error.hpp"
#include "membudget/spec.hpp"
#include <string>

namespace membudget::measure {

// splitmix64 and Box–Muller: the same parameters and batch on every platform.
struct Rng {
  static constexpr std::uint64_t kGolden = 0x9e3779b97f4a7c15ull;
  std::uint64_t s;
  static std::uint64_t mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  static double to_uniform(std::uint64_t x) { return (static_cast<double>(x >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
  static float box_muller(double u1, double u2) {
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  std::uint64_t next() { return mix(s += kGolden); }
  double uniform() { return to_uniform(next()); }
  float normal() {
    const double u1 = uniform(), u2 = uniform();
    return box_muller(u1, u2);
  }
  // The k-th normal (0-based) of a stream that starts at `seed`, without drawing the ones before.
  static float normal_at(std::uint64_t seed, std::uint64_t k) {
    return box_muller(to_uniform(mix(seed + (2 * k + 1) * kGolden)), to_uniform(mix(seed + (2 * k + 2) * kGolden)));
  }
};

// f(i) for i in [0, n), split over the machine's threads when n is large.
template <class F>
void parallel_for(std::size_t n, F&& f) {
  const std::size_t threads = std::min<std::size_t>(std::max(1u, std::thread::hardware_concurrency()), 32);
  if (n < (1u << 20) || threads == 1) {
    for (std::size_t i = 0; i < n; ++i) f(i);
    return;
  }
  std::vector<std::thread> pool;
  const std::size_t per = (n + threads - 1) / threads;
  for (std::size_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      const std::size_t end = std::min(n, (t + 1) * per);
      for (std::size_t i = t * per; i < end; ++i) f(i);
    });
  for (auto& th : pool) th.join();
}


// An allocation from the CachingAllocator, returned when the Buffer dies.
class Buffer {
 public:
  Buffer() = default;
  Buffer(CachingAllocator& a, std::size_t bytes, DType dtype, const AllocTag& tag)
      : alloc_(&a), ptr_(a.allocate(bytes, tag)), bytes_(bytes), dtype_(dtype) {}
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      alloc_ = o.alloc_;
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      dtype_ = o.dtype_;
      o.ptr_ = nullptr;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void reset() {
    if (ptr_) alloc_->deallocate(ptr_);
    ptr_ = nullptr;
  }
  explicit operator bool() const { return ptr_ != nullptr; }
  View view() const { return {ptr_, dtype_}; }
  float* f32() const { return static_cast<float*>(ptr_); }
  std::int32_t* i32() const { return static_cast<std::int32_t*>(ptr_); }
  std::size_t bytes() const { return bytes_; }

 private:
  CachingAllocator* alloc_ = nullptr;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  DType dtype_ = DType::fp32;
};

// A Buffer for `tensor`, made by `op` during `phase` of step `step`. Running out of memory is
// rethrown with those named, so the harness's OOM report says what it was allocating.
inline Buffer make_buffer(CachingAllocator& alloc, std::size_t bytes, DType dt, const std::string& tensor,
                          const char* op, const std::string& phase, int step) {
  try {
    return Buffer(alloc, bytes, dt, AllocTag{op, tensor, phase});
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::out_of_memory) throw;
    throw Error(ErrorKind::out_of_memory, std::string(e.what()) + "\nharness: step " + std::to_string(step) + ", " +
                                              phase + ", allocating " + tensor + " (" + op + ")");
  }
}

// One phase of a harness step (forward, backward, optimizer; prefill, decode): opening it names the
// phase, synchronises, resets the allocator's peaks (peak = current, as torch.cuda's
// reset_peak_stats) and marks the history; closing it synchronises and reads the phase's allocated
// peak into *peak and the reserved peak into *reserved (the max over the phases). Harness is the
// training or inference harness's Impl: phase, be, alloc, marks, step_index.
template <class Harness>
struct PhaseScope {
  Harness& h;
  bytes_t* peak;
  bytes_t* reserved;
  PhaseScope(Harness& harness, const char* name, bytes_t* out, bytes_t* reserved_peak)
      : h(harness), peak(out), reserved(reserved_peak) {
    h.phase = name;
    h.be.synchronize();
    h.alloc.reset_peak_stats();
    h.marks.push_back({h.step_index, name, h.alloc.history().size()});
  }
  ~PhaseScope() {
    h.be.synchronize();
    const AllocatorStats s = h.alloc.stats();
    *peak = static_cast<bytes_t>(s.allocated.peak);
    *reserved = std::max(*reserved, static_cast<bytes_t>(s.reserved.peak));
  }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;
};

// fp32 → bf16 with round-to-nearest-even (the values here are finite).
inline std::uint16_t to_bf16_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}


enum class Init { normal, ones, zeros };

// Parameter indices of one decoder layer (-1: absent bias).
struct LayerParams {
  int ln1 = -1, q = -1, qb = -1, k = -1, kb = -1, v = -1, vb = -1, o = -1, ob = -1, ln2 = -1;
  int gate = -1, gb = -1, up = -1, ub = -1, down = -1, db = -1;
};

struct ParamLayout {
  int emb = -1;
  std::vector<LayerParams> layers;
  int lnf_w = -1, lm_head = -1;
};

// The decoder's parameter tensors (ModelSpec's tensor description), declared in its order — the
// order both harnesses allocate and initialise them — under their Hugging Face names.
// add(name, numel, init) registers one and returns its index. The harness runs Llama-family
// layers only (check_supported); any other module is a logic error caught here.
template <class Add>
ParamLayout declare_decoder_params(const ModelSpec& m, Add&& add) {
  ParamLayout out;
  const auto outer = m.outer_tensors();
  out.emb = add("embed_tokens.weight", outer.front().elements(), Init::normal);
  out.layers.resize(m.num_layers);
  for (std::size_t l = 0; l < m.num_layers; ++l) {
    auto& p = out.layers[l];
    for (const ParamTensor& t : m.layer_tensors(l)) {
      struct Slot { const char* path; int* weight; int* bias; };
      const Slot slot = [&]() -> Slot {
        switch (t.module) {
          case Module::attn_norm: return {"input_layernorm", &p.ln1, nullptr};
          case Module::q: return {"self_attn.q_proj", &p.q, &p.qb};
          case Module::k: return {"self_attn.k_proj", &p.k, &p.kb};
          case Module::v: return {"self_attn.v_proj", &p.v, &p.vb};
          case Module::o: return {"self_attn.o_proj", &p.o, &p.ob};
          case Module::mlp_norm: return {"post_attention_layernorm", &p.ln2, nullptr};
          case Module::gate: return {"mlp.gate_proj", &p.gate, &p.gb};
          case Module::up: return {"mlp.up_proj", &p.up, &p.ub};
          case Module::down: return {"mlp.down_proj", &p.down, &p.db};
          default: throw Error(ErrorKind::unsupported, std::string("harness: no ") + to_string(t.module) + " in its decoder layer");
        }
      }();
      int* index = t.bias ? slot.bias : slot.weight;
      if (!index) throw Error(ErrorKind::unsupported, std::string("harness: no bias on ") + slot.path);
      const Init init = t.bias ? Init::zeros : t.projection() ? Init::normal : Init::ones;
      *index = add("layers." + std::to_string(l) + "." + slot.path + (t.bias ? ".bias" : ".weight"), t.elements(), init);
    }
  }
  out.lnf_w = add("norm.weight", m.hidden_size, Init::ones);
  out.lm_head = m.tied_embeddings ? out.emb : add("lm_head.weight", outer.back().elements(), Init::normal);
  return out;
}


// Fills a parameter tensor on the device with the values the sequential splitmix64 stream of `seed`
// gives from draw `first` on (normal: 0.02·N(0,1); ones; zeros), computed on several threads, in
// fp32 or bf16. Returns how many normals it drew.
inline std::uint64_t fill_param(Backend& be, View dst, std::size_t n, Init init, std::uint64_t seed,
                                std::uint64_t first, DType dtype) {
  auto value = [&](std::size_t i) {
    return init == Init::normal ? 0.02f * Rng::normal_at(seed, first + i) : (init == Init::ones ? 1.0f : 0.0f);
  };
  if (dtype == DType::fp32) {
    std::vector<float> host(n);
    parallel_for(n, [&](std::size_t i) { host[i] = value(i); });
    be.copy_to_device(dst.data, host.data(), n * 4);
  } else {
    std::vector<std::uint16_t> bits(n);
    parallel_for(n, [&](std::size_t i) { bits[i] = to_bf16_bits(value(i)); });
    be.copy_to_device(dst.data, bits.data(), n * 2);
  }
  return init == Init::normal ? n : 0;
}

// Declares the decoder's parameters into `params` (a P has name, n, init and a Buffer w), allocates
// each in `dt` through alloc(bytes, name) and fills it from the sequential splitmix64 stream of
// `seed`. Returns the layout; `rng` is left where that stream stands after the parameters (the
// training harness draws its batch from there).
template <class P, class Alloc>
ParamLayout build_decoder_params(const ModelSpec& m, Backend& be, std::vector<P>& params, DType dt,
                                 std::uint64_t seed, Rng& rng, Alloc&& alloc) {
  ParamLayout layout = declare_decoder_params(m, [&](std::string name, std::size_t n, Init init) {
    P p;
    p.name = std::move(name);
    p.n = n;
    p.init = init;
    params.push_back(std::move(p));
    return static_cast<int>(params.size()) - 1;
  });
  std::uint64_t drawn = 0;  // normals drawn so far (two uniforms each)
  for (auto& p : params) {
    p.w = alloc(p.n * element_bytes(dt), p.name);
    drawn += fill_param(be, p.w.view(), p.n, p.init, seed, drawn, dt);
  }
  rng.s = seed + 2 * drawn * Rng::kGolden;
  return layout;
}

}  // namespace membudget::measure
