"""SIGKILL `evalsuite run` at random points, resume it each time, and count what went wrong.

A 2-method (ngram + the recorded ar baseline), 3-sample, 2-turn run (MT-Bench) is first run uninterrupted as the
reference. Then, in rounds on fresh directories: start the run (later `--resume`), SIGKILL it at a random point,
start `--resume`, kill again… until a process finishes on its own; compare the round's records with the
reference. Kill points: mostly uniform over the decoding phase (from run.json being written to the end, as the
reference took), some uniform over the start-up. Each kill notes how many turns were stored then and whether a
steps part was left without its turns part (an orphan, which readers must ignore and resume must clean).

Counts, which must all be 0: rows lost (reference rows missing), rows duplicated, rows extra, rows whose T=0
values (output ids, context lengths, drafted/accepted/emitted per step, stop reasons) differ from the
reference, and leftovers (orphaned parts or temporary files) after the final resume.

Usage:
    python benchmarks/kill_resume.py                      # 20 kills on a tiny random target (built here)
    python benchmarks/kill_resume.py --kills 5 --target DIR --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

TURN_KEY = ["method", "sample_id", "turn"]
STEP_KEY = TURN_KEY + ["step"]
# T=0 values that must not depend on interruptions (timings and prefill sharing may).
TURN_VALUES = ["context_len", "new_tokens", "num_steps", "tau", "stop_reason", "skip_reason", "dropped_tokens",
               "output_ids"]
STEP_VALUES = ["context_len", "num_drafted", "num_accepted", "accept_flags", "emitted"]


@dataclass
class Outcome:
    kills: int = 0
    rounds: int = 0
    processes: int = 0
    kills_in_startup: int = 0
    kills_with_orphan: int = 0
    pairs_at_kill: list[int] = field(default_factory=list)  # stored (method, sample, turn) rows when each kill landed
    rows_lost: int = 0
    rows_duplicated: int = 0
    rows_extra: int = 0
    rows_differing: int = 0
    leftovers: int = 0
    reference_rows: int = 0

    @property
    def ok(self) -> bool:
        return not (self.rows_lost or self.rows_duplicated or self.rows_extra or self.rows_differing or self.leftovers)

    def describe(self) -> str:
        return (f"{self.kills} kills in {self.rounds} rounds ({self.processes} processes; {self.kills_in_startup} "
                f"during start-up, {self.kills_with_orphan} with an orphaned steps part; stored turns at the "
                f"kills: {sorted(self.pairs_at_kill)}): {self.rows_lost} rows lost, {self.rows_duplicated} "
                f"duplicated, {self.rows_extra} extra, {self.rows_differing} differing from the uninterrupted run "
                f"(of {self.reference_rows} reference rows), {self.leftovers} leftovers")


def run_command(target: str, out: Path, args: argparse.Namespace, resume: bool) -> list[str]:
    command = [sys.executable, "-m", "evalsuite.cli", "run", "--method", args.methods, "--task", args.task,
               "--target", target, "--limit", str(args.limit), "--max-new-tokens", str(args.max_new_tokens),
               "--out", str(out)]
    return command + (["--resume"] if resume else [])


def child_env() -> dict:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO) + (os.pathsep + path if path else "")}


def wait_for_config(run_json: Path, since_ns: int, proc: subprocess.Popen, timeout: float) -> bool:
    """Until run.json is (re)written after `since_ns` (the process finished loading); False if it exited first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if run_json.stat().st_mtime_ns >= since_ns:
                return True
        except FileNotFoundError:
            pass
        if proc.poll() is not None:
            return False
        time.sleep(0.005)
    raise TimeoutError(f"{run_json} not written within {timeout} s")


def reference_run(target: str, out: Path, args) -> tuple[float, float]:
    """The uninterrupted run; returns (start-up seconds, decoding seconds)."""
    start_ns = time.time_ns()
    t0 = time.monotonic()
    proc = subprocess.Popen(run_command(target, out, args, resume=False), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=child_env(), text=True)
    wait_for_config(out / "run.json", start_ns, proc, args.timeout)
    loaded = time.monotonic()
    _, stderr = proc.communicate(timeout=args.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"the reference run failed:\n{stderr}")
    return loaded - t0, time.monotonic() - loaded


