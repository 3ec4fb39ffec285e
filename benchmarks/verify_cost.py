"""What one verify forward costs against a one-token decode on the default target, measured in one run.

Speculative decoding pays off only when (draft + verify of k+1 tokens) / τ < one decode step. On a CPU the
verify cost ratio, not the GPU's "k+1 tokens for the price of one", decides the best k. This prints, for block
sizes 1 … 9 at a fixed context length, the median target forward time and its ratio to the one-token forward,
plus the share spent in the lm_head product, for the thread count torch uses (set OMP_NUM_THREADS).

Usage: python benchmarks/verify_cost.py [--target default] [--context 256] [--repeats 20] [--max-block 9]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from evalsuite.target import TargetModel
from evalsuite.timing import DeviceClock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="default")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--max-block", type=int, default=9)
    args = parser.parse_args()

    target = TargetModel.load(args.target, args.device)
    clock = DeviceClock(target.device)
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(0, target.vocab_size, (args.context,), generator=generator).to(target.device)
    cache = target.new_cache()
    target.forward(context, cache, last_only=True)
    head = target.lm_head

    def timed_forward(block: torch.Tensor) -> float:
        start = clock.now()
        target.forward(block, cache)
        elapsed = clock.now() - start
        target.crop(cache, args.context)
        return elapsed

    def timed_head(rows: torch.Tensor) -> float:
        with torch.inference_mode():
            start = clock.now()
            head(rows)
            return clock.now() - start

    sizes = list(range(1, args.max_block + 1))
    blocks = {n: torch.randint(0, target.vocab_size, (n,), generator=generator).to(target.device) for n in sizes}
    rows = {n: torch.randn(n, target.hidden_size, generator=generator).to(target.device, target.dtype) for n in sizes}
    forward_s = {n: [] for n in sizes}
    head_s = {n: [] for n in sizes}
    for n in sizes:  # warm-up, untimed
        timed_forward(blocks[n])
        timed_head(rows[n])
    for _ in range(args.repeats):  # interleaved so that a drift in machine load hits every size alike
        for n in sizes:
            forward_s[n].append(timed_forward(blocks[n]))
            head_s[n].append(timed_head(rows[n]))

    base = statistics.median(forward_s[1])
    print(f"target: {target.name} on {target.device}, threads {torch.get_num_threads()}, context {args.context}, "
          f"{args.repeats} repeats (medians)")
    print("block  forward ms  ÷ one-token  lm_head ms  lm_head share")
    for n in sizes:
        f, h = statistics.median(forward_s[n]), statistics.median(head_s[n])
        print(f"{n:5d}  {1e3 * f:10.2f}  {f / base:11.2f}  {1e3 * h:10.2f}  {100 * h / f:12.1f} %")


if __name__ == "__main__":
    main()
