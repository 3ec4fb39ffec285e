"""What one verify forward costs against a one-token decode on the default target, per weight layout, in one run.

Speculative decoding pays off only when (draft + verify of k+1 tokens) / τ < one decode step. On a CPU the
verify cost ratio, not the GPU's "k+1 tokens for the price of one", decides the best k. This prints, for block
sizes 1 … 9 at a fixed context length, the median target forward time, its ratio to the one-token forward and
the time of the lm_head product alone, for each target weight layout (`TargetModel.load(weight_layout=...)`:
row-major as loaded, column-major, and column-major with oneDNN for 2–16-row products, which `evalsuite run`
uses on CPU), then each layout's speed-up over row-major.
Threads: what torch uses (set OMP_NUM_THREADS).

Usage: python benchmarks/verify_cost.py [--target default] [--context 256] [--repeats 20] [--max-block 9]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from evalsuite.target.model import TargetModel
from evalsuite.timing import DeviceClock

LAYOUTS = ("row-major", "column-major", "column-major+onednn")


def measure(target: TargetModel, context_len: int, sizes: list[int], repeats: int) -> tuple[dict, dict]:
    """Median forward and lm_head seconds per block size; sizes interleaved so load drift hits all alike."""
    clock = DeviceClock(target.device)
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(0, target.vocab_size, (context_len,), generator=generator).to(target.device)
    cache = target.new_cache()
    target.forward(context, cache, last_only=True)
    head = target.lm_head
    blocks = {n: torch.randint(0, target.vocab_size, (n,), generator=generator).to(target.device) for n in sizes}
    rows = {n: torch.randn(n, target.hidden_size, generator=generator).to(target.device, target.dtype) for n in sizes}

    def timed_forward(block: torch.Tensor) -> float:
        start = clock.now()
        target.forward(block, cache)
        elapsed = clock.now() - start
        cache.crop_to(context_len)
        return elapsed

    @torch.inference_mode()
    def timed_head(x: torch.Tensor) -> float:
        start = clock.now()
        head(x)
        return clock.now() - start

    forward_s = {n: [] for n in sizes}
    head_s = {n: [] for n in sizes}
    for n in sizes:  # warm-up, untimed
        timed_forward(blocks[n])
        timed_head(rows[n])
    for _ in range(repeats):
        for n in sizes:
            forward_s[n].append(timed_forward(blocks[n]))
            head_s[n].append(timed_head(rows[n]))
    return ({n: statistics.median(v) for n, v in forward_s.items()},
            {n: statistics.median(v) for n, v in head_s.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="default")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--max-block", type=int, default=9)
    args = parser.parse_args()

    sizes = list(range(1, args.max_block + 1))
    results = {}
    for layout in LAYOUTS:
        target = TargetModel.load(args.target, args.device, weight_layout=layout)
        results[layout] = measure(target, args.context, sizes, args.repeats)
        name, device = target.name, target.device
        del target
    print(f"target: {name} on {device}, threads {torch.get_num_threads()}, context {args.context}, "
          f"{args.repeats} repeats (medians)")
    for layout in LAYOUTS:
        forward, head = results[layout]
        print(f"\nweight layout {layout}")
        print("block  forward ms  ÷ one-token  lm_head ms")
        for n in sizes:
            print(f"{n:5d}  {1e3 * forward[n]:10.2f}  {forward[n] / forward[1]:11.2f}  {1e3 * head[n]:10.2f}")
    row = results["row-major"][0]
    for layout in LAYOUTS[1:]:
        other = results[layout][0]
        print(f"\nforward time, row-major ÷ {layout}: " + "  ".join(f"{n}: {row[n] / other[n]:.2f}" for n in sizes))


if __name__ == "__main__":
    main()