def compare(got_dir: Path, ref_dir: Path) -> dict:
    import pandas as pd

    from evalsuite.store.run_store import RunStore, read_run

    counts = {"lost": 0, "duplicated": 0, "extra": 0, "differing": 0, "leftovers": 0}
    got_run, ref_run = read_run(got_dir), read_run(ref_dir)
    for table, key, values in (("turns", TURN_KEY, TURN_VALUES), ("steps", STEP_KEY, STEP_VALUES)):
        got, want = getattr(got_run, table), getattr(ref_run, table)
        counts["duplicated"] += int(got.duplicated(key).sum())
        got = got.drop_duplicates(key)
        merged = want.merge(got, on=key, how="outer", suffixes=("_ref", ""), indicator=True)
        counts["lost"] += int((merged._merge == "left_only").sum())
        counts["extra"] += int((merged._merge == "right_only").sum())
        both = merged[merged._merge == "both"]
        differs = [any(_value(row[c]) != _value(row[c + "_ref"]) for c in values) for _, row in both.iterrows()]
        counts["differing"] += sum(differs)
    store = RunStore(got_dir)
    counts["leftovers"] += len(store.leftovers())
    # pandas reading the part directories directly sees exactly the stored turns
    counts["extra"] += len(pd.read_parquet(got_dir / "steps.parquet")) - len(got_run.steps)
    return counts


def _value(value):
    if isinstance(value, float) and value != value:
        return "nan"
    return list(value) if hasattr(value, "__len__") and not isinstance(value, str) else value


def orphan_present(out: Path) -> bool:
    from evalsuite.store.run_store import RunStore

    return any(p.name.endswith(".parquet") for p in RunStore(out).leftovers())


def kill_resume(target: str, work: Path, args: argparse.Namespace, say=print) -> Outcome:
    rng = random.Random(args.seed)
    reference = work / "reference"
    startup_s, decode_s = reference_run(target, reference, args)
    say(f"reference: start-up {startup_s:.1f} s, decoding {decode_s:.1f} s")
    outcome = Outcome(reference_rows=_rows(reference))
    from evalsuite.store.run_store import read_run

    while outcome.kills < args.kills:
        outcome.rounds += 1
        out = work / f"round-{outcome.rounds}"
        for attempt in range(args.kills * 4):
            resume = (out / "run.json").exists()
            start_ns = time.time_ns()
            proc = subprocess.Popen(run_command(target, out, args, resume), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, env=child_env(), text=True)
            outcome.processes += 1
            killed = False
            if outcome.kills < args.kills:
                in_startup = rng.random() < args.startup_share
                if in_startup:
                    time.sleep(rng.uniform(0, startup_s))
                elif wait_for_config(out / "run.json", start_ns, proc, args.timeout):
                    time.sleep(rng.uniform(0, decode_s))
                if proc.poll() is None:
                    pairs = len(read_run(out).turns)
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    killed = True
                    outcome.kills += 1
                    outcome.kills_in_startup += in_startup
                    outcome.pairs_at_kill.append(pairs)
                    outcome.kills_with_orphan += orphan_present(out)
            if not killed:
                _, stderr = proc.communicate(timeout=args.timeout)
                if proc.returncode != 0:
                    raise RuntimeError(f"round {outcome.rounds}: the run failed:\n{stderr}")
                break
        counts = compare(out, reference)
        outcome.rows_lost += counts["lost"]
        outcome.rows_duplicated += counts["duplicated"]
        outcome.rows_extra += counts["extra"]
        outcome.rows_differing += counts["differing"]
        outcome.leftovers += counts["leftovers"]
        say(f"round {outcome.rounds}: {outcome.kills} kills so far; {counts}")
    return outcome


def _rows(run_dir: Path) -> int:
    from evalsuite.store.run_store import read_run

    tables = read_run(run_dir)
    return len(tables.turns) + len(tables.steps)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", default=None, help="model dir (default: a tiny random Llama built here)")
    parser.add_argument("--methods", default="ngram,ar")
    parser.add_argument("--task", default="mt-bench")
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--startup-share", type=float, default=0.2, help="share of kills aimed at the start-up")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per process")
    parser.add_argument("--work", type=Path, default=None, help="keep the run directories here")
    parser.add_argument("--json", action="store_true", help="print the outcome as JSON too")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Outcome:
    args = parse(argv)
    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory(prefix="kill-resume-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        target = args.target
        if target is None:
            from evalsuite.testing import build_tiny_target

            target = str(build_tiny_target(work / "tiny-target", "llama"))
        outcome = kill_resume(target, work, args, say=lambda text: print(text, file=sys.stderr))
    print(outcome.describe())
    if args.json:
        print(json.dumps(asdict(outcome)))
    return outcome


if __name__ == "__main__":
    sys.exit(0 if main().ok else 1)
