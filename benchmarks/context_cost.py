"""How the target's decode and verify forwards grow with the context, for the old and the new KV cache, in one run.

The physical cost of a context is reading its KV once per forward, whether the block has 1 or 8 tokens; the
weights are read once too. So the floor of one forward is (weight bytes + KV bytes) ÷ memory bandwidth, and a
verify of a few tokens should cost little more than a one-token decode at any context. This prints, for each
context length, the median one-token decode time, the verify time of blocks of 2, 4 and 8 tokens, each ÷ the
decode, and the row's memory floor with the copy bandwidth measured in the same run — for each `--cache`:
`dynamic` (transformers' DynamicCache and SDPA: the engine before evalsuite.target.kv_cache) and `static`
(evalsuite.target.kv_cache: preallocated buffers, in-place writes, GQA-folded attention on views).
Then the roofline of an 8-token verify: its operations (forward_flops; tests/test_context_cost.py checks them
against torch's FLOP counter) ÷ the rate a large product reaches on this machine in the same run, and the bound
max(memory floor, compute floor) ÷ a decode's memory floor: the best verify-8 ÷ decode this machine allows at
that context, against which issue #30's 1.3 can be read.

Timing: each shape is warmed up first; every repeat times each context, engine and block size once, in turn, and
samples the copy bandwidth, so that load drift hits every row and the floor alike (every context's cache is
held at once; a captured target's one cache is set to each length in turn); the context is random token ids
(attention cost does not depend on the values). Threads: what torch uses (set OMP_NUM_THREADS).

Usage: python benchmarks/context_cost.py [--target default] [--contexts 512,2048,4096,8000] [--repeats 10]
       [--cache dynamic,static] [--compile]
On a GPU, a Qwen3-8B-shaped target with random bf16 weights (benchmarks/gpu_check.sh runs this):
       python benchmarks/context_cost.py --target qwen3-8b-random --device cuda --contexts 1024,8192,32768 \
           --layouts fused,fused+graphs --compile
       (--tiny: the same code path with tiny shapes, for a check on CPU)
"""

from __future__ import annotations

import argparse
import statistics

import sys
from pathlib import Path

import torch

from evalsuite.config import WEIGHT_LAYOUTS
from evalsuite.target.model import TargetModel
from evalsuite.timing import DeviceClock

BLOCKS = (1, 2, 4, 8)
# `--layouts` suffixes that pick the captured path's attention (--captured-attention; both: flash+split), and back
CAPTURED_ATTENTION = {"flash": "flash-length", "split": "split-k"}
ATTENTION_SUFFIX = {"flash-length": "+flash", "split-k": "+split", "flash+split": "+flash+split"}


def parse_layout(spec: str) -> tuple[str, list[str]]:
    """A `--layouts` entry → (weight layout, suffixes). A weight layout may hold a "+" of its own (fused+onednn,
    column-major+onednn), so the longest one the spec starts with is taken first; "" is auto."""
    layout = max((w for w in WEIGHT_LAYOUTS if spec == w or spec.startswith(w + "+")), key=len, default=None)
    if layout is None:
        layout, *flags = spec.split("+")
        return layout or "auto", flags
    return layout, spec[len(layout):].split("+")[1:]


def _median_seconds(device: torch.device, call, repeats: int) -> float:
    """The median time of `repeats` calls of `call` after one untimed call, on the project's clock."""
    clock = DeviceClock(device)
    call()
    times = []
    for _ in range(repeats):
        start = clock.now()
        call()
        times.append(clock.now() - start)
    return statistics.median(times)


