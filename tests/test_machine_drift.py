"""benchmarks/machine_drift.py: its rank correlation against pandas', its rounds on a tiny random target, and its
one-line refusal of a spread over fewer than two rounds."""

from __future__ import annotations

import importlib
import random
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _module():
    sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module("machine_drift")


def test_rank_correlation_matches_pandas_with_and_without_ties():
    drift = _module()
    rng = random.Random(0)
    for n in (3, 7, 25):
        xs = [rng.random() for _ in range(n)]
        ys = [x + rng.gauss(0, 0.3) for x in xs]
        ties = [round(3 * x) for x in xs]  # many equal values
        for a, b in ((xs, ys), (ties, ys), (xs, ties)):
            expected = pd.Series(a).corr(pd.Series(b), method="spearman")
            assert drift.spearman(a, b) == pytest.approx(expected, abs=1e-12)
    assert drift.spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert drift.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


def test_rounds_on_a_tiny_target_leave_the_cache_at_the_context():
    drift = _module()
    draft_cost = importlib.import_module("draft_cost")
    target = draft_cost.random_target("tiny", "tiny", "cpu", torch.float32, weight_layout="row-major")
    rows = drift.measure(target, context=24, rounds=3, burst=2, pause_s=0.0, bandwidth_mb=1)
    assert len(rows) == 3
    for row in rows:
        assert set(row) == {"decode", "verify", "bandwidth"}
        assert row["decode"] > 0 and row["verify"] > 0 and row["bandwidth"] > 0


def _run(*args):
    return subprocess.run([sys.executable, str(BENCHMARKS / "machine_drift.py"), *args], capture_output=True,
                          text=True, timeout=300)


def test_the_script_prints_every_round_and_the_spread():
    done = _run("--tiny", "--context", "16", "--rounds", "3", "--burst", "2", "--pause", "0")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    table = [line for line in lines if line.strip()[:1].isdigit()]
    assert len(table) == 3
    assert any(line.startswith("spread over the rounds") for line in lines)
    assert any("verify-8 ÷ decode with copy bandwidth" in line for line in lines)


def test_one_round_is_refused_in_one_line():
    done = _run("--tiny", "--rounds", "1")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == ["--rounds: at least 2 (a spread needs two rounds)"]
