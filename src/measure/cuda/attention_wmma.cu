// The first CUDA attention (kept as a fallback: MEMBUDGET_CUDA_ATTN=wmma selects it; attention.cu is
// the default). Causal attention with GQA, flash-attention-2 style: tiles of 64 queries × 64 keys on tensor cores
// (bf16 WMMA fragments, fp32 accumulation), an online softmax per query row, and the fp32
// log-sum-exp saved for the backward. The S×S scores never exist: each tile's scores live in
// shared memory only.
//
// Forward: one block per (query tile, head, batch), 4 warps of 16 query rows each. Per key tile:
// S = Q·Kᵀ into shared fp32, softmax statistics by two lanes per row, P (bf16) · V accumulated into
// the shared fp32 output after rescaling it by exp(m_old − m_new).
// Backward (no scratch beyond the harness's delta): delta = rowsum(dO ∘ O); one kernel per
// (key tile, kv head, batch) loops over the group's query heads and query tiles, recomputing Pᵀ
// from the saved lse, and accumulates dK, dV in registers; a second kernel per (query tile, head,
// batch) recomputes P and dP over the key tiles and accumulates dQ. No atomics, no fp32 dq buffer.
//
// Inputs are read as bf16 (fp32 inputs under the fp32 recipe are rounded to bf16 on the way into
// shared memory: the products run on bf16 tensor cores there too) and all softmax math is fp32.
#include <mma.h>

#include "measure/cuda/attention_common.cuh"
#include "measure/cuda/common.cuh"

namespace membudget::measure::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTile = 64;        // queries per block and keys per tile
constexpr int kWarps = 4;        // 16 rows each
constexpr int kThreads = 32 * kWarps;
constexpr int kLdS = kTile + 4;  // fp32 score rows (WMMA wants ldm % 4 == 0 for fp32)
constexpr int kLdP = kTile + 8;  // bf16 probability rows (ldm % 8 == 0 for 16-bit types)
// exponentials in base 2 (exp2f is one fast instruction): exp(x) = 2^(x·log2 e)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragAT = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

template <int HD>
struct Ld {
  static constexpr int x = HD + 8;   // bf16 rows of q, k, v, dout tiles
  static constexpr int o = HD + 4;   // fp32 output rows
};

// rows [row0, row0 + 64) of a (·, row_stride) tensor into shared bf16 (ld HD + 8); rows at or past
// `rows` read as zero.
template <class T, int HD>
__device__ void load_tile(bf16* dst, const T* src, int row0, int rows, std::size_t row_stride) {
  constexpr int ld = Ld<HD>::x;
  if constexpr (sizeof(T) == 2) {
    constexpr int vec = HD / 8;  // 8 bf16 per 16-byte load
    for (int idx = threadIdx.x; idx < kTile * vec; idx += blockDim.x) {
      const int r = idx / vec, c = (idx % vec) * 8;
      uint4 val = make_uint4(0, 0, 0, 0);
      if (row0 + r < rows) val = *reinterpret_cast<const uint4*>(src + std::size_t(row0 + r) * row_stride + c);
      *reinterpret_cast<uint4*>(dst + r * ld + c) = val;
    }
  } else {
    for (int idx = threadIdx.x; idx < kTile * HD; idx += blockDim.x) {
      const int r = idx / HD, c = idx % HD;
      const float v = row0 + r < rows ? to_f(src[std::size_t(row0 + r) * row_stride + c]) : 0.0f;
      dst[r * ld + c] = __float2bfloat16_rn(v);
    }
  }
}

// C(16 × 64) of this warp = A(16 × HD) · Bᵀ where B is a (64 × HD) row-major tile: scores.
template <int HD>
__device__ void rows_times_tile_t(float* c, const bf16* a, const bf16* b) {
  constexpr int ld = Ld<HD>::x;
  FragA fa;
  FragBT fb;
  FragC acc;
  for (int n = 0; n < kTile / 16; ++n) {
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int k = 0; k < HD / 16; ++k) {
      wmma::load_matrix_sync(fa, a + k * 16, ld);
      wmma::load_matrix_sync(fb, b + n * 16 * ld + k * 16, ld);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(c + n * 16, acc, kLdS, wmma::mem_row_major);
  }
}

