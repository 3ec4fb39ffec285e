"""The end-of-run summary: one row per method (`ar` included), a pure function of the stored tables.

τ and speedup come from `evalsuite.metrics`, as in `evalsuite report`, `compare` and the runner."""

from __future__ import annotations

from pathlib import Path

from evalsuite import metrics
from evalsuite.report import stats
from evalsuite.store import read_run


def summary_rows(run_dir: str | Path) -> list[dict]:
    tables = read_run(run_dir)
    steps, turns = tables.steps, tables.turns
    rows = []
    for method, group in turns.groupby("method", sort=False):
        decoded = metrics.decoded(group)
        method_steps = steps[steps.method == method]
        cost = stats.cost(method_steps)
        tokens = int(decoded.new_tokens.sum())
        decode_s = float(decoded.decode_s.sum())
        rows.append({
            "method": method,
            "samples": decoded.sample_id.nunique(),
            "turns": len(decoded),
            "skipped": len(group) - len(decoded),
            "tau": metrics.tau(method_steps),
            "tau_turn_mean": metrics.tau_turn_macro(method_steps),
            "tokens": tokens,
            "tok/s": tokens / decode_s if decode_s else float("nan"),
            "draft ms/step": cost.draft_ms,
            "verify ms/step": cost.verify_ms,
            "speedup": metrics.speedup(group),
        })
    return rows