def copy_bandwidth(device: torch.device, megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes per second moved by a large tensor copy (read + write counted), the median of `repeats`."""
    src = torch.ones(megabytes << 18, device=device)  # float32: 4 bytes each
    dst = torch.empty_like(src)
    return 2 * src.nbytes / _median_seconds(device, lambda: dst.copy_(src), repeats)


def gemm_rate(device: torch.device, dtype: torch.dtype = torch.float32, size: int = 1536, repeats: int = 3) -> float:
    """Floating-point operations per second of one large square product in `dtype` (the target's) on this device
    (2·size³ per product), the median of `repeats`: what the cores reach when a product is compute-bound."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)
    return 2 * size ** 3 / _median_seconds(device, lambda: torch.mm(a, b, out=out), repeats)


def forward_flops(target: TargetModel, weights: int, context: int, n: int) -> float:
    """Floating-point operations of one n-token forward after `context` tokens: every weight once per row (one
    multiply-add, 2 operations, per weight element per row; the norms' few elements included, the embedding
    table excluded as in weight_bytes) plus attention's two products (QKᵀ and PV, 2 operations per multiply-add)
    of each query head over the context and the block."""
    heads = int(target.config.num_attention_heads)
    elements = weights * 8 // torch.finfo(target.dtype).bits
    return 2 * n * elements + 4 * target.num_layers * heads * _head_dim(target.config) * n * (context + n)


def weight_bytes(target: TargetModel) -> int:
    """Bytes a forward must read: every Linear weight (lm_head included) and norm; the embedding table is only
    indexed. oneDNN copies of a weight replace, not add to, the reads of the rows they serve."""
    model = target.model
    seen, total = set(), 0
    embed = target.embed_tokens.weight
    for name, param in model.named_parameters():
        if param.data_ptr() in seen or (param is embed and param is not target.lm_head.weight):
            continue
        seen.add(param.data_ptr())
        total += param.nbytes
    return total


def kv_bytes_per_token(target: TargetModel) -> int:
    cfg = target.config
    heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
    return 2 * target.num_layers * heads * _head_dim(cfg) * torch.finfo(target.dtype).bits // 8


def _head_dim(cfg) -> int:
    return int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)


def measure(targets: dict[str, tuple[TargetModel, int]], contexts: list[int], repeats: int,
            thread_counts: list[int]) -> tuple[dict[int, dict[str, dict[int, float]]], dict[int, float],
                                               dict[int, float]]:
    """Median seconds per (context, variant, block size), and median copy bandwidth and product rate (gemm_rate)
    per thread count. Every
    repeat times every context, variant and block size once, in turn, and samples the bandwidth, so that this
    machine's drift (tens of percent within minutes on a shared VM) hits every context and the floor alike
    instead of tilting the context slope; a variant is a target and a thread count."""
    any_target = next(iter(targets.values()))[0]
    device = any_target.device
    clock = DeviceClock(device)
    # Each context's cache is prefilled and held at once; a captured target (CUDA graphs) holds one context at a
    # time, so its one cache is prefilled with the longest context and set to each shorter length in turn: rolled
    # back, or moved forward over K/V the buffers still hold (timing does not depend on their values).
    longest = max(contexts)
    caches, blocks = {}, {}
    for context in contexts:
        generator = torch.Generator().manual_seed(context)
        blocks[context] = {n: torch.randint(4, any_target.vocab_size, (n,), generator=generator).to(device)
                           for n in BLOCKS}
    for name, (target, threads) in targets.items():
        torch.set_num_threads(threads)
        for context in ([longest] if target.captured is not None else contexts):
            generator = torch.Generator().manual_seed(context)
            ids = torch.randint(4, any_target.vocab_size, (context,), generator=generator).to(device)
            cache = caches[context, name] = target.new_cache()
            cache.reserve(context + max(BLOCKS) + 1)
            target.forward(ids, cache, last_only=True)

    def cache_at(context: int, name: str):
        shared = caches.get((longest, name)) if targets[name][0].captured is not None else None
        if shared is None:
            return caches[context, name]
        length = shared.get_seq_length()
        if length > context:
            shared.crop_to(context)
        for layer in shared.layers if length < context else ():
            layer.advance(context - length)
        return shared

    def timed(context: int, name: str, n: int) -> float:
        (target, threads), cache = targets[name], cache_at(context, name)
        torch.set_num_threads(threads)  # untimed
        start = clock.now()
        target.forward(blocks[context][n], cache)
        elapsed = clock.now() - start
        cache.crop_to(context)
        return elapsed

    for context in contexts:  # warm up every shape
        for name in targets:
            for n in BLOCKS:
                timed(context, name, n)
                timed(context, name, n)
    times = {c: {name: {n: [] for n in BLOCKS} for name in targets} for c in contexts}
    bandwidth = {t: [] for t in thread_counts}
    rate = {t: [] for t in thread_counts}
    for _ in range(repeats):
        for threads in thread_counts:
            torch.set_num_threads(threads)
            bandwidth[threads].append(copy_bandwidth(device, repeats=3))
            rate[threads].append(gemm_rate(device, any_target.dtype))
        for context in contexts:
            for name in targets:
                for n in BLOCKS:
                    times[context][name][n].append(timed(context, name, n))
    medians = {c: {name: {n: statistics.median(v) for n, v in per.items()} for name, per in by_name.items()}
               for c, by_name in times.items()}
    return (medians, {t: statistics.median(v) for t, v in bandwidth.items()},
            {t: statistics.median(v) for t, v in rate.items()})


def load(args, kv_cache: str = "static", compile: bool = False, weight_layout: str = "auto",
         cuda_graphs: str = "off", captured_attention: str = "masked-sdpa") -> TargetModel:
    """The default target or a path as `evalsuite run` loads it; or a random Qwen3-shaped one (draft_cost.py's)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from draft_cost import RANDOM_TARGETS, random_target

    if args.target in RANDOM_TARGETS:
        dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
        shape = "tiny" if args.tiny else RANDOM_TARGETS[args.target]
        target = random_target(shape, args.target, args.device, dtype, kv_cache, compile, weight_layout, cuda_graphs)
    else:
        target = TargetModel.load(args.target, args.device, kv_cache=kv_cache, compile=compile,
                                  weight_layout=weight_layout, cuda_graphs=cuda_graphs)
    target.prepare_blocks(max(BLOCKS))  # as the engine does before a run with --k 7
    if target.cuda_graphs == "on":
        target.set_captured_attention(captured_attention)  # before the graphs are recorded
    target.prepare_layers([()])  # CUDA graphs: every block size and span captured before timing
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="default")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--contexts", default="512,2048,4096,8000")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--layouts", default="auto",
                        help="comma-separated engines to time side by side: a --weight-layout each (auto, fused, "
                             "column-major+onednn, ...), optionally +dynamic for transformers' DynamicCache, "
                             "+graphs for the fused decoder's CUDA-graph replays (--device cuda; +graphs+flash / "
                             "+graphs+split / +graphs+flash+split: their attention by flash attention over the live keys / by the split-K "
                             "Triton kernel / flash for decodes and split-K for verify blocks), +compile for its one-token decodes through torch.compile (--compile) "
                             "or +sdpa for the fused decoder with SDPA for verify blocks too (the CPU default attends "
                             "by GEMMs)")
    parser.add_argument("--threads", default=None,
                        help="comma-separated thread counts, each timed as its own variant (default: torch's)")
    parser.add_argument("--compile", action="store_true", help="also time the HF decoder with --compile")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes of a random target (code-path check)")
    args = parser.parse_args()

    thread_counts = [int(t) for t in args.threads.split(",")] if args.threads else [torch.get_num_threads()]
    variants = {}
    block_attention = {}
    known = {"graphs", "dynamic", "sdpa", "compile", *CAPTURED_ATTENTION}
    for spec in args.layouts.split(","):
        layout, flags = parse_layout(spec)
        if not set(flags) <= known:
            raise SystemExit(f"--layouts {spec}: unknown suffix {sorted(set(flags) - known)} (known: {sorted(known)})")
        attention = [CAPTURED_ATTENTION[f] for f in CAPTURED_ATTENTION if f in flags]
        if attention and "graphs" not in flags:
            raise SystemExit(f"--layouts {spec}: +flash and +split are the captured path's attention (need +graphs)")
        variants[spec] = dict(weight_layout=layout, cuda_graphs="on" if "graphs" in flags else "off",
                              kv_cache="dynamic" if "dynamic" in flags else "static", compile="compile" in flags,
                              captured_attention="flash+split" if len(attention) == 2 else
                              attention[0] if attention else "masked-sdpa")
        block_attention[spec] = "sdpa" if "sdpa" in flags else None
    if len(thread_counts) > 1 and (args.compile or any(v.get("compile") for v in variants.values())):
        # inductor's C++ kernels fix their OpenMP thread count when they are compiled
        raise SystemExit("--threads with more than one count: a compiled variant keeps the thread count it was "
                         "compiled with; time compiled variants at one --threads value per run")
    if args.compile:
        # the HF decoder compiled, in the layout that is fastest for it on the device (column-major on a CPU)
        compiled_layout = "column-major" if args.device.startswith("cpu") else "row-major"
        variants[f"{compiled_layout}+compile"] = dict(weight_layout=compiled_layout, kv_cache="static", compile=True)
    loaded = {name: load(args, **options) for name, options in variants.items()}
    for name, target in loaded.items():
        if block_attention.get(name):
            if target.fused is None:
                raise SystemExit(f"--layouts {name}: +sdpa needs the fused decoder")
            target.fused.block_attention = block_attention[name]
    targets = {}
    for name, target in loaded.items():
        for threads in thread_counts:
            label = f"{target.weight_layout}{'+dynamic' if target.kv_cache == 'dynamic' else ''}" + \
                ("+graphs" if target.cuda_graphs == "on" else "") + ("+compile" if target.compile else "") + \
                (ATTENTION_SUFFIX.get(target.captured_attention, "") if target.cuda_graphs == "on" else "") + \
                ("+sdpa" if target.fused is not None and target.fused.block_attention == "sdpa"
                 and target.device.type == "cpu" else "") + \
                (f"/{threads}t" if len(thread_counts) > 1 or args.threads else "")
            targets[label] = (target, threads)
    contexts = [int(c) for c in args.contexts.split(",")]
    target = next(iter(loaded.values()))
    weights = weight_bytes(target)
    per_token = kv_bytes_per_token(target)
    results, bandwidths, rates = measure(targets, contexts, args.repeats, thread_counts)
    print(f"target: {target.name} on {target.device}, {args.repeats} repeats (medians; each repeat times every "
          f"context, engine and block size in turn); weights read per forward "
          f"{weights / 1e6:.0f} MB, KV {per_token / 1e3:.1f} kB/token, copy bandwidth " +
          ", ".join(f"{b / 1e9:.1f} GB/s at {t} thread{'s' if t > 1 else ''}" for t, b in bandwidths.items()) +
          " (the median of one sample per repeat); floor = (weights + KV) ÷ the copy bandwidth at the variant's "
          "thread count")
    width = max(len(name) for name in targets) + 2

    def memory_floor(tokens: int, threads: int) -> float:  # weights and a KV of `tokens` read once
        return (weights + per_token * tokens) / bandwidths[threads]

    print(f"{'engine':{width}s}context  decode ms  verify-2 ms (÷dec)  verify-4 ms (÷dec)  verify-8 ms (÷dec)  "
          "floor ms  decode ÷ floor", flush=True)
    for context in contexts:
        for name, t in results[context].items():
            floor = memory_floor(context, targets[name][1])
            cells = "  ".join(f"{1e3 * t[n]:11.1f} ({t[n] / t[1]:.2f})" for n in BLOCKS[1:])
            print(f"{name:{width}s}{context:7d}  {1e3 * t[1]:9.1f}  {cells}  {1e3 * floor:8.1f}  "
                  f"{t[1] / floor:14.2f}", flush=True)
    # The roofline: no forward can beat the time to read its bytes nor the time to do its operations at the rate a
    # large product reaches here, so max(memory floor, compute floor) bounds verify-8 from below, and
    # that bound ÷ the decode's memory floor is the best verify-8 ÷ decode this machine allows (issue #30's target
    # is 1.3). Attention's operations grow with the context times the block, so a block's bound rises with both.
    print(f"roofline of a verify of {BLOCKS[-1]} tokens: compute floor = operations (weights: 2 per element per row; "
          f"attention: QKᵀ and PV over the context) ÷ the rate of a 1536² product measured in the same run (" +
          ", ".join(f"{r / 1e9:.0f} GFLOP/s at {t} thread{'s' if t > 1 else ''}" for t, r in rates.items()) +
          "); bound = max(memory floor, compute floor); best ratio = bound ÷ a decode's memory floor")
    print(f"{'engine':{width}s}context  GFLOP  compute floor ms  bound ms  verify-8 ÷ bound  best verify-8 ÷ decode")
    n = BLOCKS[-1]
    for context in contexts:
        for name, t in results[context].items():
            threads = targets[name][1]
            decode_floor = memory_floor(context, threads)
            flops = forward_flops(target, weights, context, n)
            compute = flops / rates[threads]
            bound = max(memory_floor(context + n, threads), compute)
            print(f"{name:{width}s}{context:7d}  {flops / 1e9:5.1f}  {1e3 * compute:16.1f}  {1e3 * bound:8.1f}  "
                  f"{t[n] / bound:16.2f}  {bound / decode_floor:22.2f}", flush=True)
    for name in targets:
        short = results[contexts[0]][name][1]
        print(f"{name}: decode ÷ decode at {contexts[0]}: " +
              "  ".join(f"{c}: {results[c][name][1] / short:.2f}" for c in contexts))
    if len(thread_counts) > 1:
        print("decode time at the fewest threads ÷ at the most (≥ 1: more threads are faster):")
        for name in loaded:
            lo, hi = min(thread_counts), max(thread_counts)
            label = lambda t: next(k for k, (tg, th) in targets.items() if tg is loaded[name] and th == t)
            print(f"  {label(lo).rsplit('/', 1)[0]}: " + "  ".join(
                f"{c}: {results[c][label(lo)][1] / results[c][label(hi)][1]:.2f}" for c in contexts))


if __name__ == "__main__":
    main()