template <class T, int HD>
__global__ void __launch_bounds__(kThreads) attn_forward_kernel(T* out, float* lse, const T* q, const T* k, const T* v,
                                                                int S, int H, int KV, float scale) {
  constexpr int ldx = Ld<HD>::x, ldo = Ld<HD>::o;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Ks = Qs + kTile * ldx;
  bf16* Vs = Ks + kTile * ldx;
  float* Ss = reinterpret_cast<float*>(Vs + kTile * ldx);
  float* Os = Ss + kTile * kLdS;
  bf16* Ps = reinterpret_cast<bf16*>(Os + kTile * ldo);

  const int q0 = blockIdx.x * kTile, h = blockIdx.y, b = blockIdx.z, kh = h / (H / KV);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r0 = warp * 16, r = r0 + lane / 2, half = lane % 2, qi = q0 + r;
  const std::size_t qstride = std::size_t(H) * HD, kstride = std::size_t(KV) * HD;
  const T* qb = q + std::size_t(b) * S * qstride + std::size_t(h) * HD;
  const T* kb = k + std::size_t(b) * S * kstride + std::size_t(kh) * HD;
  const T* vb = v + std::size_t(b) * S * kstride + std::size_t(kh) * HD;

  load_tile<T, HD>(Qs, qb, q0, S, qstride);
  for (int i = threadIdx.x; i < kTile * ldo; i += blockDim.x) Os[i] = 0.0f;
  // this lane's row (both lanes of a pair hold the same values); scores and m in base 2
  float m = -INFINITY, l = 0.0f;
  const float scale2 = scale * kLog2e;

  const int last = min(q0 + kTile - 1, S - 1);
  for (int k0 = 0; k0 <= last; k0 += kTile) {
    __syncthreads();  // the previous tile's K and V are no longer read
    load_tile<T, HD>(Ks, kb, k0, S, kstride);
    load_tile<T, HD>(Vs, vb, k0, S, kstride);
    __syncthreads();
    rows_times_tile_t<HD>(Ss + r0 * kLdS, Qs + r0 * ldx, Ks);
    __syncwarp();
    // the two lanes of a row take alternate columns: fewer shared-memory bank conflicts
    float* srow = Ss + r * kLdS;
    float mt = -INFINITY;
    for (int c = half; c < kTile; c += 2) {
      const int j = k0 + c;
      const float s = (j <= qi && j < S) ? srow[c] * scale2 : -INFINITY;
      srow[c] = s;
      mt = fmaxf(mt, s);
    }
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
    const float mn = fmaxf(m, mt);
    const float mu = mn == -INFINITY ? 0.0f : mn;
    float sum = 0.0f;
    bf16* prow = Ps + r * kLdP;
    for (int c = half; c < kTile; c += 2) {
      const float p = srow[c] == -INFINITY ? 0.0f : exp2f(srow[c] - mu);
      sum += p;
      prow[c] = __float2bfloat16_rn(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    const float corr = m == -INFINITY ? 0.0f : exp2f(m - mu);
    l = l * corr + sum;
    m = mn;
    float* orow = Os + r * ldo;
    for (int c = half; c < HD; c += 2) orow[c] *= corr;
    __syncwarp();
    FragA fa;
    FragB fb;
    FragC acc;
    for (int n = 0; n < HD / 16; ++n) {
      wmma::load_matrix_sync(acc, Os + r0 * ldo + n * 16, ldo, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        wmma::load_matrix_sync(fa, Ps + r0 * kLdP + kk * 16, kLdP);
        wmma::load_matrix_sync(fb, Vs + kk * 16 * ldx + n * 16, ldx);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(Os + r0 * ldo + n * 16, acc, ldo, wmma::mem_row_major);
    }
    __syncwarp();
  }
  if (qi < S) {
    const float inv = 1.0f / l;
    T* orow = out + std::size_t(b) * S * qstride + std::size_t(qi) * qstride + std::size_t(h) * HD + half * (HD / 2);
    const float* os = Os + r * ldo + half * (HD / 2);
    for (int c = 0; c < HD / 2; ++c) orow[c] = from_f<T>(os[c] * inv);
    if (half == 0) lse[(std::size_t(b) * H + h) * S + qi] = m * kLn2 + logf(l);
  }
}

// dK, dV for 64 keys of one kv head, summed over the group's query heads.
template <class T, int HD>
__global__ void __launch_bounds__(kThreads) attn_dkdv_kernel(T* dk, T* dv, const T* q, const T* k, const T* v,
                                                             const T* dout, const float* lse, const float* delta, int S,
                                                             int H, int KV, float scale) {
  constexpr int ldx = Ld<HD>::x, ldo = Ld<HD>::o;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Ks = reinterpret_cast<bf16*>(smem);
  bf16* Vs = Ks + kTile * ldx;
  bf16* Qs = Vs + kTile * ldx;
  bf16* Ds = Qs + kTile * ldx;                          // dout tile
  float* St = reinterpret_cast<float*>(Ds + kTile * ldx);  // Sᵀ (keys × queries), then dK / dV out
  float* dPt = St + kTile * kLdS;
  bf16* Pt = reinterpret_cast<bf16*>(dPt + kTile * kLdS);
  bf16* dSt = Pt + kTile * kLdP;
  float* lse_s = reinterpret_cast<float*>(dSt + kTile * kLdP);
  float* delta_s = lse_s + kTile;

  const int k0 = blockIdx.x * kTile, kh = blockIdx.y, b = blockIdx.z, G = H / KV;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r0 = warp * 16, rr = r0 + lane / 2, half = lane % 2, j = k0 + rr;
  const float scale2 = scale * kLog2e;
  const std::size_t qstride = std::size_t(H) * HD, kstride = std::size_t(KV) * HD;
  load_tile<T, HD>(Ks, k + std::size_t(b) * S * kstride + std::size_t(kh) * HD, k0, S, kstride);
  load_tile<T, HD>(Vs, v + std::size_t(b) * S * kstride + std::size_t(kh) * HD, k0, S, kstride);

  FragC dk_acc[HD / 16], dv_acc[HD / 16];
#pragma unroll
  for (int n = 0; n < HD / 16; ++n) {
    wmma::fill_fragment(dk_acc[n], 0.0f);
    wmma::fill_fragment(dv_acc[n], 0.0f);
  }
  for (int g = 0; g < G; ++g) {
    const int h = kh * G + g;
    const T* qb = q + std::size_t(b) * S * qstride + std::size_t(h) * HD;
    const T* db = dout + std::size_t(b) * S * qstride + std::size_t(h) * HD;
    const float* lb = lse + (std::size_t(b) * H + h) * S;
    const float* eb = delta + (std::size_t(b) * H + h) * S;
    for (int q0 = k0; q0 < S; q0 += kTile) {  // causal: queries before k0 never see these keys
      __syncthreads();
      load_tile<T, HD>(Qs, qb, q0, S, qstride);
      load_tile<T, HD>(Ds, db, q0, S, qstride);
      for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
        lse_s[i] = q0 + i < S ? lb[q0 + i] : 0.0f;
        delta_s[i] = q0 + i < S ? eb[q0 + i] : 0.0f;
      }
      __syncthreads();
      rows_times_tile_t<HD>(St + r0 * kLdS, Ks + r0 * ldx, Qs);   // Sᵀ = K·Qᵀ
      rows_times_tile_t<HD>(dPt + r0 * kLdS, Vs + r0 * ldx, Ds);  // dPᵀ = V·dOᵀ
      __syncwarp();
      for (int c = half; c < kTile; c += 2) {
        const int i = q0 + c;
        const bool ok = i >= j && i < S && j < S;
        const float p = ok ? exp2f(St[rr * kLdS + c] * scale2 - lse_s[c] * kLog2e) : 0.0f;
        const float ds = p * (dPt[rr * kLdS + c] - delta_s[c]) * scale;
        Pt[rr * kLdP + c] = __float2bfloat16_rn(p);
        dSt[rr * kLdP + c] = __float2bfloat16_rn(ds);
      }
      __syncwarp();
      FragA fa;
      FragB fb;
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
#pragma unroll
        for (int n = 0; n < HD / 16; ++n) {
          wmma::load_matrix_sync(fa, Pt + r0 * kLdP + kk * 16, kLdP);
          wmma::load_matrix_sync(fb, Ds + kk * 16 * ldx + n * 16, ldx);
          wmma::mma_sync(dv_acc[n], fa, fb, dv_acc[n]);  // dV += Pᵀ·dO
          wmma::load_matrix_sync(fa, dSt + r0 * kLdP + kk * 16, kLdP);
          wmma::load_matrix_sync(fb, Qs + kk * 16 * ldx + n * 16, ldx);
          wmma::mma_sync(dk_acc[n], fa, fb, dk_acc[n]);  // dK += dSᵀ·Q
        }
      }
    }
  }
  // St and dPt (contiguous) hold this warp's dK then dV rows on the way out
  float* Ob = St;
  T* dkb = dk + std::size_t(b) * S * kstride + std::size_t(kh) * HD;
  T* dvb = dv + std::size_t(b) * S * kstride + std::size_t(kh) * HD;
  for (int which = 0; which < 2; ++which) {
    __syncthreads();
#pragma unroll
    for (int n = 0; n < HD / 16; ++n)
      wmma::store_matrix_sync(Ob + r0 * ldo + n * 16, which == 0 ? dk_acc[n] : dv_acc[n], ldo, wmma::mem_row_major);
    __syncwarp();
    if (j < S) {
      T* dst = (which == 0 ? dkb : dvb) + std::size_t(j) * kstride + half * (HD / 2);
      const float* src = Ob + rr * ldo + half * (HD / 2);
      for (int c = 0; c < HD / 2; ++c) dst[c] = from_f<T>(src[c]);
    }
  }
}

// dQ for 64 queries of one head.
template <class T, int HD>
__global__ void __launch_bounds__(kThreads) attn_dq_kernel(T* dq, const T* q, const T* k, const T* v, const T* dout,
                                                           const float* lse, const float* delta, int S, int H, int KV,
                                                           float scale) {
  constexpr int ldx = Ld<HD>::x, ldo = Ld<HD>::o;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Ds = Qs + kTile * ldx;
  bf16* Ks = Ds + kTile * ldx;
  bf16* Vs = Ks + kTile * ldx;
  float* Ss = reinterpret_cast<float*>(Vs + kTile * ldx);
  float* dPs = Ss + kTile * kLdS;
  bf16* dSs = reinterpret_cast<bf16*>(dPs + kTile * kLdS);
  float* lse_s = reinterpret_cast<float*>(dSs + kTile * kLdP);
  float* delta_s = lse_s + kTile;

  const int q0 = blockIdx.x * kTile, h = blockIdx.y, b = blockIdx.z, kh = h / (H / KV);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r0 = warp * 16, r = r0 + lane / 2, half = lane % 2, qi = q0 + r;
  const float scale2 = scale * kLog2e;
  const std::size_t qstride = std::size_t(H) * HD, kstride = std::size_t(KV) * HD;
  const T* kb = k + std::size_t(b) * S * kstride + std::size_t(kh) * HD;
  const T* vb = v + std::size_t(b) * S * kstride + std::size_t(kh) * HD;
  load_tile<T, HD>(Qs, q + std::size_t(b) * S * qstride + std::size_t(h) * HD, q0, S, qstride);
  load_tile<T, HD>(Ds, dout + std::size_t(b) * S * qstride + std::size_t(h) * HD, q0, S, qstride);
  for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
    lse_s[i] = q0 + i < S ? lse[(std::size_t(b) * H + h) * S + q0 + i] : 0.0f;
    delta_s[i] = q0 + i < S ? delta[(std::size_t(b) * H + h) * S + q0 + i] : 0.0f;
  }
  FragC dq_acc[HD / 16];
#pragma unroll
  for (int n = 0; n < HD / 16; ++n) wmma::fill_fragment(dq_acc[n], 0.0f);

  const int last = min(q0 + kTile - 1, S - 1);
  for (int k0 = 0; k0 <= last; k0 += kTile) {
    __syncthreads();
    load_tile<T, HD>(Ks, kb, k0, S, kstride);
    load_tile<T, HD>(Vs, vb, k0, S, kstride);
    __syncthreads();
    rows_times_tile_t<HD>(Ss + r0 * kLdS, Qs + r0 * ldx, Ks);   // S = Q·Kᵀ
    rows_times_tile_t<HD>(dPs + r0 * kLdS, Ds + r0 * ldx, Vs);  // dP = dO·Vᵀ
    __syncwarp();
    for (int c = half; c < kTile; c += 2) {
      const int jj = k0 + c;
      const bool ok = jj <= qi && jj < S && qi < S;
      const float p = ok ? exp2f(Ss[r * kLdS + c] * scale2 - lse_s[r] * kLog2e) : 0.0f;
      dSs[r * kLdP + c] = __float2bfloat16_rn(p * (dPs[r * kLdS + c] - delta_s[r]) * scale);
    }
    __syncwarp();
    FragA fa;
    FragB fb;
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      wmma::load_matrix_sync(fa, dSs + r0 * kLdP + kk * 16, kLdP);
#pragma unroll
      for (int n = 0; n < HD / 16; ++n) {
        wmma::load_matrix_sync(fb, Ks + kk * 16 * ldx + n * 16, ldx);
        wmma::mma_sync(dq_acc[n], fa, fb, dq_acc[n]);  // dQ += dS·K
      }
    }
  }
  __syncthreads();
  float* Ob = Ss;  // Ss and dPs (contiguous) hold the dQ rows on the way out
