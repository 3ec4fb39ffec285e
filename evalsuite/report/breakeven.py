"""Break-even τ from measured costs, binned consistently with the τ/speedup view.

A verify step of a drafting method costs draft + verify time and yields τ tokens on average; `ar` pays one
one-token decode per token. The method is faster per token exactly when

    τ > τ* = (draft ms + verify ms of the drafted block) / one-token decode ms

(`tau_break_even`). `tau_break_even_step` is the same with whole step times (step_s: draft + verify + acceptance,
rollback and bookkeeping) on both sides, which is what the measured speedup pays; neither counts the drafter's
start-of-turn work (`draft_prefill_s`), which the measured speedup includes. So τ / τ*_step (`speedup_implied`)
should sit a little above the measured speedup.

Costs come from the steps τ counts (not `budget_limited`) of the method; the one-token decode from the `ar`
method's steps (its verify forward of one token) of the same turns' bin. Unlike `stats.cost_curves`, which bins
steps by their own context, every step here falls in its *turn's* bin, with the task's turn-context bins of
`stats.context_curves` (`stats.turn_binning` over the task's decoded turns), so each row matches the τ/speedup row
with the same (task, method, context_lo, context_hi) label: those are the bin's own edges (turn contexts
context_lo..context_hi). Steps run past their turn's context by up to the reply's length; `step_context_lo/hi`
give the contexts the bin's steps actually saw.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from evalsuite import metrics
from evalsuite.conventions import BASELINE
from evalsuite.report import stats

MIN_INTERVAL_TRAJECTORIES = stats.MIN_INTERVAL_TRAJECTORIES

BREAK_EVEN_CONVENTION = (
    "break-even τ* = (draft ms + verify ms per verify step) / the target's one-token decode ms (the `ar` method's "
    "steps), over the steps τ counts, in the same bin: a method is faster than `ar` per token exactly when its τ "
    "exceeds τ*; τ*_step uses whole step times on both sides; neither includes the drafter's start-of-turn work. "
    "Bins are the task's turn-context bins of the τ/speedup table and each step falls in its turn's bin, so the "
    "cost, τ and speedup rows of one label hold the same turns; τ* = verify/decode (the target's verify/decode ratio, "
    "a property of the hardware and the target) + draft/decode (the drafter's own cost)")

BIN_COLUMNS = ["task", "method", "context_lo", "context_hi", "n_trajectories", "n_turns", "n_steps", "ar_decode_ms",
               "draft_ms", "verify_ms", "step_ms", "ar_step_ms", "tau", "tau_break_even", "tau_break_even_step",
               "speedup_implied", "draft_state_bytes", "step_context_lo", "step_context_hi", "context_median",
               "verify_ratio", "draft_ratio"]


def turn_bins(turns: pd.DataFrame, max_bins: int = 6) -> pd.DataFrame:
    """Per decoded (run, task, sample_id, turn): its bin within its task (0-based) and the bin's edges, the exact
    binning of `stats.context_curves`."""
    parts = []
    for task in list(dict.fromkeys(turns.task)):
        task_turns = metrics.decoded(turns[turns.task == task])
        if task_turns.empty:
            continue
        edges, column = stats.turn_binning(task_turns, max_bins)
        keyed = task_turns.drop_duplicates(["run", "sample_id", "turn"])
        b = stats.context_bin(keyed[column], edges)
        parts.append(pd.DataFrame({"run": keyed.run.to_numpy(), "task": task, "sample_id": keyed.sample_id.to_numpy(),
                                   "turn": keyed.turn.to_numpy(), "turn_context": keyed.context_len.to_numpy(),
                                   "bin": b, "context_lo": edges[b].astype(int),
                                   "context_hi": edges[b + 1].astype(int) - 1}))
    columns = ["run", "task", "sample_id", "turn", "turn_context", "bin", "context_lo", "context_hi"]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)


def _with_bins(frame: pd.DataFrame, bins: pd.DataFrame) -> pd.DataFrame:
    keys = ["run", "task", "sample_id", "turn"]
    return frame.merge(bins, on=keys, how="inner", suffixes=("", "_bin"))


def break_even_by_bin(steps: pd.DataFrame, turns: pd.DataFrame, max_bins: int = 6) -> pd.DataFrame:
    """Per (task, drafting method, turn-context bin): costs, τ and break-even τ (columns BIN_COLUMNS)."""
    bins = turn_bins(turns, max_bins)
    binned = _with_bins(steps, bins)
    rows = []
    for (task, b), cell in binned.groupby(["task", "bin"], sort=False):
        ar = cell[cell.method == BASELINE]
        ar_decode, ar_step = (1e3 * ar.verify_s.mean(), 1e3 * ar.step_s.mean()) if len(ar) else (np.nan, np.nan)
        for method, mine in cell[cell.method != BASELINE].groupby("method", sort=False):
            mine = mine[metrics.counted(mine)]
            if mine.empty:
                continue
            draft, verify, step = (1e3 * mine.draft_s.mean(), 1e3 * mine.verify_s.mean(), 1e3 * mine.step_s.mean())
            tau = metrics.tau(mine)
            star, star_step = metrics.tau_break_even(draft + verify, ar_decode), metrics.tau_break_even(step, ar_step)
            rows.append({"task": task, "method": method, "context_lo": int(mine.context_lo.iloc[0]),
                         "context_hi": int(mine.context_hi.iloc[0]),
                         "n_trajectories": int(stats.trajectory_keys(mine).nunique()),
                         "n_turns": int(mine.groupby(["run", "sample_id", "turn"]).ngroups), "n_steps": len(mine),
                         "ar_decode_ms": ar_decode, "draft_ms": draft, "verify_ms": verify, "step_ms": step,
                         "ar_step_ms": ar_step, "tau": tau, "tau_break_even": star, "tau_break_even_step": star_step,
                         "speedup_implied": tau / star_step if star_step > 0 else np.nan,
                         "draft_state_bytes": float(mine.draft_state_bytes.mean()),
                         "step_context_lo": int(mine.context_len.min()), "step_context_hi": int(mine.context_len.max()),
                         "context_median": float(mine.drop_duplicates(["run", "sample_id", "turn"]).turn_context
                                                 .median()),
                         "verify_ratio": verify / ar_decode if ar_decode else np.nan,
                         "draft_ratio": draft / ar_decode if ar_decode else np.nan})
    table = pd.DataFrame(rows, columns=BIN_COLUMNS)
    return table.sort_values(["task", "method", "context_lo"], key=_task_order(turns), kind="stable",
                             ignore_index=True)


def _task_order(turns: pd.DataFrame):
    order = {task: i for i, task in enumerate(dict.fromkeys(turns.task))}
    return lambda column: column.map(order) if column.name == "task" else column


def add_break_even(curves: pd.DataFrame, by_bin: pd.DataFrame) -> pd.DataFrame:
    """`stats.context_curves` output with `tau_break_even` (and `tau_break_even_step`) inserted after `tau_hi`,
    matched on (task, method, context_lo, context_hi); both come from the same turn bins, so every row matches."""
    keys = ["task", "method", "context_lo", "context_hi"]
    extra = ["tau_break_even", "tau_break_even_step"] + [c for c in ("verify_ratio", "draft_ratio")
                                                           if c in by_bin.columns]
    merged = curves.merge(by_bin[keys + extra], on=keys, how="left")
    columns = list(curves.columns)
    at = columns.index("tau_hi") + 1 if "tau_hi" in columns else len(columns)
    return merged[columns[:at] + extra + columns[at:]]


OVERALL_COLUMNS = ["task", "method", "n_trajectories", "n_steps", "tau", "tau_break_even", "tau_margin",
                   "tau_margin_lo", "tau_margin_hi", "tau_break_even_step", "speedup_implied", "ar_decode_ms",
                   "draft_ms", "verify_ms", "verify_ratio", "draft_ratio"]


def break_even_overall(steps: pd.DataFrame, turns: pd.DataFrame, seed: int = 0,
                       n_resamples: int = stats.DEFAULT_RESAMPLES,
                       min_trajectories: int = MIN_INTERVAL_TRAJECTORIES) -> pd.DataFrame:
    """Per (task, drafting method), pooled over the task's decoded turns: τ, τ*, the margin τ − τ* with a 95 %
    trajectory-bootstrap interval (both τ and τ* resampled together; none below `min_trajectories`)."""
    bins = turn_bins(turns, max_bins=1)  # one bin per task: only decoded turns, keyed like the binned view
    binned = _with_bins(steps, bins)
    rows = []
    for task, cell in binned.groupby("task", sort=False):
        ar = cell[cell.method == BASELINE]
        ar_units = ar.verify_s.groupby(stats.trajectory_keys(ar)).agg(["sum", "count"]) if len(ar) else None
        for method, mine in cell[cell.method != BASELINE].groupby("method", sort=False):
            mine = mine[metrics.counted(mine)]
            if mine.empty or ar_units is None:
                continue
            unit = stats.trajectory_keys(mine)
            per = pd.DataFrame({"tokens": metrics.step_tokens(mine.num_accepted).to_numpy(float), "steps": 1.0,
                                "cost": (mine.draft_s + mine.verify_s).to_numpy(float),
                                "step": mine.step_s.to_numpy(float)}, index=mine.index).groupby(unit).sum()
            units = per.index.intersection(ar_units.index)
            if not len(units):  # no trajectory with both this method's and `ar`'s steps: no break-even
                continue
            shared = mine[unit.isin(units).to_numpy()]
            sums = np.column_stack([per.loc[units, ["tokens", "steps", "cost"]].to_numpy(),
                                    ar_units.loc[units, ["sum", "count"]].to_numpy(float)])
            total = sums.sum(axis=0)
            tau, star = metrics.tau_ratio(total[0], total[1]), _break_even(total)
            low = high = np.nan
            if len(units) >= min_trajectories:
                low, high = stats.bootstrap_ci(sums, _margin, stats.cell_seed(seed, "break-even", method, task),
                                               n_resamples)
            ar_step = 1e3 * ar.step_s.mean()
            step_star = metrics.tau_break_even(1e3 * per.loc[units, "step"].sum() / total[1], ar_step)
            rows.append({"task": task, "method": method, "n_trajectories": len(units), "n_steps": int(total[1]),
                         "tau": tau, "tau_break_even": star, "tau_margin": tau - star,
                         "tau_margin_lo": float(low), "tau_margin_hi": float(high),
                         "tau_break_even_step": step_star, "speedup_implied": tau / step_star,
                         "ar_decode_ms": 1e3 * total[3] / total[4], "draft_ms": 1e3 * mine.draft_s.mean(),
                         "verify_ms": 1e3 * mine.verify_s.mean(),
                         # τ* split: the target's verify/decode ratio + the drafter's own cost (they sum to τ*)
                         "verify_ratio": float(shared.verify_s.sum() / total[1]) / (total[3] / total[4]),
                         "draft_ratio": float(shared.draft_s.sum() / total[1]) / (total[3] / total[4])})
    return pd.DataFrame(rows, columns=OVERALL_COLUMNS)


def _break_even(sums: np.ndarray) -> np.ndarray:
    """τ* of sums[..., :] = (Σ step tokens, steps, Σ(draft+verify) s, Σ ar decode s, ar steps)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return metrics.tau_break_even(sums[..., 2] / sums[..., 1], sums[..., 3] / sums[..., 4])


def _margin(sums: np.ndarray) -> np.ndarray:
    return metrics.tau_ratio(sums[..., 0], sums[..., 1]) - _break_even(sums)


def break_even_phrase(row) -> str:
    """'dlite τ 1.76 sits 0.03 below its break-even 1.79 (τ − τ* [-0.10, +0.04])' for one row of
    `break_even_overall`."""
    margin = row.tau_margin
    where = "above" if margin > 0 else "below" if margin < 0 else "at"
    text = f"{row.method} τ {row.tau:.2f} sits {abs(margin):.2f} {where} its break-even {row.tau_break_even:.2f}"
    if np.isfinite(row.tau_margin_lo):
        text += f" (τ − τ* [{row.tau_margin_lo:+.2f}, {row.tau_margin_hi:+.2f}])"
    else:
        text += f" (n={row.n_trajectories}, no interval)"
    return text


def break_even_sentence(overall: pd.DataFrame, task: str) -> str:
    """The headline's piece for one task: how far each method's τ sits above or below its break-even, largest
    margin first."""
    cells = overall[overall.task == task].sort_values("tau_margin", ascending=False)
    if cells.empty:
        return ""
    return f"On {task}, " + "; ".join(break_even_phrase(row) for row in cells.itertuples()) + "."
