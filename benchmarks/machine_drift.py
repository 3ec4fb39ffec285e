"""How this machine's speed drifts while nothing else runs, and what the drift does to a verify ÷ decode ratio.

Every speedup the harness reports is paired (the method and `ar` on the same turn, in one process, close in time),
because a VM's speed moves between runs. This shows by how much, and why pairing alone does not make two runs
agree: in one process, for `--rounds` rounds spread over about a minute, it times a burst of one-token decodes and
a burst of 8-token verifies at one context, interleaved, and samples the copy bandwidth between them. A decode
reads the weights and the KV once and is memory-bound; an 8-token verify does 8× the arithmetic on the same bytes.
Where the host's memory bandwidth swings (another tenant of the host, invisible from inside the VM: the harness's
contention meter sees only this VM's processes), decodes slow down more than verifies, so the verify ÷ decode
ratio, and with it the break-even τ of every method, moves with the machine's state.

Printed: one line per round (decode ms, verify ms, their ratio, copy GB/s), then the spread of each over the rounds
(min, median, max) and the rank correlation of the round's ratio with its bandwidth.

Usage: python benchmarks/machine_drift.py [--target default] [--context 512] [--rounds 12] [--threads 2]
       [--tiny] (a random tiny target: the code path, for the test suite)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from context_cost import copy_bandwidth, load  # noqa: E402

from evalsuite.timing import DeviceClock  # noqa: E402


def spearman(xs: list[float], ys: list[float]) -> float:
    """Rank correlation of two equal-length lists (pandas', average ranks for ties)."""
    return float(pd.Series(xs).corr(pd.Series(ys), method="spearman"))


def measure(target, context: int, rounds: int, burst: int, pause_s: float, bandwidth_mb: int) -> list[dict]:
    """Per round: the median one-token decode and 8-token verify of a burst each (seconds), and the copy
    bandwidth (bytes/s) sampled between them."""
    device = target.device
    clock = DeviceClock(device)
    generator = torch.Generator().manual_seed(context)
    ids = torch.randint(4, target.vocab_size, (context,), generator=generator).to(device)
    cache = target.new_cache()
    cache.reserve(context + 9)
    target.forward(ids, cache, last_only=True)
    blocks = {n: torch.randint(4, target.vocab_size, (n,), generator=generator).to(device) for n in (1, 8)}

    def timed(n: int) -> float:
        start = clock.now()
        target.forward(blocks[n], cache)
        elapsed = clock.now() - start
        cache.crop_to(context)
        return elapsed

    for n in (1, 8, 1, 8):  # warm up both shapes, twice each
        timed(n)
    rows = []
    for _ in range(rounds):
        decode = statistics.median(timed(1) for _ in range(burst))
        bandwidth = copy_bandwidth(device, megabytes=bandwidth_mb, repeats=3)
        verify = statistics.median(timed(8) for _ in range(burst))
        rows.append(dict(decode=decode, verify=verify, bandwidth=bandwidth))
        time.sleep(pause_s)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="default")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--burst", type=int, default=15, help="forwards per shape per round (the median is kept)")
    parser.add_argument("--pause", type=float, default=2.0, help="seconds of sleep between rounds")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--tiny", action="store_true", help="a random tiny target (the code path, for the tests)")
    args = parser.parse_args()
    if args.rounds < 2:
        raise SystemExit("--rounds: at least 2 (a spread needs two rounds)")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.tiny and args.target == "default":
        args.target = "qwen3-8b-random"
    target = load(args)
    rows = measure(target, args.context, args.rounds, args.burst, args.pause, 16 if args.tiny else 256)
    print(f"target: {target.name} on {target.device}, {torch.get_num_threads()} threads, context {args.context}, "
          f"{args.rounds} rounds of {args.burst} decodes and {args.burst} 8-token verifies each (medians), "
          f"the copy bandwidth sampled between them, {args.pause:g} s apart")
    print("round  decode ms  verify-8 ms  verify-8 ÷ decode  copy GB/s")
    for i, row in enumerate(rows, 1):
        print(f"{i:5d}  {1e3 * row['decode']:9.2f}  {1e3 * row['verify']:11.2f}  "
              f"{row['verify'] / row['decode']:17.2f}  {row['bandwidth'] / 1e9:9.1f}")
    series = {"decode ms": [1e3 * r["decode"] for r in rows], "verify-8 ms": [1e3 * r["verify"] for r in rows],
              "verify-8 ÷ decode": [r["verify"] / r["decode"] for r in rows],
              "copy GB/s": [r["bandwidth"] / 1e9 for r in rows]}
    print("spread over the rounds: min / median / max (max ÷ min)")
    for name, values in series.items():
        lo, mid, hi = min(values), statistics.median(values), max(values)
        print(f"  {name:18s} {lo:7.2f} / {mid:7.2f} / {hi:7.2f}  (×{hi / lo:.2f})")
    print(f"rank correlation over the rounds: verify-8 ÷ decode with copy bandwidth "
          f"{spearman(series['verify-8 ÷ decode'], series['copy GB/s']):+.2f}; decode ms with copy bandwidth "
          f"{spearman(series['decode ms'], series['copy GB/s']):+.2f}")


if __name__ == "__main__":
    main()
