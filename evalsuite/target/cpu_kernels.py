"""evalsuite's own CPU kernels (fp32), built once per machine: few-row products on weights stored in 16-column
panels, and the attention of decodes and verify blocks over the static KV cache.

Products. Why: a decode multiplies one row, and a verify block 2 … k+1 rows, by every weight of the target, so both should
cost one read of the weights. The kernels torch ships do not get there on every CPU: on the 2-core AMD EPYC of
the development VM MKL's one-row product ran at a third of the copy bandwidth and its 8-row one at a fifth of the
cores' peak, and oneDNN's blocked weights at half the bandwidth for one row (benchmarks/results/
block_products_cpu.txt). Here each weight is repacked once into panels of 16 output columns, [N/16, K, 16]
(zero-padded), so one panel streams from memory in order; a register block of rows × panels keeps its sums in
vector registers while the panel is read once for all its rows, and the panels are split over the torch threads
(`at::parallel_for`). The blocks follow the machine's vector registers: with AVX-512 (32 registers of 16 lanes) up
to 8 rows × 2-4 panels; elsewhere (AVX2's 16 registers of 8 lanes, NEON) up to 6 rows × 1-4 panels of two 8-lane
vectors each, with 13-14 (19-20, …) rows as full 6-row blocks and a tail of 1-2 rows over two panels, 7-8 rows as
the 8 lanes of one vector against a panel's 16 columns (`lanes_panel`), and each panel's lines asked for 4 KB
ahead in blocks of 3 or more rows (on a Zen 3 the tail and the prefetch took an 8-row product over a model's
weights from 2.3× to 1.8× a one-row one, and its 8-token verify from 2.1-2.2× to 1.7-2.0× a decode).
A 16-lane vector type on an AVX2 machine is emulated and its blocks spill: on a Zen 3 the products ran 5-20× and
the attention 3-15× slower than the 8-lane forms, bit for bit the same results (Dec 6 2026).

Batch-invariant by construction: every output element is one chain of fused multiply-adds over k in order, the
same whatever the row count or the row's place in the block, so a verify block's row gives bit for bit the
product a one-token decode gives for the same input (tests/test_cpu_kernels.py). The plain GCC vector type is lowered to
whatever the machine has (AVX-512, AVX2, NEON) by -march=native.

Attention (`attention`): a decode's or verify block's folded query rows (query heads per K/V head × rows, the
decoder's GQA folding) against the K/V cache, causal within the block. The keys are split into chunks over the
threads (each chunk keeps the online-softmax state of every row, merged at the end, as flash-decoding does) and
the rows are the vector lanes, so each key and value is read once for all rows and a dot product needs no
horizontal sum; the exponential is a vectorised polynomial (relative error ~1e-7). Without AVX-512 the rows are
8-lane vectors taken 3 at a time (the last 4 as 2 + 2) and the output is held transposed (`attend_rows`), so that both products
fit 16 registers (a decode's few rows multiply P·V row by row instead); same arithmetic per element, same result.
On the development VM it took 0.5-0.6× the time of SDPA's CPU kernel for a decode and 0.5-0.7× for an 8-token
block at 512-8k tokens (SmolLM2's and Qwen2.5-0.5B's head shapes). Not batch-invariant as the products are: the
key chunks follow the context length, so a block's row and a decode at the same position can merge their partial
softmax sums in another order (the last bits of a logit).

Built with torch's C++ extension loader (ninja and a C++ compiler) into evalsuite's cache, under a name that
includes the CPU model and the source's hash, so that a cache shared between machines never loads a binary built
for another CPU; the build (~30 s on 2 cores) happens at most once per machine, in the target's untimed set-up.
Where it cannot be built, `available()` is False and `reason()` says why (the run then picks among the others)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import shutil

import torch

from evalsuite.target.remembered import cache_root, cpu_model

MAX_ROWS = 32  # products of 1 … this many rows run on the panels (longer prefill chunks stay on F.linear)

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef int32_t vi16 __attribute__((vector_size(64), aligned(4)));
typedef float v8 __attribute__((vector_size(32), aligned(4)));
typedef int32_t vi8 __attribute__((vector_size(32), aligned(4)));
constexpr int64_t L = 16;  // output columns per panel
// The register blocks follow the machine's vectors. With AVX-512 (32 registers of 16 lanes) a panel is one vector
// and a block holds up to 8 rows; elsewhere (AVX2: 16 registers of 8 lanes; NEON) a panel is two 8-lane vectors
// and a block holds up to 6 rows: a 16-lane vector there is emulated, and a block of them spills its sums to
// memory (5-20x slower products on a Zen 3). Each lane's arithmetic is the same either way, so is the result.
#if defined(__AVX512F__)
typedef v16 vp;
typedef vi16 vpi;
constexpr int64_t MB = 8;  // rows per register block
#else
typedef v8 vp;
typedef vi8 vpi;
constexpr int64_t MB = 6;
#endif
constexpr int64_t LN = sizeof(vp) / sizeof(float), VP = L / LN;  // lanes per vector, vectors per panel
constexpr bool WIDE = VP == 1;  // a panel is one vector (32 registers)

torch::Tensor pack(torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kFloat32 && w.device().is_cpu(),
              "panel pack: a 2-D float32 CPU weight");
  auto W = w.contiguous();
  const int64_t N = W.size(0), K = W.size(1), panels = (N + L - 1) / L;
  auto P = torch::zeros({panels, K, L}, W.options());
  const float* src = W.data_ptr<float>();
  float* dst = P.data_ptr<float>();
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t c = 0; c < L && p * L + c < N; ++c)
        for (int64_t k = 0; k < K; ++k) dst[(p * K + k) * L + c] = src[(p * L + c) * K + k];
  });
  return P;
}

// rows x[0..M) (stride ldx) times NV vectors of consecutive panels from p (VP vectors per panel, each panel K x L):
// y[m, n0 + ...]
template <int M, int NV>
static inline void block(const float* x, int64_t ldx, const float* p, int64_t K, float* y, int64_t ldy,
                         int64_t n0, int64_t N) {
  vp acc[M][NV];
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < NV; ++j) acc[m][j] = (vp){};
  for (int64_t k = 0; k < K; ++k) {
    // 8-lane machines: ask for each panel's line 4 KB ahead. Without it a block of 3 or more rows computes and then
    // waits on memory in turn (a Zen 3's time for 6 rows was the sum of 1 row's and the compute's); with it the
    // 8-row products over a model's weights went from 1.54x to 1.43x the 1-row ones and the 4-row from 1.27x to
    // 1.13x (2 threads). A block of 1-2 rows is bound by memory already, and streams at the copy bandwidth.
    if constexpr (!WIDE && M >= 3)
      for (int j = 0; j < NV; j += VP) __builtin_prefetch(p + ((j / VP) * K + k + 64) * L, 0, 3);
    vp w[NV];
    for (int j = 0; j < NV; ++j) w[j] = *(const vp*)(p + ((j / VP) * K + k) * L + (j % VP) * LN);
    for (int m = 0; m < M; ++m) {
      const float xv = x[m * ldx + k];
      for (int j = 0; j < NV; ++j) acc[m][j] += xv * w[j];
    }
  }
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < NV; ++j) {
      const int64_t n = n0 + (j / VP) * L + (j % VP) * LN;
      const int64_t cols = std::min<int64_t>(LN, N - n);
      if (cols == LN) *(vp*)(y + m * ldy + n) = acc[m][j];  // whole vectors: with a short K (DLite's rank-32 head)
      else for (int64_t c = 0; c < cols; ++c) y[m * ldy + n + c] = acc[m][j][c];  // lane by lane cost 1.5-2.3x
    }
}

template <int NV>
static void rows_block(int64_t m, const float* x, int64_t ldx, const float* p, int64_t K, float* y, int64_t ldy,
                       int64_t n0, int64_t N) {
  switch (m) {
    case 1: block<1, NV>(x, ldx, p, K, y, ldy, n0, N); break;
    case 2: block<2, NV>(x, ldx, p, K, y, ldy, n0, N); break;
    case 3: block<3, NV>(x, ldx, p, K, y, ldy, n0, N); break;
    case 4: block<4, NV>(x, ldx, p, K, y, ldy, n0, N); break;
    case 5: block<5, NV>(x, ldx, p, K, y, ldy, n0, N); break;
    case 6: block<6, NV>(x, ldx, p, K, y, ldy, n0, N); break;
#if defined(__AVX512F__)
    case 7: block<7, NV>(x, ldx, p, K, y, ldy, n0, N); break;
    default: block<8, NV>(x, ldx, p, K, y, ldy, n0, N); break;
#endif
  }
}

// the block of m rows over the np panels of a group (np * VP vectors); a short last group takes its panels one at a time
static inline void group_block(int64_t np, int64_t m, const float* x, int64_t K, const float* pa, float* y,
                               int64_t N, int64_t n0) {
  switch (np * VP) {
    case 8: rows_block<8>(m, x, K, pa, K, y, N, n0, N); break;
    case 4: rows_block<4>(m, x, K, pa, K, y, N, n0, N); break;
    case 2: rows_block<2>(m, x, K, pa, K, y, N, n0, N); break;
    case 1: rows_block<1>(m, x, K, pa, K, y, N, n0, N); break;
    default:
      for (int64_t j = 0; j < np; ++j) rows_block<VP>(m, x, K, pa + j * K * L, K, y, N, n0 + j * L, N);
  }
}

// Whether M rows take full blocks of MB rows panel by panel and their last 1-2 rows one block over a group of two
// panels (8-lane machines). A block needs about 12 independent sums to keep both FMA pipes busy through the FMA's
// latency: on a Zen 3, 6 rows x 2 vectors ran at ~92 GFLOP/s (L3-resident weights, one core) and 4 x 2 at ~50, so
// 8 rows as 6 + 2 (the 2 over 4 vectors) beat 4 + 4 by 1.35-1.6x.
static inline bool short_tail(int64_t M) { return !WIDE && M > MB && M % MB != 0 && M % MB <= 2; }

// a group of np panels for all M rows, in register blocks of at most MB rows: full blocks and a short tail (above),
// or blocks split evenly (7 rows as 4 + 3 on 16-lane machines)
static void panel_group(int64_t np, int64_t M, const float* xp, int64_t K, const float* pa, float* yp, int64_t N,
                        int64_t n0) {
  if (short_tail(M)) {
    const int64_t full = M - M % MB;
    for (int64_t m0 = 0; m0 < full; m0 += MB)
      for (int64_t j = 0; j < np; ++j) rows_block<VP>(MB, xp + m0 * K, K, pa + j * K * L, K, yp + m0 * N, N, n0 + j * L, N);
    group_block(np, M - full, xp + full * K, K, pa, yp + full * N, N, n0);
    return;
  }
  for (int64_t m0 = 0; m0 < M;) {
    const int64_t left = M - m0, m = left <= MB ? left : left < 2 * MB ? (left + 1) / 2 : MB;
    group_block(np, m, xp + m0 * K, K, pa, yp + m0 * N, N, n0);
    m0 += m;
  }
}

// 8-lane machines, 7-8 rows (a verify block of 8): the rows are the lanes of one vector (xT [K][8], a zero lane past
// M) and a panel's 16 columns are 16 sums, each w[n,k] broadcast against the rows' x[.,k]. Every output element is
// the same chain of FMAs over k in order as in `block` (w·x for x·w: the same exact product), so the same bits.
// Each panel is read once, by one block, where 6 rows x 2 vectors and a 2-row tail over two panels read it twice
// and computed the tail apart from the stream (from L3 where two panels outgrow L2: Qwen2.5-0.5B's down, K = 4864).
// Paired on a Zen 3 (kernel_ab.py, 2 threads): Qwen2.5-0.5B's 8-token verify 0.88x its former time at 1k tokens and
// 0.96x at 8k; SmolLM2's 0.87-1.07x over two runs (inside this VM's noise).
static inline bool lane_rows(int64_t M) { return !WIDE && (M == 7 || M == 8); }

static inline void lanes_panel(const float* xT, const float* p, int64_t K, float* y, int64_t M, int64_t n0, int64_t N) {
  v8 acc[L];
  for (int c = 0; c < L; ++c) acc[c] = (v8){};
  for (int64_t k = 0; k < K; ++k) {
    __builtin_prefetch(p + (k + 64) * L, 0, 3);
    const v8 xv = *(const v8*)(xT + k * 8);
    const float* wk = p + k * L;
    for (int c = 0; c < L; ++c) acc[c] += wk[c] * xv;
  }
  const int64_t cols = std::min<int64_t>(L, N - n0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < cols; ++c) y[m * N + n0 + c] = acc[c][m];
}

torch::Tensor linear(torch::Tensor x, torch::Tensor P, int64_t N) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && P.dim() == 3 && x.size(-1) == P.size(1),
              "panel linear: float32 rows of the packed weight's width");
  auto X = x.contiguous();
  const int64_t K = P.size(1), panels = P.size(0), M = X.numel() / K;
  auto Y = torch::empty({M, N}, X.options());
  const float* xp = X.data_ptr<float>();
  const float* pp = P.data_ptr<float>();
  float* yp = Y.data_ptr<float>();
  if (lane_rows(M)) {
    std::vector<float> xT(K * 8, 0.f);
    for (int64_t k = 0; k < K; ++k)
      for (int64_t m = 0; m < M; ++m) xT[k * 8 + m] = xp[m * K + k];
    const float* xt = xT.data();
    at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) lanes_panel(xt, pp + p * K * L, K, yp, M, p * L, N);
    });
    return Y;
  }
  // panels per register block: more independent sums for fewer rows, as many as the registers hold
  const int64_t group = WIDE ? (M <= 2 ? 4 : 2) : (M == 1 ? 4 : M == 2 || short_tail(M) ? 2 : 1);
  const int64_t groups = (panels + group - 1) / group;
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t panel = g * group, np = std::min<int64_t>(group, panels - panel);
      panel_group(np, M, xp, K, pp + panel * K * L, yp, N, panel * L);
    }
  });
  return Y;
}

template <typename V, typename VI>
static inline V vexp(V x) {  // e^x for x <= 0 (rel. error ~1e-7); lanes below -87 give ~e^-87
  x = x < -87.0f ? V{} - 87.0f : x;
  const VI n = __builtin_convertvector(x * 1.44269504088896341f, VI);  // toward zero: r in (-ln2, ln2)
  const V nf = __builtin_convertvector(n, V);
  const V r = (x - nf * 0.693359375f) - nf * -2.12194440e-4f;
  V p = r * (1.0f / 362880.0f) + (1.0f / 40320.0f);
  p = p * r + (1.0f / 5040.0f);
  p = p * r + (1.0f / 720.0f);
  p = p * r + (1.0f / 120.0f);
  p = p * r + (1.0f / 24.0f);
  p = p * r + (1.0f / 6.0f);
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const VI bits = (n + 127) << 23;
  V scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}


// Keep a vector that several FMAs use in a register (x86): GCC otherwise folds its load into each FMA as a memory
// operand, and a Zen 3 loads two vectors a cycle, so a block of 12 FMAs and 16 loads waited on its loads.
// The same barrier rounds the output's rescale (acc * alpha) before the tile's first FMA: `o = acc * a; o += p * v`
// has two products in its first sum, and GCC fused one or the other depending on the vector width (fma(acc, a, p·v)
// in one build, fma(p, v, acc·a) in the other: the last bit of a few outputs differed between the AVX-512 and the
// AVX2 build on a Xeon, Dec 8 2026). Held in a register, the rounded product is the chain's start in every form.
#if defined(__x86_64__)
#define IN_REGISTER(v) __asm__("" : "+x"(v))
#else
#define IN_REGISTER(v) (void)0
#endif

// One (batch, kv head, key chunk): the softmax state (max m, sum l, unnormalised output acc) of all R folded query
// rows over keys [t0, t1), online over tiles of 16 keys. Vectorised over the rows (lanes of RV vectors V: R <= RV ×
// V's lanes), so each key is read once for every row and no dot product needs a horizontal sum; the scores of KS keys at a time
// stay in registers (KS * RV accumulators), with q transposed once. V: the lane vector (8 lanes for up to 8 rows:
// two 256-bit FMAs per cycle where a 512-bit one is split in two, as on AMD Zen 4). The lane count is picked per
// folded row count so that few lanes go unused: 24 rows (SmolLM2's 3 query heads per K/V head × an 8-token block)
// as 3 × 8 lanes, not 2 × 16; 56 (Qwen2.5-0.5B's 7 × 8) as 7 × 8, not 4 × 16. Each lane's arithmetic is the same
// either way, so the result is too, bit for bit.
template <int DV, int RV, typename V, typename VI>
static void attend_chunk(const float* q, int64_t R, const float* k, const float* v, int64_t ldkv, int64_t t0,
                              int64_t t1, int64_t T, int64_t rows, float scale, float* m, float* l, float* acc) {
  constexpr int64_t D = DV * 16, LN = sizeof(V) / sizeof(float), KS = RV >= 5 ? 2 : RV >= 3 ? 4 : 16 / RV, W = RV * LN;
  alignas(64) float qt[D][W];  // q transposed and scaled; lanes past R are zero
  for (int64_t d = 0; d < D; ++d)
    for (int64_t r = 0; r < W; ++r) qt[d][r] = r < R ? q[r * D + d] * scale : 0.f;
  V lastv[RV], mv[RV], lv[RV];
  for (int rv = 0; rv < RV; ++rv)
    for (int i = 0; i < LN; ++i) {
      const int64_t r = rv * LN + i;
      lastv[rv][i] = r < R ? (float)(T - rows + (r % rows)) : -1.f;  // lanes past R see no key
      mv[rv][i] = -INFINITY;
      lv[rv][i] = 0.f;
    }
  std::fill(acc, acc + R * D, 0.f);
  alignas(64) float p[16][W];
  alignas(64) float alpha_s[W];
  for (int64_t t = t0; t < t1; t += 16) {
    const int64_t tn = std::min<int64_t>(16, t1 - t);
    V S[16][RV];
    for (int64_t j0 = 0; j0 < 16; j0 += KS) {
      V s[KS][RV];
      for (int j = 0; j < KS; ++j) for (int rv = 0; rv < RV; ++rv) s[j][rv] = V{};
      const float* kp[KS];
      for (int j = 0; j < KS; ++j) kp[j] = k + (t + std::min<int64_t>(j0 + j, tn - 1)) * ldkv;
      for (int64_t d = 0; d < D; ++d) {
        V qd[RV];
        for (int rv = 0; rv < RV; ++rv) qd[rv] = *(const V*)(&qt[d][rv * LN]);
        for (int j = 0; j < KS; ++j) {
          const float kd = kp[j][d];
          for (int rv = 0; rv < RV; ++rv) s[j][rv] += qd[rv] * kd;
        }
      }
      for (int j = 0; j < KS; ++j) {
        const float key = (float)(t + j0 + j);
        for (int rv = 0; rv < RV; ++rv)
          S[j0 + j][rv] = (j0 + j < tn) & (key <= lastv[rv]) ? s[j][rv] : V{} - INFINITY;
      }
    }
    for (int rv = 0; rv < RV; ++rv) {
      V mt = S[0][rv];
      for (int j = 1; j < 16; ++j) mt = S[j][rv] > mt ? S[j][rv] : mt;
      const V mnew = mt > mv[rv] ? mt : mv[rv];
      const V live = mnew > -INFINITY ? mnew : V{};  // rows with no visible key yet: everything 0
      const V alpha = mv[rv] == -INFINITY ? V{} : vexp<V, VI>(mv[rv] - live);
      V sum = V{};
      for (int j = 0; j < 16; ++j) {
        V pj = vexp<V, VI>(S[j][rv] - live);
        pj = S[j][rv] == -INFINITY ? V{} : pj;
        sum += pj;
        *(V*)(&p[j][rv * LN]) = pj;
      }
      lv[rv] = lv[rv] * alpha + sum;
      mv[rv] = mnew;
      *(V*)(&alpha_s[rv * LN]) = alpha;
    }
    for (int64_t r = 0; r < R; ++r) {
      float* ar = acc + r * D;
      const float a = alpha_s[r];
      v16 o[DV];
      for (int d = 0; d < DV; ++d) { o[d] = *(v16*)(ar + d * 16) * a; IN_REGISTER(o[d]); }
      for (int64_t j = 0; j < tn; ++j) {
        const float pj = p[j][r];
        const float* vj = v + (t + j) * ldkv;
        for (int d = 0; d < DV; ++d) o[d] += pj * *(const v16*)(vj + d * 16);
      }
      for (int d = 0; d < DV; ++d) *(v16*)(ar + d * 16) = o[d];
    }
  }
  for (int rv = 0; rv < RV; ++rv)
    for (int i = 0; i < LN && rv * LN + i < R; ++i) { m[rv * LN + i] = mv[rv][i]; l[rv * LN + i] = lv[rv][i]; }
}

// attend_chunk for machines with 16 vector registers of 8 lanes (AVX2; the 16-lane vectors attend_chunk also uses are
// emulated there, 3-7x slower): the folded rows are 8-lane vectors, taken 3 at a time (the last 4 as 2 + 2), so that the scores'
// and the output's register blocks fit the 16 registers, and the output is held transposed (accT[d][row]), so that
// P·V broadcasts one value of V against whole lane vectors of P, as Q·Kᵀ broadcasts one of K. Each output
// element is the same chain of operations as in attend_chunk (rescaled by alpha, then one FMA per key in key order),
// so the two give the same result, bit for bit.

template <int D, int NR, typename V>
static inline void qk_rows(const float* qt, int64_t W, const float* k, int64_t ldkv, int64_t t, int64_t tn,
                           const V* lastv, int rv0, float* Sm) {
  constexpr int64_t LN = sizeof(V) / sizeof(float), KS = NR == 3 ? 4 : NR == 2 ? 6 : 8;
  for (int64_t j0 = 0; j0 < 16; j0 += KS) {
    V s[KS][NR];
    for (int j = 0; j < KS; ++j) for (int r = 0; r < NR; ++r) s[j][r] = V{};
    const float* kp[KS];
    for (int j = 0; j < KS; ++j) kp[j] = k + (t + std::min<int64_t>(std::min<int64_t>(j0 + j, 15), tn - 1)) * ldkv;
    for (int64_t d = 0; d < D; ++d) {
      V qd[NR];
      for (int r = 0; r < NR; ++r) {
        qd[r] = *(const V*)(qt + d * W + (rv0 + r) * LN);
        IN_REGISTER(qd[r]);
      }
      for (int j = 0; j < KS; ++j) {
        const float kd = kp[j][d];
        for (int r = 0; r < NR; ++r) s[j][r] += qd[r] * kd;
      }
    }
    for (int j = 0; j < KS && j0 + j < 16; ++j) {
      const float key = (float)(t + j0 + j);
      for (int r = 0; r < NR; ++r)
        *(V*)(Sm + (j0 + j) * W + (rv0 + r) * LN) =
            (j0 + j < tn) & (key <= lastv[rv0 + r]) ? s[j][r] : V{} - INFINITY;
    }
  }
}

// P·V for NB consecutive output columns d0 … of NR row vectors, over the tile's tn keys. NB is a compile-time count
// (a block of DB, or the D % DB left over): a runtime column count inside the key loop made GCC branch in it and spill
// an accumulator through the stack. With 3 row vectors a block is 3 columns (9 sums, the 3 P vectors and a broadcast
// in registers: 6 loads to 9 FMAs); 4 columns (12 sums) left no register for P, whose loads GCC folded into the
// FMAs, 16 loads to 12 FMAs. On a Zen 3 (2 threads, 8k keys, same bits) these and the register-held Q took
// SmolLM2's 8-token block (24 folded rows) from 67-103 to 90-134 GFLOP/s (0.74-0.82x its time) and
// Qwen2.5-0.5B's (56 rows, now 3 + 2 + 2 vectors) to 0.89-0.92x.
template <int NB, int NR, typename V>
static inline void pv_block(float* accT, int64_t W, const float* p, const V* a, const float* v, int64_t ldkv,
                            int64_t t, int64_t tn, int rv0, int64_t d0) {
  constexpr int64_t LN = sizeof(V) / sizeof(float);
  V o[NB][NR];
  for (int dd = 0; dd < NB; ++dd)
    for (int r = 0; r < NR; ++r) {
      o[dd][r] = *(V*)(accT + (d0 + dd) * W + (rv0 + r) * LN) * a[r];
      IN_REGISTER(o[dd][r]);
    }
  for (int64_t j = 0; j < tn; ++j) {
    V pj[NR];
    for (int r = 0; r < NR; ++r) {
      pj[r] = *(const V*)(p + j * W + (rv0 + r) * LN);
      IN_REGISTER(pj[r]);
    }
    const float* vj = v + (t + j) * ldkv + d0;
    for (int dd = 0; dd < NB; ++dd) {
      const float vd = vj[dd];
      for (int r = 0; r < NR; ++r) o[dd][r] += pj[r] * vd;
    }
  }
  for (int dd = 0; dd < NB; ++dd)
    for (int r = 0; r < NR; ++r) *(V*)(accT + (d0 + dd) * W + (rv0 + r) * LN) = o[dd][r];
}

template <int D, int NR, typename V>
static inline void pv_rows(float* accT, int64_t W, const float* p, const float* alpha, const float* v, int64_t ldkv,
                           int64_t t, int64_t tn, int rv0) {
  constexpr int64_t LN = sizeof(V) / sizeof(float), DB = NR == 3 ? 3 : NR == 2 ? 6 : 8, FULL = D / DB * DB;
  V a[NR];
  for (int r = 0; r < NR; ++r) a[r] = *(const V*)(alpha + (rv0 + r) * LN);
  for (int64_t d0 = 0; d0 < FULL; d0 += DB) pv_block<DB, NR, V>(accT, W, p, a, v, ldkv, t, tn, rv0, d0);
  if constexpr (D > FULL) pv_block<D - FULL, NR, V>(accT, W, p, a, v, ldkv, t, tn, rv0, FULL);
}

// how many of the `left` row vectors the next register block takes: 3, or 2 + 2 for the last 4 (a block of one
// vector leaves FMA latency uncovered)
static constexpr int row_vectors(int left) { return left == 4 ? 2 : std::min(3, left); }

template <int DV, int RV, typename V, typename VI>
static void attend_rows(const float* q, int64_t R, const float* k, const float* v, int64_t ldkv, int64_t t0,
                        int64_t t1, int64_t T, int64_t rows, float scale, float* m, float* l, float* acc) {
  constexpr int64_t D = DV * 16, LN = sizeof(V) / sizeof(float), W = RV * LN;
  alignas(64) float qt[D * W];
  for (int64_t d = 0; d < D; ++d)
    for (int64_t r = 0; r < W; ++r) qt[d * W + r] = r < R ? q[r * D + d] * scale : 0.f;
  V lastv[RV], mv[RV], lv[RV];
  for (int rv = 0; rv < RV; ++rv)
    for (int i = 0; i < LN; ++i) {
      const int64_t r = rv * LN + i;
      lastv[rv][i] = r < R ? (float)(T - rows + (r % rows)) : -1.f;
      mv[rv][i] = -INFINITY;
      lv[rv][i] = 0.f;
    }
  alignas(64) float accT[RV > 1 ? D * W : 1];  // the output transposed (rows as lanes); a decode's stays in acc
  if constexpr (RV > 1) std::fill(accT, accT + D * W, 0.f);
  else std::fill(acc, acc + R * D, 0.f);
  alignas(64) float Sm[16 * W];
  alignas(64) float p[16 * W];
  alignas(64) float alpha_s[W];
  for (int64_t t = t0; t < t1; t += 16) {
    const int64_t tn = std::min<int64_t>(16, t1 - t);
    for (int rv0 = 0, nr = row_vectors(RV); rv0 < RV; rv0 += nr, nr = row_vectors(RV - rv0)) {
      if (nr == 3) qk_rows<D, 3, V>(qt, W, k, ldkv, t, tn, lastv, rv0, Sm);
      else if (nr == 2) qk_rows<D, 2, V>(qt, W, k, ldkv, t, tn, lastv, rv0, Sm);
      else qk_rows<D, 1, V>(qt, W, k, ldkv, t, tn, lastv, rv0, Sm);
    }
    for (int rv = 0; rv < RV; ++rv) {
      V mt = *(const V*)(Sm + rv * LN);
      for (int j = 1; j < 16; ++j) { const V sj = *(const V*)(Sm + j * W + rv * LN); mt = sj > mt ? sj : mt; }
      const V mnew = mt > mv[rv] ? mt : mv[rv];
      const V live = mnew > -INFINITY ? mnew : V{};
      const V alpha = mv[rv] == -INFINITY ? V{} : vexp<V, VI>(mv[rv] - live);
      V sum = V{};
      for (int j = 0; j < 16; ++j) {
        const V sj = *(const V*)(Sm + j * W + rv * LN);
        V pj = vexp<V, VI>(sj - live);
        pj = sj == -INFINITY ? V{} : pj;
        sum += pj;
        *(V*)(p + j * W + rv * LN) = pj;
      }
      lv[rv] = lv[rv] * alpha + sum;
      mv[rv] = mnew;
      *(V*)(alpha_s + rv * LN) = alpha;
    }
    if constexpr (RV == 1) {  // a decode's few rows: row by row over 8-lane slices of V (no lane left idle)
      // v8 by name, not V: a template's vector type has its natural 32-byte alignment, and acc and the cache are
      // only 4-byte aligned
      static_assert(sizeof(V) == sizeof(v8), "8-lane rows");
      constexpr int64_t DVEC = D / LN, DB = DVEC < 8 ? DVEC : 8;
      for (int64_t r = 0; r < R; ++r) {
        float* ar = acc + r * D;
        const float a = alpha_s[r];
        for (int64_t d0 = 0; d0 < DVEC; d0 += DB) {
          v8 o[DB];
          for (int d = 0; d < DB; ++d) { o[d] = *(const v8*)(ar + (d0 + d) * LN) * a; IN_REGISTER(o[d]); }
          for (int64_t j = 0; j < tn; ++j) {
            const float pj = p[j * W + r];
            const float* vj = v + (t + j) * ldkv + d0 * LN;
            for (int d = 0; d < DB; ++d) o[d] += pj * *(const v8*)(vj + d * LN);
          }
          for (int d = 0; d < DB; ++d) *(v8*)(ar + (d0 + d) * LN) = o[d];
        }
      }
    } else {
      for (int rv0 = 0, nr = row_vectors(RV); rv0 < RV; rv0 += nr, nr = row_vectors(RV - rv0)) {
        if (nr == 3) pv_rows<D, 3, V>(accT, W, p, alpha_s, v, ldkv, t, tn, rv0);
        else if (nr == 2) pv_rows<D, 2, V>(accT, W, p, alpha_s, v, ldkv, t, tn, rv0);
        else pv_rows<D, 1, V>(accT, W, p, alpha_s, v, ldkv, t, tn, rv0);
      }
    }
  }
  if constexpr (RV > 1)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t d = 0; d < D; ++d) acc[r * D + d] = accT[d * W + r];
  for (int rv = 0; rv < RV; ++rv)
    for (int i = 0; i < LN && rv * LN + i < R; ++i) { m[rv * LN + i] = mv[rv][i]; l[rv * LN + i] = lv[rv][i]; }
}

// AVX-512 builds: the lane vectors that verify blocks' folded rows take where 8 and 16 lanes differ (17-24 rows: 3 x 8
// or 2 x 16; 49-56: 7 x 8 or 4 x 16). 8 lanes leave fewer idle, 16 do twice the work per instruction, and which is
// faster depends on the core: 8 on an AMD EPYC with AVX-512 (Dec 6: 0.91-0.98x the attention's time of 16 lanes),
// 16 on an Intel Xeon (Dec 8: 0.79-0.81x of 8 lanes at 56 rows, 0.92x at 24, 1k-16k keys, 2 threads). Set once per
// machine from a measurement (cpu_kernels.choose_attention_lanes); each lane's arithmetic is the same, so are the bits.
static int64_t attention_lanes_ = 8;
int64_t attention_lanes(int64_t lanes) {  // 8 or 16 sets the form (AVX-512 builds only), 0 asks; returns the form in use
  TORCH_CHECK(lanes == 0 || lanes == 8 || lanes == 16, "attention lanes: 8 or 16 (0 asks)");
#if defined(__AVX512F__)
  if (lanes) attention_lanes_ = lanes;
  return attention_lanes_;
#else
  return 8;
#endif
}
bool lane_forms_differ(int64_t R) {  // whether `attention_lanes` changes the form R folded rows take here
#if defined(__AVX512F__)
  return (R > 16 && R <= 24) || (R > 48 && R <= 56);
#else
  return false;
#endif
}

// folded queries q [B, H, R, D] (R = groups * rows, row g*rows + i at position T - rows + i), keys and values
// [B, H, T, D] (any stride over B and H, rows of D contiguous): softmax(q k^T * scale) v, causal within the block.
constexpr int64_t MAX_FOLDED_ROWS = 128;
torch::Tensor attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, int64_t rows, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.scalar_type() == torch::kFloat32 &&
              k.scalar_type() == torch::kFloat32 && v.scalar_type() == torch::kFloat32, "attention: fp32 [B,H,*,D]");
  auto Q = q.contiguous();
  const int64_t B = Q.size(0), H = Q.size(1), R = Q.size(2), D = Q.size(3), T = k.size(2);
  TORCH_CHECK(R <= MAX_FOLDED_ROWS && (D == 16 || D == 32 || D == 64 || D == 128) && k.stride(3) == 1 && v.stride(3) == 1 && k.stride(2) == D &&
              v.stride(2) == D && k.stride(1) == v.stride(1) && k.stride(0) == v.stride(0),
              "attention: head_dim 16, 32, 64 or 128, at most 128 folded rows, K/V rows contiguous with the same strides");
  auto out = torch::empty_like(Q);
  const int64_t chunk = std::max<int64_t>(256, ((T + 7) / 8 + 15) / 16 * 16);
  const int64_t chunks = (T + chunk - 1) / chunk, items = B * H * chunks;
  auto state = torch::empty({items, R, 2 + D}, Q.options());
  const float* qp = Q.data_ptr<float>(); const float* kp = k.data_ptr<float>(); const float* vp = v.data_ptr<float>();
  float* sp = state.data_ptr<float>();
  const int64_t sb = k.stride(0), sh = k.stride(1);
  at::parallel_for(0, items, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t it = i0; it < i1; ++it) {
      const int64_t bh = it / chunks, c = it % chunks, b = bh / H, h = bh % H;
      float* st = sp + it * R * (2 + D);
      const float* qh = qp + bh * R * D;
      const float* kh = kp + b * sb + h * sh;
      const float* vh = vp + b * sb + h * sh;
      const int64_t t0 = c * chunk, t1 = std::min(T, t0 + chunk);
      float* m = st; float* l = st + R; float* acc = st + 2 * R;
#define EVALSUITE_ARGS (qh, R, kh, vh, D, t0, t1, T, rows, (float)scale, m, l, acc)
#if defined(__AVX512F__)
#define EVALSUITE_ATTEND(DV) \
      if (R <= 8) attend_chunk<DV, 1, v8, vi8>EVALSUITE_ARGS; \
      else if (R <= 16) attend_chunk<DV, 1, v16, vi16>EVALSUITE_ARGS; \
      else if (attention_lanes_ == 16 && lane_forms_differ(R)) { \
        if (R <= 24) attend_chunk<DV, 2, v16, vi16>EVALSUITE_ARGS; \
        else attend_chunk<DV, 4, v16, vi16>EVALSUITE_ARGS; } \
      else if (R <= 24) attend_chunk<DV, 3, v8, vi8>EVALSUITE_ARGS; \
      else if (R <= 32) attend_chunk<DV, 2, v16, vi16>EVALSUITE_ARGS; \
      else if (R <= 48) attend_chunk<DV, 3, v16, vi16>EVALSUITE_ARGS; \
      else if (R <= 56) attend_chunk<DV, 7, v8, vi8>EVALSUITE_ARGS; \
      else if (R <= 64) attend_chunk<DV, 4, v16, vi16>EVALSUITE_ARGS; \
      else attend_chunk<DV, 8, v16, vi16>EVALSUITE_ARGS;
#else
#define EVALSUITE_ATTEND(DV) \
      if (R <= 8) attend_rows<DV, 1, v8, vi8>EVALSUITE_ARGS; \
      else if (R <= 16) attend_rows<DV, 2, v8, vi8>EVALSUITE_ARGS; \
      else if (R <= 24) attend_rows<DV, 3, v8, vi8>EVALSUITE_ARGS; \
      else if (R <= 32) attend_rows<DV, 4, v8, vi8>EVALSUITE_ARGS; \
      else if (R <= 40) attend_rows<DV, 5, v8, vi8>EVALSUITE_ARGS; \
      else if (R <= 48) attend_rows<DV, 6, v8, vi8>EVALSUITE_ARGS; \
      else if (R <= 56) attend_rows<DV, 7, v8, vi8>EVALSUITE_ARGS; \
      else if (R <= 64) attend_rows<DV, 8, v8, vi8>EVALSUITE_ARGS; \
      else attend_rows<DV, 16, v8, vi8>EVALSUITE_ARGS;
#endif
      if (D == 64) { EVALSUITE_ATTEND(4) } else if (D == 128) { EVALSUITE_ATTEND(8) } else if (D == 32) { EVALSUITE_ATTEND(2) } else { EVALSUITE_ATTEND(1) }
#undef EVALSUITE_ATTEND
#undef EVALSUITE_ARGS
    }
  });
  float* op = out.data_ptr<float>();
  at::parallel_for(0, B * H, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t bh = b0; bh < b1; ++bh)
      for (int64_t r = 0; r < R; ++r) {
        float mmax = -INFINITY;
        for (int64_t c = 0; c < chunks; ++c) mmax = std::max(mmax, sp[(bh * chunks + c) * R * (2 + D) + r]);
        float total = 0.f;
        float* o = op + (bh * R + r) * D;
        std::fill(o, o + D, 0.f);
        for (int64_t c = 0; c < chunks; ++c) {
          const float* st = sp + (bh * chunks + c) * R * (2 + D);
          if (st[r] == -INFINITY) continue;
          const float w = std::exp(st[r] - mmax);
          total += st[R + r] * w;
          const float* acc = st + 2 * R + r * D;
          for (int64_t d = 0; d < D; ++d) o[d] += acc[d] * w;
        }
        for (int64_t d = 0; d < D; ++d) o[d] /= total;
      }
  });
  return out;
}

// ---- a whole decoder layer for a decode or verify block (batch 1), one call from Python -------------------------
static void rms_rows(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    float s = 0.f;
    for (int64_t i = 0; i < n; ++i) s += xr[i] * xr[i];
    const float inv = 1.f / std::sqrt(s / (float)n + eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv * w[i];
  }
}

static void silu_mul(const float* gate_up, float* out, int64_t rows, int64_t inter) {  // silu(gate) * up
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up + r * 2 * inter;
    const float* u = g + inter;
    float* o = out + r * inter;
    int64_t i = 0;
    for (; i + LN <= inter; i += LN) {
      const vp x = *(const vp*)(g + i);
      const vp neg = x < 0.f ? x : -x;  // -|x|
      const vp e = vexp<vp, vpi>(neg);
      const vp sig = x < 0.f ? e / (1.f + e) : 1.f / (1.f + e);
      *(vp*)(o + i) = x * sig * *(const vp*)(u + i);
    }
    for (; i < inter; ++i) o[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
  }
}

// x [rows, H] → the layer's output [rows, H]; K/V of the rows written at positions start … start+rows-1 of the
// whole cache buffers [1, kv_heads, capacity, D]; cos/sin [rows, D] (sin with rotate_half's sign folded in)
torch::Tensor layer(torch::Tensor x, torch::Tensor norm1, torch::Tensor qkv_p, c10::optional<torch::Tensor> qkv_bias,
                    c10::optional<torch::Tensor> q_norm, c10::optional<torch::Tensor> k_norm, torch::Tensor o_p,
                    torch::Tensor norm2, torch::Tensor gate_up_p, torch::Tensor down_p, torch::Tensor k_buf,
                    torch::Tensor v_buf, int64_t start, torch::Tensor cos, torch::Tensor sin, int64_t heads,
                    int64_t kv_heads, int64_t intermediate, double eps, double scale) {
  const int64_t rows = x.size(0), H = x.size(1), D = k_buf.size(3), groups = heads / kv_heads;
  const int64_t qw = heads * D, kw = kv_heads * D, end = start + rows;
  TORCH_CHECK(x.is_contiguous() && k_buf.size(0) == 1 && k_buf.is_contiguous() && v_buf.is_contiguous() &&
              k_buf.size(2) >= end && cos.is_contiguous() && sin.is_contiguous(), "layer: shapes");
  auto h = torch::empty_like(x);
  rms_rows(x.data_ptr<float>(), norm1.data_ptr<float>(), h.data_ptr<float>(), rows, H, (float)eps);
  auto qkv = linear(h, qkv_p, qw + 2 * kw);
  if (qkv_bias) qkv.add_(*qkv_bias);
  float* qp = qkv.data_ptr<float>();
  if (q_norm) {  // Qwen3: RMSNorm over each head of q and k
    for (int64_t r = 0; r < rows; ++r) {
      float* row = qp + r * (qw + 2 * kw);
      rms_rows(row, q_norm->data_ptr<float>(), row, heads, D, (float)eps);
      rms_rows(row + qw, k_norm->data_ptr<float>(), row + qw, kv_heads, D, (float)eps);
    }
  }
  auto folded = torch::empty({1, kv_heads, groups * rows, D}, x.options());
  float* fp = folded.data_ptr<float>();
  float* kb = k_buf.data_ptr<float>();
  float* vb = v_buf.data_ptr<float>();
  const int64_t cap = k_buf.size(2), half = D / 2;
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = qp + r * (qw + 2 * kw);
    const float* c = cp + r * D;
    const float* s = sp + r * D;
    for (int64_t hd = 0; hd < heads + kv_heads; ++hd) {  // rotary: t·cos + swap_halves(t)·sin
      const float* t = row + hd * D;
      float* dst = hd < heads
          ? fp + ((hd / groups) * groups * rows + (hd % groups) * rows + r) * D    // folded row g·rows + r
          : kb + ((hd - heads) * cap + start + r) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = t[d] * c[d] + t[d < half ? d + half : d - half] * s[d];
    }
    for (int64_t kv = 0; kv < kv_heads; ++kv)
      std::memcpy(vb + (kv * cap + start + r) * D, row + qw + kw + kv * D, D * sizeof(float));
  }
  auto attended = attention(folded, k_buf.narrow(2, 0, end), v_buf.narrow(2, 0, end), rows, scale);
  auto merged = torch::empty({rows, qw}, x.options());  // back to [rows, heads·D]
  const float* ap = attended.data_ptr<float>();
  float* mp = merged.data_ptr<float>();
  for (int64_t hd = 0; hd < heads; ++hd)
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(mp + r * qw + hd * D, ap + ((hd / groups) * groups * rows + (hd % groups) * rows + r) * D,
                  D * sizeof(float));
  auto out = x + linear(merged, o_p, H);
  rms_rows(out.data_ptr<float>(), norm2.data_ptr<float>(), h.data_ptr<float>(), rows, H, (float)eps);
  auto gate_up = linear(h, gate_up_p, 2 * intermediate);
  auto act = torch::empty({rows, intermediate}, x.options());
  silu_mul(gate_up.data_ptr<float>(), act.data_ptr<float>(), rows, intermediate);
  return out.add_(linear(act, down_p, H));
}
"""


