// Causal attention with GQA on bf16 tensor cores, FlashAttention-2 style, written for this project
// with warp-level mma.sync (m16n8k16, bf16 in, fp32 accumulate) through inline PTX.
//
// Forward (also the inference kernel over a KV cache): one block of 4 warps per (64 queries, head,
// sequence); each warp owns 16 query rows. The warp's Q fragments, the running max and sum and the
// fp32 output accumulator live in registers for the whole key loop. K/V tiles of 64 keys are
// double-buffered in shared memory with cp.async, so the next tile loads while this one computes.
// Scores stay in the mma accumulator layout, which is also the A-operand layout of P·V once packed
// to bf16: P never touches shared memory. Tiles past the diagonal are never visited; only the
// tiles that straddle it are masked. GQA: head h reads kv head h / (heads / kv_heads).
//
// Backward, saving nothing but the forward's log-sum-exp (no workspace beyond the harness's delta):
//   delta = rowsum(dO ∘ O) (one warp per row);
//   dK/dV: one block per (64 keys, kv head, sequence); each warp owns 16 keys and keeps its dK, dV
//     accumulators in registers while the block loops over the group's query heads and the query
//     tiles at or after the key tile (Q, dO, lse and delta tiles double-buffered with cp.async).
//     Per tile it recomputes Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ once, forms Pᵀ and dSᵀ = Pᵀ∘(dPᵀ − delta) in
//     registers and adds Pᵀ·dO to dV and dSᵀ·Q to dK;
//   dQ: one block per (64 queries, head, sequence), the forward's loop with S and dP recomputed,
//     dS formed in registers and dS·K added to the register accumulator.
// No atomics: every output element has exactly one writer, so results are deterministic.
//
// fp32 inputs (the fp32 recipe) are rounded to bf16 as they enter shared memory (a plain load
// instead of cp.async); every softmax statistic is fp32 and exponentials are base 2 (exp2f).
#include <cstdlib>
#include <cstring>

#include "measure/cuda/attention_common.cuh"
#include "measure/cuda/common.cuh"

