"""Wall clock of `evalsuite run --workers 2 --threads-per-worker 1` against `--workers 1` with 2 threads.

Both runs replay the same GSM8K samples on the same target with the same methods, each in a fresh process
(so both pay their own start-up: model loading, and for Ray the cluster and two worker processes). Prints
each run's wall clock, the ratio single / Ray (> 1: Ray is faster), and, from the records, the summed
per-token decode time of each run: on one CPU node the two Ray workers share the cores, so their per-token
times grow — which is why such runs are flagged `shared_cpu` and their speedups are not comparable.
It also checks that both runs produced the same output ids (T=0).

Run it on a quiet machine: other load distorts both sides differently.

Usage: python benchmarks/ray_scaleout.py [--limit 20] [--max-new-tokens 128] [--method ngram,ar]
                                         [--target default] [--keep DIR] [--save FILE.md]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evalsuite.store.run_store import read_run


def run(label: str, out: Path, args: argparse.Namespace, extra: list[str], threads: int) -> float:
    command = [sys.executable, "-m", "evalsuite.cli", "run", "--task", "gsm8k", "--method", args.method,
               "--target", args.target, "--limit", str(args.limit), "--max-new-tokens", str(args.max_new_tokens),
               "--out", str(out), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{label} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return seconds


def per_token_ms(out: Path) -> float:
    turns = read_run(out).turns
    turns = turns[turns.new_tokens > 0]
    return 1000 * turns.decode_s.sum() / turns.new_tokens.sum()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--method", default="ngram,ar")
    parser.add_argument("--target", default="default")
    parser.add_argument("--keep", type=Path, help="Keep both run directories here (default: a temp dir).")
    parser.add_argument("--save", type=Path, help="Also write the table to this Markdown file.")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        single, ray = root / "workers1-threads2", root / "workers2-threads1"
        for path in (single, ray):
            if path.exists():
                sys.exit(f"{path} exists; choose another --keep")
        t_single = run("--workers 1", single, args, [], threads=2)
        t_ray = run("--workers 2", ray, args, ["--workers", "2", "--threads-per-worker", "1"], threads=1)
        a, b = read_run(single).turns, read_run(ray).turns
        key = ["method", "sample_id", "turn"]
        merged = a.merge(b, on=key, suffixes=("_1", "_2"))
        same = len(merged) == len(a) == len(b) and all(
            list(x) == list(y) for x, y in zip(merged.output_ids_1, merged.output_ids_2))
        lines = [
            f"GSM8K, {args.limit} samples, methods {args.method}, max {args.max_new_tokens} new tokens, target "
            f"{args.target}, {os.cpu_count()} CPUs",
            "",
            "| run | wall s | decode ms per token (pooled over all turns of all workers) |",
            "|---|---|---|",
            f"| `--workers 1`, 2 torch threads | {t_single:.1f} | {per_token_ms(single):.2f} |",
            f"| `--workers 2 --threads-per-worker 1` | {t_ray:.1f} | {per_token_ms(ray):.2f} |",
            "",
            f"wall-clock ratio (workers 1 / workers 2): {t_single / t_ray:.2f}x",
            f"same output ids in both runs: {'yes' if same else 'NO'}",
        ]
    text = "\n".join(lines)
    print(text)
    if args.save:
        args.save.write_text(text + "\n")


if __name__ == "__main__":
    main()
