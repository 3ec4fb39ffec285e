"""Few-row products on weights stored in 16-column panels: evalsuite's own CPU kernel (fp32), built once per machine.

Why: a decode multiplies one row, and a verify block 2 … k+1 rows, by every weight of the target, so both should
cost one read of the weights. The kernels torch ships do not get there on every CPU: on the 2-core AMD EPYC of
the development VM MKL's one-row product ran at a third of the copy bandwidth and its 8-row one at a fifth of the
cores' peak, and oneDNN's blocked weights at half the bandwidth for one row (benchmarks/results/
block_products_cpu.txt). Here each weight is repacked once into panels of 16 output columns, [N/16, K, 16]
(zero-padded), so one panel streams from memory in order; a register block of up to 8 rows × 2-4 panels keeps its
sums in vector registers while the panel is read once for all its rows, and the panels are split over the torch
threads (`at::parallel_for`).

Batch-invariant by construction: every output element is one chain of fused multiply-adds over k in order, the
same whatever the row count or the row's place in the block, so a verify block's row gives bit for bit the
product a one-token decode gives for the same input (tests/test_panel.py). The plain GCC vector type is lowered to
whatever the machine has (AVX-512, AVX2, NEON) by -march=native.

Built with torch's C++ extension loader (ninja and a C++ compiler) into evalsuite's cache, under a name that
includes the CPU model and the source's hash, so that a cache shared between machines never loads a binary built
for another CPU; the build (~30 s on 2 cores) happens at most once per machine, in the target's untimed set-up.
Where it cannot be built, `available()` is False and `reason()` says why (the run then picks among the others)."""

from __future__ import annotations

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

typedef float v16 __attribute__((vector_size(64), aligned(4)));
constexpr int64_t L = 16;  // output columns per panel
constexpr int64_t MB = 8;  // rows per register block

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

// rows x[0..M) (stride ldx) times NP consecutive panels p (each K x L): y[m, n0 + j*L + c]
template <int M, int NP>
static inline void block(const float* x, int64_t ldx, const float* p, int64_t K, float* y, int64_t ldy,
                         int64_t n0, int64_t N) {
  v16 acc[M][NP];
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < NP; ++j) acc[m][j] = (v16){};
  for (int64_t k = 0; k < K; ++k) {
    v16 w[NP];
    for (int j = 0; j < NP; ++j) w[j] = *(const v16*)(p + (j * K + k) * L);
    for (int m = 0; m < M; ++m) {
      const float xv = x[m * ldx + k];
      for (int j = 0; j < NP; ++j) acc[m][j] += xv * w[j];
    }
  }
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < NP; ++j) {
      const int64_t n = n0 + j * L;
      const int64_t cols = std::min<int64_t>(L, N - n);
      for (int64_t c = 0; c < cols; ++c) y[m * ldy + n + c] = acc[m][j][c];
    }
}

template <int NP>
static void rows_block(int64_t m, const float* x, int64_t ldx, const float* p, int64_t K, float* y, int64_t ldy,
                       int64_t n0, int64_t N) {
  switch (m) {
    case 1: block<1, NP>(x, ldx, p, K, y, ldy, n0, N); break;
    case 2: block<2, NP>(x, ldx, p, K, y, ldy, n0, N); break;
    case 3: block<3, NP>(x, ldx, p, K, y, ldy, n0, N); break;
    case 4: block<4, NP>(x, ldx, p, K, y, ldy, n0, N); break;
    case 5: block<5, NP>(x, ldx, p, K, y, ldy, n0, N); break;
    case 6: block<6, NP>(x, ldx, p, K, y, ldy, n0, N); break;
    case 7: block<7, NP>(x, ldx, p, K, y, ldy, n0, N); break;
    default: block<8, NP>(x, ldx, p, K, y, ldy, n0, N); break;
  }
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
  const int64_t group = M <= 2 ? 4 : 2;  // panels per register block: more independent sums for 1-2 rows
  const int64_t groups = (panels + group - 1) / group;
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t panel = g * group, np = std::min<int64_t>(group, panels - panel);
      const float* pa = pp + panel * K * L;
      for (int64_t m0 = 0; m0 < M; m0 += MB) {
        const int64_t m = std::min<int64_t>(MB, M - m0);
        if (np == 4) rows_block<4>(m, xp + m0 * K, K, pa, K, yp + m0 * N, N, panel * L, N);
        else if (np == 2) rows_block<2>(m, xp + m0 * K, K, pa, K, yp + m0 * N, N, panel * L, N);
        else for (int64_t j = 0; j < np; ++j)
          rows_block<1>(m, xp + m0 * K, K, pa + j * K * L, K, yp + m0 * N, N, (panel + j) * L, N);
      }
    }
  });
  return Y;
}
"""


@functools.cache
def _build():
    """The compiled module, or the one-line reason it cannot be built here."""
    if shutil.which("c++") is None and shutil.which("g++") is None:
        return "no C++ compiler (c++/g++) on PATH"
    try:
        from torch.utils.cpp_extension import load_inline, verify_ninja_availability
        verify_ninja_availability()
    except (ImportError, RuntimeError) as err:
        return f"torch's C++ extension loader is unusable ({str(err).splitlines()[0]}; pip install ninja)"
    tag = hashlib.sha256((cpu_model() + torch.__version__ + _SOURCE).encode()).hexdigest()[:12]
    directory = cache_root() / "kernels" / f"panel-{tag}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        return load_inline(f"evalsuite_panel_{tag}", _SOURCE, functions=["pack", "linear"],
                           extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"],
                           build_directory=str(directory), verbose=False)
    except Exception as err:  # a compiler or linker error: the kernel is unavailable here, and the reason recorded
        lines = [line for line in str(err).splitlines() if line.strip()]
        return f"the panel kernel did not build ({lines[0] if lines else type(err).__name__})"


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