namespace membudget::measure::cuda {

namespace {

constexpr int kTile = 64;  // queries per block, keys per tile (and keys per dK/dV block)
constexpr int kWarps = 4;  // 16 rows each
constexpr int kThreads = 32 * kWarps;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shared tiles are 64 rows of HD bf16 padded by 16 bytes: consecutive rows start 16 bytes apart
// modulo 128, so the eight row addresses of an ldmatrix phase fall in distinct banks.
template <int HD>
struct Tl {
  static constexpr int ld = HD + 8;              // elements per row
  static constexpr int elems = kTile * ld;       // elements per tile
  static constexpr std::size_t bytes = elems * 2;
};

// ---- PTX wrappers ----
__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}
// Four 8×8 b16 matrices; lane i gives the address of row i % 8 of matrix i / 8. Register j holds,
// in each lane, row lane / 4, columns 2·(lane % 4) and +1 of matrix j (.trans: its transpose).
__device__ __forceinline__ void ldsm4(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldsm4_t(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
// c(16×8, fp32) += a(16×16, bf16, row) · b(16×8, bf16, col). Fragments (g = lane / 4, t = lane % 4):
// a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..); b0 (k 2t..2t+1, n g),
// b1 (k 2t+8.., n g); c0,c1 (g, 2t..2t+1), c2,c3 (g+8, 2t..2t+1).
__device__ __forceinline__ void mma(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ std::uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low half
  std::uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}
// 16 bytes global → shared without passing through registers; valid false zero-fills.
__device__ __forceinline__ void cp_async16(std::uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async4(std::uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Rows [row0, row0 + 64) of a (·, stride) tensor into a shared tile; rows at or past `rows` are zero.
// bf16: cp.async (complete after cp_wait + __syncthreads); fp32: rounded to bf16 by plain stores.
template <class T, int HD>
__device__ __forceinline__ void load_tile(bf16* dst, const T* src, int row0, int rows, std::size_t stride) {
  constexpr int ld = Tl<HD>::ld;
  if constexpr (sizeof(T) == 2) {
    constexpr int vec = HD / 8;
    for (int idx = threadIdx.x; idx < kTile * vec; idx += kThreads) {
      const int r = idx / vec, c = (idx % vec) * 8;
      const bool ok = row0 + r < rows;
      const T* p = ok ? src + std::size_t(row0 + r) * stride + c : src;
      cp_async16(smem_addr(dst + r * ld + c), p, ok);
    }
  } else {
    constexpr int vec = HD / 2;
    for (int idx = threadIdx.x; idx < kTile * vec; idx += kThreads) {
      const int r = idx / vec, c = (idx % vec) * 2;
      float2 x = make_float2(0.0f, 0.0f);
      if (row0 + r < rows) x = *reinterpret_cast<const float2*>(src + std::size_t(row0 + r) * stride + c);
      *reinterpret_cast<__nv_bfloat162*>(dst + r * ld + c) = __floats2bfloat162_rn(x.x, x.y);
    }
  }
}
// The K/V double buffer of a loop over key tiles: while tile `it` (buffer it & 1) is used, the
// next tile starts loading into the other buffer; then waits until tile `it` has landed and every
// thread sees it. Keys past `rows` are zero.
template <class T, int HD>
__device__ __forceinline__ void next_kv_tile(bf16* Ks, bf16* Vs, int te, int it, int ntiles, const T* kb, const T* vb,
                                             int next_row0, int rows, std::size_t stride) {
  if (it + 1 < ntiles) {
    load_tile<T, HD>(Ks + ((it + 1) & 1) * te, kb, next_row0, rows, stride);
    load_tile<T, HD>(Vs + ((it + 1) & 1) * te, vb, next_row0, rows, stride);
    cp_commit();
    cp_wait<1>();
  } else {
    cp_wait<0>();
  }
  __syncthreads();
}

// 64 fp32 statistics (lse or delta) of one (sequence, head) row into shared memory, 0 past `n`.
__device__ __forceinline__ void load_stats(float* dst, const float* src, int i0, int n) {
  const int i = threadIdx.x;
  if (i < kTile) cp_async4(smem_addr(dst + i), i0 + i < n ? src + i0 + i : src, i0 + i < n);
}

template <class T>
__device__ __forceinline__ void store2(T* p, float a, float b) {
  if constexpr (sizeof(T) == 2) *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
  else *reinterpret_cast<float2*>(p) = make_float2(a, b);
}

// Lane addresses for ldmatrix.x4 over a row-major shared tile (ld elements per row):
// A operand rows [r0, r0+16) × columns [c0, c0+16): matrices (r0, c0), (r0+8, c0), (r0, c0+8), (r0+8, c0+8).
__device__ __forceinline__ std::uint32_t a_addr(const bf16* tile, int ld, int r0, int c0) {
  const int lane = threadIdx.x % 32;
  return smem_addr(tile + (r0 + (lane % 8) + ((lane / 8) % 2) * 8) * ld + c0 + (lane / 16) * 8);
}
// B operand, when B[k][n] = tile[n][k] (scores: B = Kᵀ): rows n0..n0+15 of the tile, columns k0..k0+15.
// Registers: (b0, b1) of n-block n0, then (b0, b1) of n-block n0 + 8.
__device__ __forceinline__ std::uint32_t bt_addr(const bf16* tile, int ld, int n0, int k0) {
  const int lane = threadIdx.x % 32;
  return smem_addr(tile + (n0 + (lane % 8) + (lane / 16) * 8) * ld + k0 + ((lane / 8) % 2) * 8);
}
// B operand, when B[k][n] = tile[k][n] (P·V: B = V), read with .trans: rows k0..k0+15, columns
// n0..n0+15. Registers: (b0, b1) of n-block n0, then (b0, b1) of n-block n0 + 8.
__device__ __forceinline__ std::uint32_t bn_addr(const bf16* tile, int ld, int k0, int n0) {
  const int lane = threadIdx.x % 32;
  return smem_addr(tile + (k0 + (lane % 8) + ((lane / 8) % 2) * 8) * ld + n0 + (lane / 16) * 8);
}

// ---------------------------------------------------------------------------------------------
// Forward. S queries per sequence at positions past … past + S − 1 attend keys 0 … their own
// position; keys and values are rows of (·, krows, KV, HD) tensors (krows = S when training,
// the cache's max_tokens at inference). lse (natural log) is written when not null.
template <class T, class TK, int HD>
__global__ void __launch_bounds__(kThreads) flash_fwd_kernel(T* __restrict__ out, float* __restrict__ lse,
                                                             const T* __restrict__ q, const TK* __restrict__ k,
                                                             const TK* __restrict__ v, int S, int H, int KV, int past,
                                                             int krows, float scale) {
  constexpr int ld = Tl<HD>::ld, te = Tl<HD>::elems, ND = HD / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Ks = Qs + te;      // two buffers
  bf16* Vs = Ks + 2 * te;  // two buffers

  const int q0 = (gridDim.x - 1 - blockIdx.x) * kTile;  // the longest rows first
  const int h = blockIdx.y, b = blockIdx.z, kh = h / (H / KV);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const std::size_t qstride = std::size_t(H) * HD, kstride = std::size_t(KV) * HD;
  const T* qb = q + std::size_t(b) * S * qstride + std::size_t(h) * HD;
  const TK* kb = k + std::size_t(b) * krows * kstride + std::size_t(kh) * HD;
  const TK* vb = v + std::size_t(b) * krows * kstride + std::size_t(kh) * HD;
  const int nkeys = past + S;
  const int kend = min(past + q0 + kTile, nkeys);  // keys any row of this block sees
  const int ntiles = (kend + kTile - 1) / kTile;
  const int pos_lo = past + q0 + warp * 16 + g, pos_hi = pos_lo + 8;  // this thread's two rows
  const float scale2 = scale * kLog2e;

  load_tile<T, HD>(Qs, qb, q0, S, qstride);
  load_tile<TK, HD>(Ks, kb, 0, nkeys, kstride);
  load_tile<TK, HD>(Vs, vb, 0, nkeys, kstride);
  cp_commit();

  std::uint32_t qf[HD / 16][4];
  float o[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;  // m in scaled base-2 units

  for (int it = 0; it < ntiles; ++it) {
    const int k0 = it * kTile;
    const bf16* Kc = Ks + (it & 1) * te;
    const bf16* Vc = Vs + (it & 1) * te;
    next_kv_tile<TK, HD>(Ks, Vs, te, it, ntiles, kb, vb, k0 + kTile, nkeys, kstride);
    if (it == 0) {
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) ldsm4(qf[kk], a_addr(Qs, ld, warp * 16, kk * 16));
    }
    // S = Q·Kᵀ, 16 × 64 per warp
    float s[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        std::uint32_t bb[4];
        ldsm4(bb, bt_addr(Kc, ld, np * 16, kk * 16));
        mma(s[2 * np], qf[kk], bb[0], bb[1]);
        mma(s[2 * np + 1], qf[kk], bb[2], bb[3]);
      }
    }
    if (k0 + kTile - 1 > past + q0) {  // the tile crosses some row's diagonal
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        const int c = k0 + n * 8 + 2 * t4;
        if (c > pos_lo) s[n][0] = -INFINITY;
        if (c + 1 > pos_lo) s[n][1] = -INFINITY;
        if (c > pos_hi) s[n][2] = -INFINITY;
        if (c + 1 > pos_hi) s[n][3] = -INFINITY;
      }
    }
    // online softmax: the four lanes of a quad share a row
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      mx_lo = fmaxf(mx_lo, fmaxf(s[n][0], s[n][1]));
      mx_hi = fmaxf(mx_hi, fmaxf(s[n][2], s[n][3]));
    }
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
    const float mn_lo = fmaxf(m_lo, mx_lo * scale2), mn_hi = fmaxf(m_hi, mx_hi * scale2);
    const float mu_lo = mn_lo == -INFINITY ? 0.0f : mn_lo, mu_hi = mn_hi == -INFINITY ? 0.0f : mn_hi;
    const float c_lo = exp2f(m_lo - mu_lo), c_hi = exp2f(m_hi - mu_hi);  // 0 while m is −inf
    m_lo = mn_lo;
    m_hi = mn_hi;
    l_lo *= c_lo;
    l_hi *= c_hi;
#pragma unroll
    for (int n = 0; n < ND; ++n) {
      o[n][0] *= c_lo;
      o[n][1] *= c_lo;
      o[n][2] *= c_hi;
      o[n][3] *= c_hi;
    }
    // P in bf16, already in the A-fragment layout of P·V (key chunk c = n-blocks 2c, 2c+1)
    std::uint32_t pf[4][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const float p0 = exp2f(fmaf(s[n][0], scale2, -mu_lo)), p1 = exp2f(fmaf(s[n][1], scale2, -mu_lo));
      const float p2 = exp2f(fmaf(s[n][2], scale2, -mu_hi)), p3 = exp2f(fmaf(s[n][3], scale2, -mu_hi));
      l_lo += p0 + p1;
      l_hi += p2 + p3;
      pf[n / 2][(n % 2) * 2] = pack_bf16(p0, p1);
      pf[n / 2][(n % 2) * 2 + 1] = pack_bf16(p2, p3);
    }
    // O += P·V
#pragma unroll
    for (int c = 0; c < 4; ++c) {
#pragma unroll
      for (int np = 0; np < HD / 16; ++np) {
        std::uint32_t bb[4];
        ldsm4_t(bb, bn_addr(Vc, ld, c * 16, np * 16));
        mma(o[2 * np], pf[c], bb[0], bb[1]);
        mma(o[2 * np + 1], pf[c], bb[2], bb[3]);
      }
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }

  l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 1);
  l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 2);
  l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 1);
  l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 2);
  const int r_lo = q0 + warp * 16 + g, r_hi = r_lo + 8;
  const float inv_lo = 1.0f / l_lo, inv_hi = 1.0f / l_hi;
  T* ob = out + std::size_t(b) * S * qstride + std::size_t(h) * HD + 2 * t4;
