"""How the target's decode and verify forwards grow with the context, for the old and the new KV cache, in one run.

The physical cost of a context is reading its KV once per forward, whether the block has 1 or 8 tokens; the
weights are read once too. So the floor of one forward is (weight bytes + KV bytes) ÷ memory bandwidth, and a
verify of a few tokens should cost little more than a one-token decode at any context. This prints, for each
context length, the median one-token decode time, the verify time of blocks of 2, 4 and 8 tokens, each ÷ the
decode, and the row's memory floor with the copy bandwidth measured in the same run — for each `--cache`:
`dynamic` (transformers' DynamicCache and SDPA: the engine before evalsuite.kv_cache) and `static`
(evalsuite.kv_cache: preallocated buffers, in-place writes, GQA-folded attention on views).

Timing: each shape is warmed up first; cache kinds and block sizes are interleaved so that load drift hits all
alike; the context is random token ids (attention cost does not depend on the values). Threads: what torch
uses (set OMP_NUM_THREADS).

Usage: python benchmarks/context_cost.py [--target default] [--contexts 512,2048,4096,8000] [--repeats 10]
       [--cache dynamic,static] [--compile]
On a GPU, a Qwen3-8B-shaped target with random bf16 weights (benchmarks/gpu_check.sh runs this):
       python benchmarks/context_cost.py --target qwen3-8b-random --device cuda --contexts 1024,8192,32768 --compile
       (--tiny: the same code path with tiny shapes, for a check on CPU)
"""

from __future__ import annotations

import argparse
import statistics

import sys
from pathlib import Path

import torch

from evalsuite.target import TargetModel
from evalsuite.timing import DeviceClock

BLOCKS = (1, 2, 4, 8)


def copy_bandwidth(device: torch.device, megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes per second moved by a large tensor copy (read + write counted), the median of `repeats`."""
    clock = DeviceClock(device)
    src = torch.ones(megabytes << 18, device=device)  # float32: 4 bytes each
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        start = clock.now()
        dst.copy_(src)
        times.append(clock.now() - start)
    return 2 * src.nbytes / statistics.median(times)


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
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    return 2 * target.num_layers * heads * head_dim * torch.finfo(target.dtype).bits // 8


def measure(targets: dict[str, TargetModel], context: int, repeats: int) -> dict[str, dict[int, float]]:
    """Median seconds per (cache kind, block size) after `context` tokens."""
    generator = torch.Generator().manual_seed(context)
    any_target = next(iter(targets.values()))
    device = any_target.device
    clock = DeviceClock(device)
    ids = torch.randint(4, any_target.vocab_size, (context,), generator=generator).to(device)
    blocks = {n: torch.randint(4, any_target.vocab_size, (n,), generator=generator).to(device) for n in BLOCKS}
    caches = {}
    for kind, target in targets.items():
        caches[kind] = target.new_cache()
        caches[kind].reserve(context + max(BLOCKS) + 1)
        target.forward(ids, caches[kind], last_only=True)

    def timed(kind: str, n: int) -> float:
        target, cache = targets[kind], caches[kind]
        start = clock.now()
        target.forward(blocks[n], cache)
        elapsed = clock.now() - start
        cache.crop_to(context)
        return elapsed

    for kind in targets:  # warm up every shape
        for n in BLOCKS:
            timed(kind, n)
            timed(kind, n)
    times = {kind: {n: [] for n in BLOCKS} for kind in targets}
    for _ in range(repeats):
        for kind in targets:
            for n in BLOCKS:
                times[kind][n].append(timed(kind, n))
    return {kind: {n: statistics.median(v) for n, v in per.items()} for kind, per in times.items()}


def load(args, kv_cache: str, compile: bool = False) -> TargetModel:
    """The default target or a path as `evalsuite run` loads it; or a random Qwen3-shaped one (draft_cost.py's)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from draft_cost import RANDOM_TARGETS, random_target

    if args.target in RANDOM_TARGETS:
        dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
        shape = "tiny" if args.tiny else RANDOM_TARGETS[args.target]
        return random_target(shape, args.target, args.device, dtype, kv_cache, compile)
    return TargetModel.load(args.target, args.device, kv_cache=kv_cache, compile=compile)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="default")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--contexts", default="512,2048,4096,8000")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--cache", default="dynamic,static")
    parser.add_argument("--compile", action="store_true", help="also time the static cache with --compile")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes of a random target (code-path check)")
    args = parser.parse_args()

    kinds = args.cache.split(",")
    variants = {kind: dict(kv_cache=kind) for kind in kinds}
    if args.compile:
        variants["static+compile"] = dict(kv_cache="static", compile=True)
    targets = {name: load(args, **options) for name, options in variants.items()}
    contexts = [int(c) for c in args.contexts.split(",")]
    target = targets[kinds[0]]
    bandwidth = copy_bandwidth(target.device)
    weights = weight_bytes(target)
    per_token = kv_bytes_per_token(target)
    print(f"target: {target.name} on {target.device} ({target.weight_layout}), threads {torch.get_num_threads()}, "
          f"{args.repeats} repeats (medians); weights read per forward {weights / 1e6:.0f} MB, KV "
          f"{per_token / 1e3:.1f} kB/token, copy bandwidth {bandwidth / 1e9:.1f} GB/s (measured now)")
    print("cache           context  decode ms  verify-2 ms (÷dec)  verify-4 ms (÷dec)  verify-8 ms (÷dec)  "
          "floor ms  decode ÷ floor", flush=True)
    results = {}
    for context in contexts:  # rows print as they are measured
        results[context] = measure(targets, context, args.repeats)
        floor = (weights + per_token * context) / bandwidth
        for kind, t in results[context].items():
            cells = "  ".join(f"{1e3 * t[n]:11.1f} ({t[n] / t[1]:.2f})" for n in BLOCKS[1:])
            print(f"{kind:14s}  {context:7d}  {1e3 * t[1]:9.1f}  {cells}  {1e3 * floor:8.1f}  {t[1] / floor:14.2f}",
                  flush=True)
    for kind in targets:
        short = results[contexts[0]][kind][1]
        print(f"{kind}: decode ÷ decode at {contexts[0]}: " +
              "  ".join(f"{c}: {results[c][kind][1] / short:.2f}" for c in contexts))
    if "dynamic" in targets and "static" in targets:
        print("static speed-up over dynamic (time ratio) per context, by block size:")
        for context in contexts:
            d, s = results[context]["dynamic"], results[context]["static"]
            print(f"{context:7d}  " + "  ".join(f"{n}: {d[n] / s[n]:.2f}" for n in BLOCKS))


if __name__ == "__main__":
    main()