def source_tag(source: str = _SOURCE) -> str:
    """A build of `source` here: the hash of the CPU model, torch version and source."""
    return hashlib.sha256((cpu_model() + torch.__version__ + source).encode()).hexdigest()[:12]


def build_directory():
    """Where the kernels are built and cached: one directory per CPU model, torch version and source."""
    return cache_root() / "kernels" / f"cpu-{source_tag()}"


def build_tag() -> str:
    """The kernels' build: the CPU model, torch and the source. A measurement of the kernels (a remembered choice of
    products or threads) holds for this build only."""
    return build_directory().name


@contextlib.contextmanager
def _builder_lock(directory: Path):
    """Serialise builds of one kernel directory with a lock the kernel releases when its holder dies, and clear
    torch's own build baton (`lock`, a plain file) when a builder was killed and left it: torch would wait on it
    forever, and every later run would hang silently at its start. Holding this lock, no other evalsuite process
    is building here, so a baton found now is stale."""
    try:
        import fcntl
    except ImportError:  # not POSIX: torch's baton alone, as before
        yield
        return
    with open(directory / "build.flock", "a") as guard:  # closing it (or dying) releases the lock
        fcntl.flock(guard, fcntl.LOCK_EX)
        (directory / "lock").unlink(missing_ok=True)
        yield