#pragma unroll
  for (int n = 0; n < ND; ++n) {
    if (r_lo < S) store2(ob + std::size_t(r_lo) * qstride + n * 8, o[n][0] * inv_lo, o[n][1] * inv_lo);
    if (r_hi < S) store2(ob + std::size_t(r_hi) * qstride + n * 8, o[n][2] * inv_hi, o[n][3] * inv_hi);
  }
  if (lse != nullptr && t4 == 0) {
    float* lb = lse + (std::size_t(b) * H + h) * S;
    if (r_lo < S) lb[r_lo] = m_lo * kLn2 + logf(l_lo);
    if (r_hi < S) lb[r_hi] = m_hi * kLn2 + logf(l_hi);
  }
}

// ---------------------------------------------------------------------------------------------
// dK, dV for 64 keys of one kv head, summed over the group's query heads. Queries are taken in
// chunks of QC (32 for head dim 128, to keep the dK and dV accumulators in registers).
template <class T, int HD>
__global__ void __launch_bounds__(kThreads) flash_dkdv_kernel(T* __restrict__ dk, T* __restrict__ dv,
                                                              const T* __restrict__ q, const T* __restrict__ k,
                                                              const T* __restrict__ v, const T* __restrict__ dout,
                                                              const float* __restrict__ lse,
                                                              const float* __restrict__ delta, int S, int H, int KV,
                                                              float scale) {
  constexpr int ld = Tl<HD>::ld, te = Tl<HD>::elems, ND = HD / 8;
  constexpr int QC = HD >= 128 ? 32 : 64, NB = QC / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Ks = reinterpret_cast<bf16*>(smem);
  bf16* Vs = Ks + te;
  bf16* Qs = Vs + te;       // two buffers
  bf16* Ds = Qs + 2 * te;   // dout, two buffers
  float* Ls = reinterpret_cast<float*>(Ds + 2 * te);  // lse, two buffers of 64
  float* Es = Ls + 2 * kTile;                        // delta, two buffers of 64

  const int k0 = blockIdx.x * kTile, kh = blockIdx.y, b = blockIdx.z, G = H / KV;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const std::size_t qstride = std::size_t(H) * HD, kstride = std::size_t(KV) * HD;
  const float scale2 = scale * kLog2e;
  const int j_lo = k0 + warp * 16 + g, j_hi = j_lo + 8;  // this thread's two keys
  const int nq = (S - k0 + kTile - 1) / kTile;           // query tiles from k0 on, per head
  const int total = G * nq;

  auto issue = [&](int it, int buf) {
    const int h = kh * G + it / nq, q0 = k0 + (it % nq) * kTile;
    load_tile<T, HD>(Qs + buf * te, q + std::size_t(b) * S * qstride + std::size_t(h) * HD, q0, S, qstride);
    load_tile<T, HD>(Ds + buf * te, dout + std::size_t(b) * S * qstride + std::size_t(h) * HD, q0, S, qstride);
    load_stats(Ls + buf * kTile, lse + (std::size_t(b) * H + h) * S, q0, S);
    load_stats(Es + buf * kTile, delta + (std::size_t(b) * H + h) * S, q0, S);
  };
  load_tile<T, HD>(Ks, k + std::size_t(b) * S * kstride + std::size_t(kh) * HD, k0, S, kstride);
  load_tile<T, HD>(Vs, v + std::size_t(b) * S * kstride + std::size_t(kh) * HD, k0, S, kstride);
  issue(0, 0);
  cp_commit();

  float dka[ND][4], dva[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dka[n][e] = dva[n][e] = 0.0f;

  for (int it = 0; it < total; ++it) {
    const int buf = it & 1;
    const int q0 = k0 + (it % nq) * kTile;
    if (it + 1 < total) {
      issue(it + 1, buf ^ 1);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    const bf16* Qc = Qs + buf * te;
    const bf16* Dc = Ds + buf * te;
    const float* Lc = Ls + buf * kTile;
    const float* Ec = Es + buf * kTile;
    const bool need_mask = q0 == k0 || q0 + kTile > S;
#pragma unroll
    for (int qc = 0; qc < kTile / QC; ++qc) {
      // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ: 16 keys × QC queries per warp
      float st[NB][4], dpt[NB][4];
#pragma unroll
      for (int n = 0; n < NB; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) {
        std::uint32_t ka[4], va[4];
        ldsm4(ka, a_addr(Ks, ld, warp * 16, kk * 16));
        ldsm4(va, a_addr(Vs, ld, warp * 16, kk * 16));
#pragma unroll
        for (int np = 0; np < NB / 2; ++np) {
          std::uint32_t bb[4];
          ldsm4(bb, bt_addr(Qc, ld, qc * QC + np * 16, kk * 16));
          mma(st[2 * np], ka, bb[0], bb[1]);
          mma(st[2 * np + 1], ka, bb[2], bb[3]);
          ldsm4(bb, bt_addr(Dc, ld, qc * QC + np * 16, kk * 16));
          mma(dpt[2 * np], va, bb[0], bb[1]);
          mma(dpt[2 * np + 1], va, bb[2], bb[3]);
        }
      }
      // Pᵀ = exp(S·scale − lse) and dSᵀ = Pᵀ∘(dPᵀ − delta), packed as A fragments
      std::uint32_t pa[QC / 16][4], da[QC / 16][4];
#pragma unroll
      for (int n = 0; n < NB; ++n) {
        const int cl = qc * QC + n * 8 + 2 * t4;  // query column within the tile
        const float l0 = Lc[cl] * kLog2e, l1 = Lc[cl + 1] * kLog2e, e0 = Ec[cl], e1 = Ec[cl + 1];
        float p[4] = {exp2f(fmaf(st[n][0], scale2, -l0)), exp2f(fmaf(st[n][1], scale2, -l1)),
                      exp2f(fmaf(st[n][2], scale2, -l0)), exp2f(fmaf(st[n][3], scale2, -l1))};
        if (need_mask) {
          const int i = q0 + cl;
          if (i < j_lo || i >= S) p[0] = 0.0f;
          if (i + 1 < j_lo || i + 1 >= S) p[1] = 0.0f;
          if (i < j_hi || i >= S) p[2] = 0.0f;
          if (i + 1 < j_hi || i + 1 >= S) p[3] = 0.0f;
        }
        pa[n / 2][(n % 2) * 2] = pack_bf16(p[0], p[1]);
        pa[n / 2][(n % 2) * 2 + 1] = pack_bf16(p[2], p[3]);
        da[n / 2][(n % 2) * 2] = pack_bf16(p[0] * (dpt[n][0] - e0), p[1] * (dpt[n][1] - e1));
        da[n / 2][(n % 2) * 2 + 1] = pack_bf16(p[2] * (dpt[n][2] - e0), p[3] * (dpt[n][3] - e1));
      }
      // dV += Pᵀ·dO, dK += dSᵀ·Q (the scale is applied once at the end)
#pragma unroll
      for (int c = 0; c < QC / 16; ++c) {
#pragma unroll
        for (int np = 0; np < HD / 16; ++np) {
          std::uint32_t bb[4];
          ldsm4_t(bb, bn_addr(Dc, ld, qc * QC + c * 16, np * 16));
          mma(dva[2 * np], pa[c], bb[0], bb[1]);
          mma(dva[2 * np + 1], pa[c], bb[2], bb[3]);
          ldsm4_t(bb, bn_addr(Qc, ld, qc * QC + c * 16, np * 16));
          mma(dka[2 * np], da[c], bb[0], bb[1]);
          mma(dka[2 * np + 1], da[c], bb[2], bb[3]);
        }
      }
    }
    __syncthreads();
  }
  T* dkb = dk + std::size_t(b) * S * kstride + std::size_t(kh) * HD + 2 * t4;
  T* dvb = dv + std::size_t(b) * S * kstride + std::size_t(kh) * HD + 2 * t4;
#pragma unroll
  for (int n = 0; n < ND; ++n) {
    if (j_lo < S) {
      store2(dkb + std::size_t(j_lo) * kstride + n * 8, dka[n][0] * scale, dka[n][1] * scale);
      store2(dvb + std::size_t(j_lo) * kstride + n * 8, dva[n][0], dva[n][1]);
    }
    if (j_hi < S) {
      store2(dkb + std::size_t(j_hi) * kstride + n * 8, dka[n][2] * scale, dka[n][3] * scale);
      store2(dvb + std::size_t(j_hi) * kstride + n * 8, dva[n][2], dva[n][3]);
    }
  }
}

// dQ for 64 queries of one head.
template <class T, int HD>
__global__ void __launch_bounds__(kThreads) flash_dq_kernel(T* __restrict__ dq, const T* __restrict__ q,
                                                            const T* __restrict__ k, const T* __restrict__ v,
                                                            const T* __restrict__ dout, const float* __restrict__ lse,
                                                            const float* __restrict__ delta, int S, int H, int KV,
                                                            float scale) {
  constexpr int ld = Tl<HD>::ld, te = Tl<HD>::elems, ND = HD / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Ds = Qs + te;
  bf16* Ks = Ds + te;      // two buffers
  bf16* Vs = Ks + 2 * te;  // two buffers

  const int q0 = (gridDim.x - 1 - blockIdx.x) * kTile;
  const int h = blockIdx.y, b = blockIdx.z, kh = h / (H / KV);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const std::size_t qstride = std::size_t(H) * HD, kstride = std::size_t(KV) * HD;
  const T* kb = k + std::size_t(b) * S * kstride + std::size_t(kh) * HD;
  const T* vb = v + std::size_t(b) * S * kstride + std::size_t(kh) * HD;
  const float scale2 = scale * kLog2e;
  const int r_lo = q0 + warp * 16 + g, r_hi = r_lo + 8;
  const int ntiles = (min(q0 + kTile, S) + kTile - 1) / kTile;

  load_tile<T, HD>(Qs, q + std::size_t(b) * S * qstride + std::size_t(h) * HD, q0, S, qstride);
  load_tile<T, HD>(Ds, dout + std::size_t(b) * S * qstride + std::size_t(h) * HD, q0, S, qstride);
  load_tile<T, HD>(Ks, kb, 0, S, kstride);
  load_tile<T, HD>(Vs, vb, 0, S, kstride);
  cp_commit();
  const float* lb = lse + (std::size_t(b) * H + h) * S;
  const float* eb = delta + (std::size_t(b) * H + h) * S;
  const float l_lo = r_lo < S ? lb[r_lo] * kLog2e : 0.0f, l_hi = r_hi < S ? lb[r_hi] * kLog2e : 0.0f;
  const float e_lo = r_lo < S ? eb[r_lo] : 0.0f, e_hi = r_hi < S ? eb[r_hi] : 0.0f;

  std::uint32_t qf[HD / 16][4];
  float acc[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

  for (int it = 0; it < ntiles; ++it) {
    const int k0 = it * kTile;
    const bf16* Kc = Ks + (it & 1) * te;
    const bf16* Vc = Vs + (it & 1) * te;
    next_kv_tile<T, HD>(Ks, Vs, te, it, ntiles, kb, vb, k0 + kTile, S, kstride);
    if (it == 0) {
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) ldsm4(qf[kk], a_addr(Qs, ld, warp * 16, kk * 16));
    }
    float s[8][4], dp[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      std::uint32_t da[4];
      ldsm4(da, a_addr(Ds, ld, warp * 16, kk * 16));
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        std::uint32_t bb[4];
        ldsm4(bb, bt_addr(Kc, ld, np * 16, kk * 16));
        mma(s[2 * np], qf[kk], bb[0], bb[1]);
        mma(s[2 * np + 1], qf[kk], bb[2], bb[3]);
        ldsm4(bb, bt_addr(Vc, ld, np * 16, kk * 16));
        mma(dp[2 * np], da, bb[0], bb[1]);
        mma(dp[2 * np + 1], da, bb[2], bb[3]);
      }
    }
    const bool need_mask = k0 + kTile - 1 > q0;
    std::uint32_t dsf[4][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      float p[4] = {exp2f(fmaf(s[n][0], scale2, -l_lo)), exp2f(fmaf(s[n][1], scale2, -l_lo)),
                    exp2f(fmaf(s[n][2], scale2, -l_hi)), exp2f(fmaf(s[n][3], scale2, -l_hi))};
      if (need_mask) {
        const int c = k0 + n * 8 + 2 * t4;
        if (c > r_lo) p[0] = 0.0f;
        if (c + 1 > r_lo) p[1] = 0.0f;
        if (c > r_hi) p[2] = 0.0f;
        if (c + 1 > r_hi) p[3] = 0.0f;
      }
      dsf[n / 2][(n % 2) * 2] = pack_bf16(p[0] * (dp[n][0] - e_lo), p[1] * (dp[n][1] - e_lo));
      dsf[n / 2][(n % 2) * 2 + 1] = pack_bf16(p[2] * (dp[n][2] - e_hi), p[3] * (dp[n][3] - e_hi));
    }
    // dQ += dS·K
#pragma unroll
    for (int c = 0; c < 4; ++c) {
#pragma unroll
      for (int np = 0; np < HD / 16; ++np) {
        std::uint32_t bb[4];
        ldsm4_t(bb, bn_addr(Kc, ld, c * 16, np * 16));
        mma(acc[2 * np], dsf[c], bb[0], bb[1]);
        mma(acc[2 * np + 1], dsf[c], bb[2], bb[3]);
      }
    }
    __syncthreads();
  }
  T* qo = dq + std::size_t(b) * S * qstride + std::size_t(h) * HD + 2 * t4;
#pragma unroll
  for (int n = 0; n < ND; ++n) {
    if (r_lo < S) store2(qo + std::size_t(r_lo) * qstride + n * 8, acc[n][0] * scale, acc[n][1] * scale);
    if (r_hi < S) store2(qo + std::size_t(r_hi) * qstride + n * 8, acc[n][2] * scale, acc[n][3] * scale);
  }
}

template <int HD>
constexpr std::size_t fwd_smem() {
  return 5 * Tl<HD>::bytes;  // Q, K ×2, V ×2
}
template <int HD>
constexpr std::size_t dkdv_smem() {
  return 6 * Tl<HD>::bytes + 4 * kTile * sizeof(float);  // K, V, Q ×2, dO ×2, lse ×2, delta ×2
}
template <int HD>
constexpr std::size_t dq_smem() {
  return 6 * Tl<HD>::bytes;  // Q, dO, K ×2, V ×2
}

template <class K>
void set_smem(K kernel, std::size_t bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <class T, class TK, int HD>
void forward_impl(Stream s, T* out, float* lse, const T* q, const TK* k, const TK* v, const Attn& a, int past,
                  int krows) {
  const float scale = 1.0f / sqrtf(static_cast<float>(HD));
  const dim3 grid((a.S + kTile - 1) / kTile, a.heads, a.B);
  constexpr std::size_t smem = fwd_smem<HD>();
  set_smem(flash_fwd_kernel<T, TK, HD>, smem);
  flash_fwd_kernel<T, TK, HD><<<grid, kThreads, smem, s>>>(out, lse, q, k, v, a.S, a.heads, a.kv_heads, past, krows,
                                                           scale);
  CHECK_LAUNCH("flash_fwd_kernel");
}

template <class T, int HD>
void backward_impl(Stream s, T* dq, T* dk, T* dv, float* delta, const T* dout, const T* q, const T* k, const T* v,
                   const T* out, const float* lse, const Attn& a) {
  const float scale = 1.0f / sqrtf(static_cast<float>(HD));
  const std::size_t rows = std::size_t(a.B) * a.S * a.heads;
  attn_delta_kernel<T, HD><<<blocks_for(rows * 32, 256, 1u << 30), 256, 0, s>>>(delta, dout, out, a.B, a.S, a.heads);
  CHECK_LAUNCH("attn_delta_kernel");
  set_smem(flash_dkdv_kernel<T, HD>, dkdv_smem<HD>());
  const dim3 gk((a.S + kTile - 1) / kTile, a.kv_heads, a.B);
  flash_dkdv_kernel<T, HD><<<gk, kThreads, dkdv_smem<HD>(), s>>>(dk, dv, q, k, v, dout, lse, delta, a.S, a.heads,
                                                                 a.kv_heads, scale);
  CHECK_LAUNCH("flash_dkdv_kernel");
  set_smem(flash_dq_kernel<T, HD>, dq_smem<HD>());
  const dim3 gq((a.S + kTile - 1) / kTile, a.heads, a.B);
  flash_dq_kernel<T, HD><<<gq, kThreads, dq_smem<HD>(), s>>>(dq, q, k, v, dout, lse, delta, a.S, a.heads, a.kv_heads,
                                                             scale);
  CHECK_LAUNCH("flash_dq_kernel");
}

// MEMBUDGET_CUDA_ATTN=wmma selects the first (WMMA) kernels for training (read at every call, so a
// test can switch between the two).
bool use_wmma() {
  const char* e = std::getenv("MEMBUDGET_CUDA_ATTN");
  return e != nullptr && std::strcmp(e, "wmma") == 0;
}

}  // namespace

void attention_forward(Stream s, Ten out, float* lse, Ten q, Ten k, Ten v, const Attn& a) {
  if (use_wmma()) return attention_forward_wmma(s, out, lse, q, k, v, a);  // it checks its arguments
  check_forward(a, out, q, k, v);
  if (a.B == 0 || a.S == 0) return;
  with_head_dim(a.head_dim, [&](auto hd) {
    dispatch(q.dt, [&](auto t) {
      using T = decltype(t);
      forward_impl<T, T, decltype(hd)::value>(s, static_cast<T*>(out.p), lse, static_cast<const T*>(q.p),
                                              static_cast<const T*>(k.p), static_cast<const T*>(v.p), a, 0, a.S);
    });
  });
}

void attention_forward_cached(Stream s, Ten out, Ten q, Ten k_cache, Ten v_cache, const Attn& a, int past,
                              int max_tokens) {
  check_shape(a);
  REQUIRE(out.dt == q.dt && v_cache.dt == k_cache.dt, "attention_forward_cached: out and q, k and v caches share a dtype");
  REQUIRE(past >= 0 && past + a.S <= max_tokens, "attention_forward_cached: past + new tokens exceed the cache");
  if (a.B == 0 || a.S == 0) return;
  with_head_dim(a.head_dim, [&](auto hd) {
    dispatch(q.dt, [&](auto t) {
      using T = decltype(t);
      dispatch(k_cache.dt, [&](auto tk) {
        using TK = decltype(tk);
        forward_impl<T, TK, decltype(hd)::value>(s, static_cast<T*>(out.p), nullptr, static_cast<const T*>(q.p),
                                                 static_cast<const TK*>(k_cache.p), static_cast<const TK*>(v_cache.p),
                                                 a, past, max_tokens);
      });
    });
  });
}

void attention_backward(Stream s, Ten dq, Ten dk, Ten dv, float* delta, Ten dout, Ten q, Ten k, Ten v, Ten out,
                        const float* lse, const Attn& a) {
  if (use_wmma()) return attention_backward_wmma(s, dq, dk, dv, delta, dout, q, k, v, out, lse, a);
  check_backward(a, dq, dk, dv, dout, q, k, v, out);
  if (a.B == 0 || a.S == 0) return;
  with_head_dim(a.head_dim, [&](auto hd) {
    dispatch(q.dt, [&](auto t) {
      using T = decltype(t);
      backward_impl<T, decltype(hd)::value>(s, static_cast<T*>(dq.p), static_cast<T*>(dk.p), static_cast<T*>(dv.p),
                                            delta, static_cast<const T*>(dout.p), static_cast<const T*>(q.p),
                                            static_cast<const T*>(k.p), static_cast<const T*>(v.p),
                                            static_cast<const T*>(out.p), lse, a);
    });
  });
}

}  // namespace membudget::measure::cuda