#pragma unroll
  for (int n = 0; n < HD / 16; ++n) wmma::store_matrix_sync(Ob + r0 * ldo + n * 16, dq_acc[n], ldo, wmma::mem_row_major);
  __syncwarp();
  if (qi < S) {
    T* dst = dq + std::size_t(b) * S * qstride + std::size_t(qi) * qstride + std::size_t(h) * HD + half * (HD / 2);
    const float* src = Ob + r * ldo + half * (HD / 2);
    for (int c = 0; c < HD / 2; ++c) dst[c] = from_f<T>(src[c]);
  }
}

template <int HD>
constexpr std::size_t forward_smem() {
  return 3 * kTile * Ld<HD>::x * 2 + kTile * kLdS * 4 + kTile * Ld<HD>::o * 4 + kTile * kLdP * 2;
}
template <int HD>
constexpr std::size_t backward_smem() {  // both backward kernels: 4 bf16 tiles, 2 fp32 score tiles, bf16 tiles, stats
  return 4 * kTile * Ld<HD>::x * 2 + 2 * kTile * kLdS * 4 + 2 * kTile * kLdP * 2 + 2 * kTile * 4;
}
// the backward's output rows (64 × (HD + 4) fp32) reuse the two fp32 score tiles
static_assert(kTile * Ld<128>::o <= 2 * kTile * kLdS, "dK/dV staging must fit the score tiles");