FUNCTIONS = ("pack", "linear", "attention", "attention_lanes", "lane_forms_differ", "layer")  # what Python calls


def compile_source(directory: Path, name: str, arch_flags: list[str], source: str = _SOURCE):
    """Build (or load the cached build of) `source` (these kernels by default) in `directory` as module `name` for
    `arch_flags`, exporting the FUNCTIONS it defines (an older source, built by benchmarks/kernel_ab.py, has fewer)."""
    import re

    from torch.utils.cpp_extension import load_inline

    defined = [f for f in FUNCTIONS if re.search(rf"^[\w:<>]+ {f}\(", source, re.MULTILINE)]
    directory.mkdir(parents=True, exist_ok=True)
    with _builder_lock(directory):
        return load_inline(name, source, functions=defined,
                           extra_cflags=["-O3", *arch_flags, "-fopenmp"], extra_ldflags=["-fopenmp"],
                           build_directory=str(directory), verbose=False)


@functools.cache
def _build():
    """The compiled module, or the one-line reason it cannot be built here."""
    if shutil.which("c++") is None and shutil.which("g++") is None:
        return "no C++ compiler (c++/g++) on PATH"
    try:
        from torch.utils.cpp_extension import verify_ninja_availability
        verify_ninja_availability()
    except (ImportError, RuntimeError) as err:
        return f"torch's C++ extension loader is unusable ({str(err).splitlines()[0]}; pip install ninja)"
    directory = build_directory()
    try:
        return compile_source(directory, f"evalsuite_cpu_{directory.name.removeprefix('cpu-')}", ["-march=native"])
    except Exception as err:  # a compiler or linker error: the kernel is unavailable here, and the reason recorded
        lines = [line for line in str(err).splitlines() if line.strip()]
        return f"evalsuite's CPU kernels did not build ({lines[0] if lines else type(err).__name__})"


