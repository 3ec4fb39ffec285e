"""The end-of-run summary: one row per method (`ar` first, always: it runs for the pairing), a pure function of the
stored tables; and the contention warning.

τ and speedup come from `evalsuite.metrics`, as in `evalsuite report`, `compare` and the runner."""

from __future__ import annotations

from pathlib import Path

from evalsuite import metrics
from evalsuite.conventions import BASELINE, CONTENDED_CORES
from evalsuite.report import stats
from evalsuite.store.run_store import read_run


def summary_rows(run_dir: str | Path) -> list[dict]:
    tables = read_run(run_dir)
    steps, turns = tables.steps, tables.turns
    temperature = float((tables.config or {}).get("temperature", 0.0))
    rows = []
    for method, group in turns.groupby("method", sort=False):
        decoded = metrics.decoded(group)
        method_steps = steps[steps.method == method]
        cost = stats.cost(method_steps)
        tokens = int(decoded.new_tokens.sum())
        decode_s = float(decoded.decode_s.sum())
        differs, compared = metrics.differs_from_ar(turns.assign(temperature=temperature), method)
        rows.append({
            "method": method,
            "samples": decoded.sample_id.nunique(),
            "turns": len(decoded),
            "skipped": len(group) - len(decoded),
            "tau": metrics.tau(method_steps),
            "tau_turn_mean": metrics.tau_turn_macro(method_steps),
            "tokens": tokens,
            "ms/token": 1e3 * decode_s / tokens if tokens else float("nan"),
            "tok/s": tokens / decode_s if decode_s else float("nan"),
            "draft ms/step": cost.draft_ms,
            "verify ms/step": cost.verify_ms,
            "speedup": metrics.speedup(group),
            "same as ar": "-" if not compared else f"{compared - int(differs)}/{compared}",
        })
    return sorted(rows, key=lambda r: r["method"] != BASELINE)  # the baseline first


def contention_line(run_dir: str | Path) -> str:
    """One line when decodes ran while other processes competed for the CPU, else ''."""
    turns = read_run(run_dir).turns
    decoded = metrics.decoded(turns)
    if decoded.empty or not decoded.contended.astype(bool).any():
        return ""
    busy = decoded.cpu_others.astype(float)
    return (f"warning: {int(decoded.contended.sum())} of {len(decoded)} decodes ran while other processes kept "
            f"≥ {CONTENDED_CORES:g} cores busy (up to {busy.max():.1f}): their timings and speedups are not an idle "
            "machine's; τ is unaffected. Rerun them on a quiet machine to compare speed.")