template <class K>
void set_smem(K kernel, std::size_t bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <class T, int HD>
void forward_impl(Stream s, T* out, float* lse, const T* q, const T* k, const T* v, const Attn& a) {
  const float scale = 1.0f / sqrtf(static_cast<float>(HD));
  const dim3 grid((a.S + kTile - 1) / kTile, a.heads, a.B);
  constexpr std::size_t smem = forward_smem<HD>();
  set_smem(attn_forward_kernel<T, HD>, smem);
  attn_forward_kernel<T, HD><<<grid, kThreads, smem, s>>>(out, lse, q, k, v, a.S, a.heads, a.kv_heads, scale);
  CHECK_LAUNCH("attn_forward_kernel");
}

template <class T, int HD>
void backward_impl(Stream s, T* dq, T* dk, T* dv, float* delta, const T* dout, const T* q, const T* k, const T* v,
                   const T* out, const float* lse, const Attn& a) {
  const float scale = 1.0f / sqrtf(static_cast<float>(HD));
  const std::size_t rows = std::size_t(a.B) * a.S * a.heads;
  attn_delta_kernel<T, HD><<<blocks_for(rows * 32, 256, 1u << 30), 256, 0, s>>>(delta, dout, out, a.B, a.S, a.heads);
  CHECK_LAUNCH("attn_delta_kernel");
  constexpr std::size_t smem = backward_smem<HD>();
  set_smem(attn_dkdv_kernel<T, HD>, smem);
  const dim3 gk((a.S + kTile - 1) / kTile, a.kv_heads, a.B);
  attn_dkdv_kernel<T, HD><<<gk, kThreads, smem, s>>>(dk, dv, q, k, v, dout, lse, delta, a.S, a.heads, a.kv_heads, scale);
  CHECK_LAUNCH("attn_dkdv_kernel");
  set_smem(attn_dq_kernel<T, HD>, smem);
  const dim3 gq((a.S + kTile - 1) / kTile, a.heads, a.B);
  attn_dq_kernel<T, HD><<<gq, kThreads, smem, s>>>(dq, q, k, v, dout, lse, delta, a.S, a.heads, a.kv_heads, scale);
  CHECK_LAUNCH("attn_dq_kernel");
}

}  // namespace

void attention_forward_wmma(Stream s, Ten out, float* lse, Ten q, Ten k, Ten v, const Attn& a) {
  check_forward(a, out, q, k, v);
  if (a.B == 0 || a.S == 0) return;
  with_head_dim(a.head_dim, [&](auto hd) {
    dispatch(q.dt, [&](auto t) {
      using T = decltype(t);
      forward_impl<T, decltype(hd)::value>(s, static_cast<T*>(out.p), lse, static_cast<const T*>(q.p),
                                           static_cast<const T*>(k.p), static_cast<const T*>(v.p), a);
    });
  });
}

void attention_backward_wmma(Stream s, Ten dq, Ten dk, Ten dv, float* delta, Ten dout, Ten q, Ten k, Ten v, Ten out,
                        const float* lse, const Attn& a) {
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