def available() -> bool:
    """Whether the kernel runs here (built now, or loaded from the cache; a CPU torch with a compiler)."""
    return not isinstance(_build(), str)


def reason() -> str | None:
    """Why the kernel is unavailable, or None."""
    module = _build()
    return module if isinstance(module, str) else None


def pack(weight: torch.Tensor) -> torch.Tensor:
    """`weight` [N, K] (fp32, CPU) as panels [ceil(N/16), K, 16]; `linear` needs N back."""
    return _build().pack(weight)


def linear(x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None = None):
    """x [..., K] @ weightᵀ (+ bias) on the panels: [..., out_features]."""
    y = _build().linear(x, packed, out_features).view(*x.shape[:-1], out_features)
    return y if bias is None else y.add_(bias)


MAX_FOLDED_ROWS = 128  # `attention`: query heads per K/V head × block rows
HEAD_DIMS = (16, 32, 64, 128)


def attends(head_dim: int, folded_rows: int) -> bool:
    """Whether `attention` takes this shape (fp32 on a CPU is the caller's to check)."""
    return head_dim in HEAD_DIMS and folded_rows <= MAX_FOLDED_ROWS


def attention(folded: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, rows: int, scale: float):
    """softmax(folded · keysᵀ · scale) · values for folded queries [B, kv_heads, groups·rows, D] (row g·rows + i at
    position T − rows + i, seeing keys 0 … T − rows + i) over keys/values [B, kv_heads, T, D] (views of the cache's
    buffers: rows of D contiguous)."""
    return _build().attention(folded, keys, values, rows, scale)


