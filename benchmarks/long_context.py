"""One SWE-Bench agent trajectory through the old and the new target KV cache: cost against context, τ, speedup.

Runs `evalsuite run --method ar,ngram,dlite --task swebench` on a folder holding one trajectory (default
django__django-10999, 10 turns, 32 new tokens), once with `--kv-cache dynamic` (transformers' DynamicCache,
the engine before) and once with `--kv-cache static` (evalsuite.target.kv_cache), one run after the other, then
prints from the records, per engine:
- per context band: the median `ar` one-token decode (the verify forward of a step that drafted nothing),
  the median verify of steps that sent k drafts (k+1 tokens), and their ratio;
- per method: τ (pooled over verify steps, bonus included) and the pooled speedup over `ar`
  ((Σ ar decode s / Σ ar tokens) ÷ (Σ decode s / Σ tokens), over the turns both decoded);
- losslessness: turns whose output differs from `ar` of the same engine, and `ar` (new) against `ar` (old).

Usage: python benchmarks/long_context.py [--trajectory ID] [--max-turns 10] [--max-new-tokens 32] [--k 7]
       [--methods ar,ngram,dlite] [--out DIR] [--engines dynamic,static]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from evalsuite.store.run_store import read_run

ROOT = Path(__file__).resolve().parents[1]
TRAJECTORIES = ROOT / "tasks" / "swebench" / "trajectories" / "mini-swe-agent_gemini-3-pro_verified" / "trajs"
BANDS = [(0, 2000, "< 2k"), (2000, 4000, "2k-4k"), (4000, 10**9, ">= 4k")]


def run(engine: str, data: Path, out: Path, args) -> None:
    cmd = [sys.executable, "-m", "evalsuite.cli", "run", "--method", args.methods, "--task", "swebench",
           "--data-path", str(data), "--max-turns", str(args.max_turns), "--max-new-tokens", str(args.max_new_tokens),
           "--k", str(args.k), "--kv-cache", engine, "--out", str(out)]
    print("$ evalsuite run " + " ".join(cmd[4:]).replace(str(data), "<one-trajectory folder>")
          .replace(str(out), f"<out>/{out.name}"), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def pooled_speedup(turns: pd.DataFrame, method: str) -> float:
    rows = turns[(turns.method == method) & (turns.new_tokens > 0) & (turns.ar_new_tokens > 0)]
    if rows.empty:
        return float("nan")
    return (rows.ar_decode_s.sum() / rows.ar_new_tokens.sum()) / (rows.decode_s.sum() / rows.new_tokens.sum())


def summarise(engine: str, out: Path, k: int) -> pd.DataFrame:
    tables = read_run(out)
    steps, turns = tables.steps, tables.turns
    print(f"\n== --kv-cache {engine}")
    print("context   ar decode ms (n)   verify-{} ms (n)   verify ÷ decode".format(k + 1))
    for lo, hi, label in BANDS:
        band = steps[(steps.context_len >= lo) & (steps.context_len < hi)]
        decode = band[(band.method == "ar")].verify_s
        verify = band[(band.method != "ar") & (band.num_drafted == k)].verify_s
        if decode.empty or verify.empty:
            continue
        print(f"{label:8s}  {1e3 * decode.median():8.1f} ({len(decode):4d})  {1e3 * verify.median():10.1f} "
              f"({len(verify):4d})  {verify.median() / decode.median():12.2f}")
    ar = turns[turns.method == "ar"].set_index(["sample_id", "turn"])
    print("method   turns  tau (pooled)  speedup (pooled)  differs from ar")
    for method, group in turns.groupby("method", sort=False):
        done = group[group.new_tokens > 0]
        method_steps = steps[steps.method == method]
        tau = (method_steps.num_accepted + 1).sum() / max(len(method_steps), 1)
        differs = sum(list(row.output_ids) != list(ar.loc[(row.sample_id, row.turn)].output_ids)
                      for row in done.itertuples() if (row.sample_id, row.turn) in ar.index)
        print(f"{method:7s}  {len(done):5d}  {tau:12.2f}  {pooled_speedup(turns, method):16.2f}  {differs:15d}")
    return turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trajectory", default="django__django-10999")
    parser.add_argument("--methods", default="ar,ngram,dlite")
    parser.add_argument("--max-turns", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--k", type=int, default=7)
    parser.add_argument("--engines", default="dynamic,static")
    parser.add_argument("--out", default=None, help="keep the runs here (default: a temporary directory)")
    args = parser.parse_args()

    work = Path(args.out or tempfile.mkdtemp(prefix="long-context-"))
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    shutil.copy(TRAJECTORIES / args.trajectory / f"{args.trajectory}.traj.json", data)
    turns = {}
    for engine in args.engines.split(","):
        out = work / f"run-{engine}"
        if out.exists():
            shutil.rmtree(out)
        run(engine, data, out, args)
        turns[engine] = summarise(engine, out, args.k)
    if {"dynamic", "static"} <= set(turns):
        old = turns["dynamic"][turns["dynamic"].method == "ar"].set_index(["sample_id", "turn"]).output_ids
        new = turns["static"][turns["static"].method == "ar"].set_index(["sample_id", "turn"]).output_ids
        same = sum(list(old[key]) == list(new[key]) for key in new.index if key in old.index)
        print(f"\nar on the static cache equals ar on the dynamic cache on {same} of {len(new)} turns")
        for key in new.index:
            if key in old.index and list(old[key]) != list(new[key]):
                a, b = list(old[key]), list(new[key])
                first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                print(f"  turn {key[1]}: first difference at output token {first}")


if __name__ == "__main__":
    main()
