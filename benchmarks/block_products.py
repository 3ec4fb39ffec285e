"""What the weight products of a k-row block cost against a one-row product, for each kernel torch offers on this
machine, over the target's real weights, in one run.

A verify of k+1 tokens reads the same weights as a one-token decode, so on a memory-bound machine it should cost
about the same; the 8-token verify ÷ decode target of issue #30 (≤ 1.3×) rests on that. This times only the
products (every layer's fused q/k/v, output, fused gate/up and down weights, and the lm_head: the bytes a forward
must read), so what it prints is the kernel's share of the ratio, with attention and the per-layer elementwise
work left out. Kernels:

- `plain`: `F.linear` on the weight as the model holds it (MKL's sgemm; what a one-token decode uses);
- `mkl-packed`: MKL's GEMM on a weight packed once for the block's row count (`FusedDecoder.prepare_blocks`;
  what a verify block uses);
- `onednn`: oneDNN's inner product on a weight reordered once into its blocked layout for the block's row count
  (`FusedDecoder.prepare_blocks(rows, "onednn")`; what decodes and verify blocks use where `--weight-layout auto`
  measures it faster);
- `inductor-cpp`: `torch.compile` with freezing and max-autotune restricted to inductor's C++ micro-GEMM
  template (weights packed at compile time; the template Intel's CPU LLM work added for small-M products);
- `inductor-auto`: the same compile, autotuned between that template and ATen's kernels (what
  `mode="max-autotune"` would pick).

Each (kernel, rows) is warmed up, kernels and row counts are interleaved so that load drift hits all alike, and
medians are printed with the bandwidth they imply (weight bytes ÷ time). Time it on an idle machine.

Usage: python benchmarks/block_products.py [--target default] [--rows 1,2,4,8] [--repeats 15] [--kernels ...]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from evalsuite.target.model import TargetModel
from evalsuite.timing import DeviceClock

KERNELS = ("plain", "mkl-packed", "onednn", "inductor-cpp", "inductor-auto")


class _Products(torch.nn.Module):
    """Every weight of the forward as a bias-free Linear (the same storage as the target's), applied to one input
    each: the module torch.compile freezes and packs."""

    def __init__(self, weights: list[torch.Tensor]):
        super().__init__()
        self.linears = torch.nn.ModuleList()
        for w in weights:
            linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
            linear.weight = torch.nn.Parameter(w, requires_grad=False)
            self.linears.append(linear)

    def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [linear(x) for linear, x in zip(self.linears, xs)]


def compiled(weights: list[torch.Tensor], xs: list[torch.Tensor], backends: str):
    """A compiled module of its own per (kernel, rows): dynamo keys its cache on the module, so each keeps the
    kernels it was compiled with."""
    import torch._inductor.config as inductor

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    with inductor.patch(freezing=True, max_autotune=True, max_autotune_gemm_backends=backends):
        fn = torch.compile(_Products(weights).eval())
        start = time.perf_counter()
        fn(xs)
        return fn, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="default")
    parser.add_argument("--rows", default="1,2,4,8")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--kernels", default=",".join(KERNELS))
    args = parser.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")]
    kernels = args.kernels.split(",")
    unknown = sorted(set(kernels) - set(KERNELS))
    if unknown:
        raise SystemExit(f"unknown kernel(s) {', '.join(unknown)}; choose from {', '.join(KERNELS)}")

    target = TargetModel.load(args.target, "cpu", weight_layout="fused")
    fused = target.fused
    weights = [getattr(layer, name) for layer in fused.layers for name in ("qkv", "o", "gate_up", "down")]
    weights.append(fused.head)
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    pack = torch.ops.mkl._mkl_reorder_linear_weight
    clock = DeviceClock(torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)

    runners, compile_s = {}, {}
    with torch.inference_mode():
        for rows in rows_list:
            xs = [torch.randn(rows, w.shape[1], generator=generator) for w in weights]
            if "plain" in kernels:
                runners["plain", rows] = lambda xs=xs: [F.linear(x, w) for x, w in zip(xs, weights)]
            if "mkl-packed" in kernels:
                packed = [pack(w, rows) for w in weights]
                runners["mkl-packed", rows] = lambda xs=xs, packed=packed, rows=rows: [
                    torch.ops.mkl._mkl_linear(x, p, w, None, rows) for x, p, w in zip(xs, packed, weights)]
            if "onednn" in kernels:
                reordered = [torch.ops.mkldnn._reorder_linear_weight(w, rows) for w in weights]
                runners["onednn", rows] = lambda xs=xs, reordered=reordered: [
                    torch.ops.mkldnn._linear_pointwise(x, r, None, "none", [], "") for x, r in zip(xs, reordered)]
            for kernel, backends in (("inductor-cpp", "CPP"), ("inductor-auto", "CPP,ATEN")):
                if kernel in kernels:
                    fn, seconds = compiled(weights, xs, backends)
                    runners[kernel, rows] = lambda xs=xs, fn=fn: fn(xs)
                    compile_s[kernel, rows] = seconds

        def timed(key) -> float:
            start = clock.now()
            runners[key]()
            return clock.now() - start

        for key in runners:
            timed(key)
            timed(key)
        times = {key: [] for key in runners}
        for _ in range(args.repeats):
            for key in runners:
                times[key].append(timed(key))
    median = {key: statistics.median(v) for key, v in times.items()}
    best_one = min(t for (kernel, rows), t in median.items() if rows == 1)
    print(f"target: {target.name}; products over {len(weights)} weights, {nbytes / 1e6:.0f} MB read per block; "
          f"{torch.get_num_threads()} threads; {args.repeats} repeats (medians); ÷ best 1-row = time ÷ the fastest "
          f"one-row kernel ({1e3 * best_one:.1f} ms)")
    print(f"{'kernel':15s}{'rows':>5s}{'ms':>9s}{'GB/s':>7s}{'÷ best 1-row':>14s}{'compile s':>11s}")
    for kernel in kernels:
        for rows in rows_list:
            t = median.get((kernel, rows))
            if t is None:
                continue
            made = compile_s.get((kernel, rows))
            print(f"{kernel:15s}{rows:5d}{1e3 * t:9.2f}{nbytes / t / 1e9:7.1f}{t / best_one:14.2f}"
                  f"{'' if made is None else f'{made:11.0f}'}")
    for rows in rows_list:
        cells = {k: median[k, rows] for k in kernels if (k, rows) in median}
        if cells:
            fastest = min(cells, key=cells.get)
            print(f"rows {rows}: fastest {fastest} {1e3 * cells[fastest]:.2f} ms = {cells[fastest] / best_one:.2f}× "
                  "the best one-row product")


if __name__ == "__main__":
    main()