def attention_lanes(lanes: int = 0) -> int:
    """The lane vectors (8 or 16) of the verify blocks' folded rows whose form they change (`lane_forms_differ`);
    `lanes` sets it for this process (AVX-512 builds; elsewhere it stays 8), 0 only asks. Same bits either way."""
    return _build().attention_lanes(lanes)


def choose_attention_lanes(kv_heads: int, groups: int, rows: int, head_dim: int, keys: int = 4096) -> dict | None:
    """Set `attention_lanes` to whichever form attends a block of `rows` tokens (groups · rows folded rows) faster on
    this machine: the attention of one layer over `keys` cached keys in each form, in turn, median of 7.
    Remembered per host, CPU, torch, kernel build and shape (`remembered_choice`); None where both forms are the
    same here (no AVX-512, or a row count whose form does not change). The measurement is a few milliseconds, in
    the target's untimed set-up."""
    folded_rows = groups * rows
    if not available() or not attends(head_dim, folded_rows) or not _build().lane_forms_differ(folded_rows):
        return None
    import socket
    import statistics

    from evalsuite.target.remembered import remembered_choice
    from evalsuite.timing import DeviceClock

    key = {"host": socket.gethostname(), "cpu": cpu_model(), "torch": torch.__version__, "kernels": build_tag(),
           "kv_heads": kv_heads, "folded_rows": folded_rows, "head_dim": head_dim, "keys": keys,
           "threads": torch.get_num_threads()}

    def measure() -> dict:
        generator = torch.Generator().manual_seed(0)
        q = torch.randn(1, kv_heads, folded_rows, head_dim, generator=generator)
        k, v = (torch.randn(1, kv_heads, keys, head_dim, generator=generator) for _ in range(2))
        clock, times = DeviceClock(q.device), {8: [], 16: []}
        for _ in range(7):
            for lanes in times:
                attention_lanes(lanes)
                attention(q, k, v, rows, 0.125)
                seconds, _ = clock.time(lambda: [attention(q, k, v, rows, 0.125) for _ in range(3)])
                times[lanes].append(seconds / 3 * 1e3)
        medians = {lanes: statistics.median(t) for lanes, t in times.items()}
        return {"candidates": {str(lanes): round(ms, 4) for lanes, ms in medians.items()},
                "chosen": min(medians, key=medians.get),
                "rule": f"lower attention time of one layer's {folded_rows} folded rows over {keys} keys, "
                        f"ms, median of 7, the forms in turn"}

    choice = remembered_choice("attention-lanes", key, measure, lambda saved: saved.get("chosen") in (8, 16))
    attention_lanes(choice["chosen"])
    return choice


