"""Per-position acceptance and draft lengths, per task and per context tercile.

The rates themselves are `metrics.per_position` and `metrics.draft_lengths` over the draft room the engine offered
(`metrics.draft_room`; conventions.POSITION): the marginal acceptance at j counts every verify step whose budget
left room for j drafts, so a variable-length drafter (ngram, suffix) that chose to draft fewer than j there counts
as not accepted at j, instead of looking flat. For variable-length drafters the telling numbers are the mean
drafted length per step and the acceptance per drafted token (DRAFT_LENGTH_CONVENTION).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd

from evalsuite import metrics
from evalsuite.conventions import BASELINE

DRAFT_LENGTH_CONVENTION = (
    "mean drafted = mean draft length per verify step, over the steps with room to draft (including those where "
    "the drafter proposed nothing); acceptance per drafted token = sum of accepted drafts / sum of drafted tokens; "
    "a method is fixed-K when it drafted its full room on at least 95 % of its steps over all tasks, else "
    "variable-length")
FIXED_SHARE = 0.95
TERCILE_CONVENTION = (
    "context terciles: per task, the decoded turns split at the 1/3 and 2/3 quantiles of the task's turn contexts "
    "(T1 shortest); a turn's steps fall in its turn's tercile, labelled by the smallest and largest turn context "
    "in it; a task with fewer than 3 distinct contexts has one part")


def run_limits(runs: Iterable) -> dict[str, dict]:
    """{run key: {"k", "max_new_tokens", "max_context"}} from `Results.runs` (for `metrics.draft_room`)."""
    return {run.key: {"k": run.config.get("k"), "max_new_tokens": run.config.get("max_new_tokens"),
                      "max_context": run.config.get("target_max_context")} for run in runs}


def context_terciles(turns: pd.DataFrame) -> pd.DataFrame:
    """Per decoded turn (one row per run, task, sample_id, turn): its task's context tercile (1..3) and the tercile's
    label bounds. Fewer than 3 distinct contexts give one part."""
    done = metrics.decoded(turns).drop_duplicates(["run", "task", "sample_id", "turn"])
    parts = []
    for _, cell in done.groupby("task", sort=False):
        values = cell.context_len.to_numpy(float)
        edges = np.unique(np.quantile(values, [1 / 3, 2 / 3])) if len(np.unique(values)) >= 3 else np.array([])
        part = np.searchsorted(edges, values, side="right") + 1 if len(edges) else np.ones(len(values), int)
        frame = cell[["run", "task", "sample_id", "turn", "context_len"]].assign(tercile=part)
        bounds = frame.groupby("tercile").context_len.agg(["min", "max"])
        frame["context_lo"] = frame.tercile.map(bounds["min"]).astype(int)
        frame["context_hi"] = frame.tercile.map(bounds["max"]).astype(int)
        parts.append(frame)
    columns = ["run", "task", "sample_id", "turn", "context_len", "tercile", "context_lo", "context_hi"]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)


def method_kinds(steps: pd.DataFrame, room: pd.Series) -> dict[str, str]:
    """{method: "fixed" | "variable"} over all of the method's steps (every task)."""
    kinds = {}
    for method, cell in steps.groupby("method", sort=False):
        share = metrics.draft_lengths(cell, room[cell.index])["share_full_room"]
        kinds[method] = ("fixed" if share >= FIXED_SHARE else "variable") if np.isfinite(share) else ""
    return kinds


def _cells(steps: pd.DataFrame, turns: pd.DataFrame, limits: dict | None, by_tercile: bool):
    """Yield (task, method, kind, part label, context lo, context hi, the cell's steps, their room)."""
    steps = steps[steps.method != BASELINE]
    if steps.empty:
        return
    room = metrics.draft_room(steps, turns, limits)
    kinds = method_kinds(steps, room)
    keyed = context_terciles(turns).set_index(["run", "task", "sample_id", "turn"])
    index = pd.MultiIndex.from_frame(steps[["run", "task", "sample_id", "turn"]])
    located = pd.DataFrame({"tercile": keyed.tercile.reindex(index).to_numpy(float),
                            "lo": keyed.context_lo.reindex(index).to_numpy(float),
                            "hi": keyed.context_hi.reindex(index).to_numpy(float)}, index=steps.index)
    for (task, method), cell in steps.groupby(["task", "method"], sort=False):
        where = located.loc[cell.index]
        yield task, method, kinds[method], "all", _bound(where.lo.min()), _bound(where.hi.max()), cell, \
            room[cell.index]
        if not by_tercile or where.tercile.nunique() < 2:
            continue
        for part, in_part in where.groupby("tercile"):
            sub = cell.loc[in_part.index]
            yield task, method, kinds[method], f"T{int(part)}", _bound(in_part.lo.min()), _bound(in_part.hi.max()), \
                sub, room[sub.index]


def _bound(value: float) -> int | float:
    return int(value) if np.isfinite(value) else np.nan


POSITION_COLUMNS = ["task", "method", "kind", "context_part", "context_lo", "context_hi", "position", "room",
                    "drafted", "reached", "accepted", "marginal", "conditional"]


def position_table(steps: pd.DataFrame, turns: pd.DataFrame, limits: dict | None = None, by_tercile: bool = True,
                   max_position: int | None = None) -> pd.DataFrame:
    """Long table: per (task, drafting method, context part: "all", "T1".."T3") and position j, the counts and
    rates of `metrics.per_position` (POSITION_COLUMNS)."""
    parts = []
    for task, method, kind, part, lo, hi, cell, room in _cells(steps, turns, limits, by_tercile):
        rates = metrics.per_position(cell, max_position, room)
        parts.append(rates.assign(task=task, method=method, kind=kind, context_part=part, context_lo=lo,
                                  context_hi=hi))
    return pd.concat(parts, ignore_index=True)[POSITION_COLUMNS] if parts else pd.DataFrame(columns=POSITION_COLUMNS)


DRAFT_LENGTH_COLUMNS = ["task", "method", "kind", "context_part", "context_lo", "context_hi", "n_steps",
                        "mean_drafted", "accept_rate_per_drafted_token", "share_full_room", "tau"]


def draft_length_table(steps: pd.DataFrame, turns: pd.DataFrame, limits: dict | None = None,
                       by_tercile: bool = True) -> pd.DataFrame:
    """Per (task, drafting method, context part): `metrics.draft_lengths` and the method's kind."""
    rows = [{"task": task, "method": method, "kind": kind, "context_part": part, "context_lo": lo, "context_hi": hi,
             **metrics.draft_lengths(cell, room)}
            for task, method, kind, part, lo, hi, cell, room in _cells(steps, turns, limits, by_tercile)]
    return pd.DataFrame(rows, columns=DRAFT_LENGTH_COLUMNS)


def acceptance_at(steps: pd.DataFrame, turns: pd.DataFrame | None, positions=(1, 3, 5),
                  limits: dict | None = None) -> dict[int, float]:
    """{j: marginal acceptance at j} for one cell (the telemetry table's acc_pos columns)."""
    if steps.empty or not (steps.num_drafted > 0).any():
        return {j: np.nan for j in positions}
    rates = metrics.per_position(steps, max(positions), metrics.draft_room(steps, turns, limits)).set_index("position")
    return {j: float(rates.marginal.get(j, np.nan)) for j in positions}
