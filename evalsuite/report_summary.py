"""The end-of-run summary: one row per method, computed from the stored tables (a pure function of them).

Every measure comes from `evalsuite.report.stats`, so the summary and `evalsuite report` define τ and speedup
in one place."""

from __future__ import annotations

from pathlib import Path

from evalsuite.records import load_steps, load_turns
from evalsuite.report import stats


def summary_rows(run_dir: str | Path) -> list[dict]:
    steps = load_steps(run_dir)
    turns = load_turns(run_dir)
    rows = []
    for method, group in turns.groupby("method", sort=False):
        decoded = stats.decoded(group)
        method_steps = steps[steps.method == method]
        cost = stats.cost(method_steps)
        tokens = int(decoded.new_tokens.sum())
        decode_s = float(decoded.decode_s.sum())
        rows.append({
            "method": method,
            "samples": decoded.sample_id.nunique(),
            "turns": len(decoded),
            "skipped": len(group) - len(decoded),
            "tau": stats.tau(method_steps),
            "tau_turn_mean": stats.tau_turn_macro(method_steps),
            "tokens": tokens,
            "tok/s": tokens / decode_s if decode_s else float("nan"),
            "draft ms/step": cost.draft_ms,
            "verify ms/step": cost.verify_ms,
            "speedup": stats.speedup(group),
        })
    return rows