def heads_fit(query: torch.Tensor, kv_heads: int) -> bool:
    """Whether `attend_heads` takes unfolded queries [q, heads, D] over `kv_heads` K/V heads: fp32 on a CPU, no
    autograd (training keeps torch's attention), and a shape `attention` takes."""
    q_len, heads, head_dim = query.shape
    return query.dtype == torch.float32 and query.device.type == "cpu" and not torch.is_grad_enabled() \
        and attends(head_dim, heads // kv_heads * q_len)


def attend_heads(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, rows: int,
                 scale: float) -> torch.Tensor:
    """`attention` for unfolded queries [q, heads, D] over keys/values [kv_heads, T, D]: the query heads are folded
    per K/V head (row g·q + i, as the target's decoder folds them, so each key is read once for a head group),
    and unfolded again → [q, heads·D]. `rows` = q: the last q positions, causal within them; `rows` = 1: every
    query at the last position, seeing all T keys (no mask)."""
    q_len, heads, head_dim = query.shape
    kv_heads = keys.shape[0]
    groups = heads // kv_heads
    folded = query.view(q_len, kv_heads, groups, head_dim).permute(1, 2, 0, 3) \
        .reshape(1, kv_heads, groups * q_len, head_dim).contiguous()
    if keys.stride() != values.stride() or keys.stride(-1) != 1 or keys.stride(-2) != head_dim:
        keys, values = keys.contiguous(), values.contiguous()  # K/V rows of D contiguous, with one stride
    out = attention(folded, keys[None], values[None], rows, scale)
    return out.view(kv_heads, groups, q_len, head_dim).permute(2, 0, 1, 3).reshape(q_len, heads * head_dim)


def layer(x: torch.Tensor, weights: dict, keys: torch.Tensor, values: torch.Tensor, start: int, cos: torch.Tensor,
          sin: torch.Tensor, shape: tuple[int, int, int], eps: float, scale: float) -> torch.Tensor:
    """One decoder layer for a block x [rows, hidden] (batch 1) in one call: RMSNorm, the QKV product on the
    panels (+ bias), Qwen3's q/k norms where `weights` has them, rotary (cos, sin [rows, head_dim], sin with
    rotate_half's sign folded in), the block's K/V written into the whole cache buffers `keys`/`values`
    ([1, kv_heads, capacity, head_dim]) at `start` …, `attention` over the first start + rows positions, the output
    product and residual, RMSNorm, gate/up, SiLU·up, down and residual: the math of `FusedDecoder._layer`, without
    Python's dispatch of its ~130 small ops. `shape` = (heads, kv_heads, intermediate)."""
    heads, kv_heads, intermediate = shape
    return _build().layer(x, weights["norm1"], weights["qkv"], weights.get("qkv_bias"), weights.get("q_norm"),
                          weights.get("k_norm"), weights["o"], weights["norm2"], weights["gate_up"], weights["down"],
                          keys, values, start, cos, sin, heads, kv_heads, intermediate, eps, scale)
