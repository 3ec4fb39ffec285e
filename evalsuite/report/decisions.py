"""Honest comparisons: intervals as [lo, hi], none below three trajectories, "faster than
`ar`" only when the speedup interval is clear of 1, and "best" / ties decided by a *paired* bootstrap of the ratio
to the runner-up over the trajectories both methods share, never by overlapping marginal intervals.

Why paired: two methods run on the same turns; much of each method's interval is how fast or repetitive the
trajectories are, which both share. Two marginal intervals can overlap widely while the method A / method B
ratio, resampled over the same trajectories, is clearly above 1 (and two intervals that barely overlap can still
hide a ratio that is not). The ratio of speedups is the ratio of the methods' decode times per token on the same
turns (the `ar` side cancels); for τ it is τ_A / τ_B over the same trajectories' turns.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from evalsuite import degenerate, metrics
from evalsuite.conventions import BASELINE
from evalsuite.report import stats

MIN_INTERVAL_TRAJECTORIES = stats.MIN_INTERVAL_TRAJECTORIES

INTERVAL_CONVENTION = (
    "95 % intervals are printed as [lo, hi] (percentile bootstrap over whole trajectories; they are not symmetric, "
    "so never as ±); a cell with fewer than 3 trajectories prints its value and its n, no interval")
FASTER_CONVENTION = (
    "“faster than `ar`” only when the speedup's 95 % interval lies above 1 (“slower” when below 1); otherwise "
    "the method is not separable from `ar`")
BEST_CONVENTION = (
    "best = the highest point estimate; it is the clear best only when the paired bootstrap ratio to the runner-up "
    "(resampling the trajectories both ran, on the turns both decoded) has its 95 % interval above 1; otherwise the "
    "runner-up and each next method whose paired ratio to the best still contains 1 are tied with it, down to the "
    "first method clearly behind")


# ---- formatting --------------------------------------------------------------------------------------------------
def interval_shown(n_trajectories: int, low: float, high: float,
                   min_trajectories: int = MIN_INTERVAL_TRAJECTORIES) -> bool:
    return n_trajectories >= min_trajectories and np.isfinite(low) and np.isfinite(high)


def format_interval(low: float, high: float, digits: int = 2) -> str:
    """'[1.50, 7.56]' (empty when either bound is missing)."""
    if not (np.isfinite(low) and np.isfinite(high)):
        return ""
    return f"[{low:.{digits}f}, {high:.{digits}f}]"


def format_estimate(value: float, low: float, high: float, n_trajectories: int, digits: int = 2, unit: str = "",
                    min_trajectories: int = MIN_INTERVAL_TRAJECTORIES) -> str:
    """'1.06× [0.91, 1.20]', or '1.29× (n=2)' below `min_trajectories` (never a ± of an asymmetric interval)."""
    if not np.isfinite(value):
        return "–"
    text = f"{value:.{digits}f}{unit}"
    if interval_shown(n_trajectories, low, high, min_trajectories):
        return f"{text} {format_interval(low, high, digits)}"
    return f"{text} (n={n_trajectories})"


# ---- against ar ----------------------------------------------------------------------------------------------------
SPEED_COLUMNS = ["task", "method", "n_trajectories", "n_turns", "speedup", "speedup_lo", "speedup_hi", "verdict"]


def versus_ar(speedup: float, low: float, high: float, n_trajectories: int,
              min_trajectories: int = MIN_INTERVAL_TRAJECTORIES) -> str:
    """'faster than ar' | 'slower than ar' | 'not separable from ar' | 'no interval (n<3)'."""
    if not interval_shown(n_trajectories, low, high, min_trajectories):
        return f"no interval (n<{min_trajectories})"
    if low > 1.0:
        return "faster than ar"
    if high < 1.0:
        return "slower than ar"
    return "not separable from ar"


def speed_table(turns: pd.DataFrame, seed: int = 0, n_resamples: int = stats.DEFAULT_RESAMPLES,
                min_trajectories: int = MIN_INTERVAL_TRAJECTORIES) -> pd.DataFrame:
    """Per (task, drafting method): the pooled paired speedup, its trajectory-bootstrap interval (the seed of
    `stats.summarize`'s cell, so the numbers match the summary table) and the verdict against `ar`."""
    rows = []
    for (method, task), cell in turns[turns.method != BASELINE].groupby(["method", "task"], sort=False):
        units = list(dict.fromkeys(stats.trajectory_keys(cell)))
        low, high = stats.speedup_ci(cell, units, stats.cell_seed(seed, "speedup", method, task), n_resamples)
        n = int(stats.trajectory_keys(metrics.paired(cell)).nunique())
        if n < min_trajectories:
            low = high = float("nan")
        value = metrics.speedup(cell)
        rows.append({"task": task, "method": method, "n_trajectories": n, "n_turns": len(metrics.paired(cell)),
                     "speedup": value, "speedup_lo": low, "speedup_hi": high,
                     "verdict": versus_ar(value, low, high, n, min_trajectories)})
    return pd.DataFrame(rows, columns=SPEED_COLUMNS)


# ---- paired between methods ----------------------------------------------------------------------------------------
def paired_ratio(steps: pd.DataFrame, turns: pd.DataFrame, task: str, a: str, b: str, measure: str = "speedup",
                 seed: int = 0, n_resamples: int = stats.DEFAULT_RESAMPLES,
                 min_trajectories: int = MIN_INTERVAL_TRAJECTORIES) -> dict:
    """measure(a) / measure(b) on the turns both methods decoded (and paired with `ar`, for speedup), with a paired
    percentile bootstrap over the trajectories both ran. Returns {ratio, lo, hi, n_trajectories, n_turns}; no
    interval below `min_trajectories` shared trajectories."""
    keys = ["run", "sample_id", "turn"]
    cell = turns[turns.task == task]
    if measure == "speedup":
        mine, theirs = metrics.paired(cell[cell.method == a]), metrics.paired(cell[cell.method == b])
    elif measure == "tau":
        mine, theirs = metrics.decoded(cell[cell.method == a]), metrics.decoded(cell[cell.method == b])
    else:
        raise ValueError(f"measure {measure!r}: use speedup or tau")
    shared = mine[keys].merge(theirs[keys], on=keys).drop_duplicates()
    out = {"ratio": float("nan"), "lo": float("nan"), "hi": float("nan"), "n_trajectories": 0,
           "n_turns": len(shared)}
    if shared.empty:
        return out
    units = list(dict.fromkeys(shared.run.astype(str) + "\0" + shared.sample_id.astype(str)))
    out["n_trajectories"] = len(units)
    if measure == "speedup":
        # decode s and tokens of each side per trajectory: speedup_a / speedup_b = (s_b / t_b) / (s_a / t_a) when
        # both are paired with the same ar turn; the ar sums are kept so unequal ar pairings stay exact
        per_unit = np.concatenate([_turn_sums(mine, shared, units), _turn_sums(theirs, shared, units)], axis=1)
        statistic = _speedup_log_ratio
    else:
        step_cell = steps[steps.task == task]
        per_unit = np.concatenate([_tau_sums(step_cell[step_cell.method == a], shared, units),
                                   _tau_sums(step_cell[step_cell.method == b], shared, units)], axis=1)
        statistic = _tau_log_ratio
    out["ratio"] = float(np.exp(statistic(per_unit.sum(axis=0))))
    if len(units) >= min_trajectories:
        low, high = stats.bootstrap_ci(per_unit, statistic, seed, n_resamples)
        out["lo"], out["hi"] = float(np.exp(low)), float(np.exp(high))
    return out


def _restrict(frame: pd.DataFrame, shared: pd.DataFrame) -> pd.DataFrame:
    return frame.merge(shared, on=["run", "sample_id", "turn"])


def _units(frame: pd.DataFrame) -> pd.Series:
    return frame.run.astype(str) + "\0" + frame.sample_id.astype(str)


def _turn_sums(turns: pd.DataFrame, shared: pd.DataFrame, units: list[str]) -> np.ndarray:
    cell = _restrict(turns, shared)
    columns = ["ar_decode_s", "ar_new_tokens", "decode_s", "new_tokens"]
    return cell[columns].astype(float).groupby(_units(cell)).sum().reindex(units, fill_value=0.0).to_numpy()


def _tau_sums(steps: pd.DataFrame, shared: pd.DataFrame, units: list[str]) -> np.ndarray:
    return stats.tau_sums(_restrict(steps, shared), units)


def _speedup_log_ratio(sums: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(stats._speedup_from_sums(sums[..., :4])) - np.log(stats._speedup_from_sums(sums[..., 4:]))


def _tau_log_ratio(sums: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(metrics.tau_ratio(sums[..., 0], sums[..., 1])) - \
            np.log(metrics.tau_ratio(sums[..., 2], sums[..., 3]))


RANK_COLUMNS = ["task", "measure", "method", "rank", "value", "ratio_to_best", "ratio_lo", "ratio_hi",
                "n_shared_trajectories", "status"]


def rank_methods(steps: pd.DataFrame, turns: pd.DataFrame, measure: str = "speedup", seed: int = 0,
                 n_resamples: int = stats.DEFAULT_RESAMPLES, min_trajectories: int = MIN_INTERVAL_TRAJECTORIES,
                 methods: list[str] | None = None) -> pd.DataFrame:
    """Per task and drafting method: its rank by point estimate, the paired ratio best / method with its interval,
    and a status: "best" (every other method is clearly behind: the ratio interval lies above 1), "tied for best"
    (the best and each method whose ratio interval with the best contains 1), "behind", or "undecided (n<3)"
    where the shared trajectories are too few for an interval."""
    rows = []
    for task in list(dict.fromkeys(turns.task)):
        cell = turns[(turns.task == task) & (turns.method != BASELINE)]
        names = [m for m in dict.fromkeys(cell.method) if methods is None or m in methods]
        values = {}
        for method in names:
            if measure == "speedup":
                values[method] = metrics.speedup(cell[cell.method == method])
            else:
                values[method] = metrics.tau(steps[(steps.task == task) & (steps.method == method)])
        ranked = sorted([m for m in names if np.isfinite(values[m])], key=lambda m: -values[m])
        if not ranked:
            continue
        best = ranked[0]
        comparisons = {m: paired_ratio(steps, turns, task, best, m, measure,
                                       stats.cell_seed(seed, "paired", measure, task, best, m), n_resamples,
                                       min_trajectories) for m in ranked[1:]}
        status = _statuses(best, ranked[1:], comparisons, min_trajectories)
        for rank, m in enumerate(ranked, start=1):
            c = comparisons.get(m, {"ratio": 1.0, "lo": float("nan"), "hi": float("nan"),
                                    "n_trajectories": int(stats.trajectory_keys(cell[cell.method == m]).nunique())})
            rows.append({"task": task, "measure": measure, "method": m, "rank": rank, "value": values[m],
                         "ratio_to_best": c["ratio"], "ratio_lo": c["lo"], "ratio_hi": c["hi"],
                         "n_shared_trajectories": c["n_trajectories"], "status": status[m]})
    return pd.DataFrame(rows, columns=RANK_COLUMNS)


def _statuses(best: str, others: list[str], comparisons: dict[str, dict], min_trajectories: int) -> dict[str, str]:
    """The runner-up rule: the best is clear ("best") when its paired ratio to the runner-up lies above 1. Otherwise
    the runner-up, and each next method in rank order whose paired ratio to the best still covers 1, are "tied for
    best" with it, down to the first method clearly behind; every later method is "behind". Without an interval
    for the runner-up (too few shared trajectories) the ranking is "undecided"."""
    status = {best: "best"}
    if not others:
        return status
    first = comparisons[others[0]]
    if not np.isfinite(first["lo"]):
        return {m: f"undecided (n<{min_trajectories})" for m in [best, *others]}
    if first["lo"] > 1.0:
        return {**status, **{m: "behind" for m in others}}
    status[best] = "tied for best"
    tied = True
    for m in others:
        c = comparisons[m]
        tied = tied and np.isfinite(c["lo"]) and c["lo"] <= 1.0
        status[m] = "tied for best" if tied else "behind"
    return status


def best_sentence(ranked: pd.DataFrame, task: str, unit: str = "×") -> str:
    """'suffix is the fastest (1.96×), clearly ahead of ngram (paired ratio 1.09 [1.03, 1.15])', or, when tied,
    every method not separable from the best with its paired ratio."""
    cells = ranked[ranked.task == task].sort_values("rank")
    if cells.empty:
        return ""
    best = cells.iloc[0]
    what = "fastest" if cells.measure.iloc[0] == "speedup" else "highest τ"
    if len(cells) == 1:
        return f"{best.method} ({best.value:.2f}{unit}) is the only drafting method"

    def ratio(row) -> str:
        interval = format_interval(row.ratio_lo, row.ratio_hi)
        return f"paired ratio {row.ratio_to_best:.2f} " + (interval or f"(n={row.n_shared_trajectories})")

    runner = cells.iloc[1]
    if best.status == "best":
        return (f"{best.method} is the {what} ({best.value:.2f}{unit}), clearly ahead of {runner.method} "
                f"({ratio(runner)})")
    if best.status == "tied for best":
        tied = cells[(cells.status == "tied for best") & (cells.method != best.method)]
        return (f"{best.method} has the {what} point estimate ({best.value:.2f}{unit}) but is not separable from "
                + _and([f"{row.method} ({row.value:.2f}{unit}, {ratio(row)})" for row in tied.itertuples()]))
    return f"{best.method} has the {what} point estimate ({best.value:.2f}{unit}); undecided ({ratio(runner)})"


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# ---- with and without degenerate turns ------------------------------------------------------------------------------
DEGENERATE_COLUMNS = ["task", "method", "flagged_turns", "n_turns", "n_turns_without", "speedup", "speedup_lo",
                      "speedup_hi", "verdict", "speedup_without", "speedup_without_lo", "speedup_without_hi",
                      "verdict_without", "tau", "tau_without"]


def degenerate_comparison(steps: pd.DataFrame, turns: pd.DataFrame, seed: int = 0,
                          n_resamples: int = stats.DEFAULT_RESAMPLES) -> pd.DataFrame:
    """Per (task, drafting method): the speedup (with its interval and verdict against `ar`) and τ on all turns and
    without the turns flagged degenerate for any method (`degenerate.drop_flagged`: every method loses the same
    turns). `turns` must carry `degenerate` (`degenerate.flag_turns`)."""
    kept_steps, kept_turns = degenerate.drop_flagged(steps, turns), degenerate.drop_flagged(turns, turns)
    everything = speed_table(turns, seed, n_resamples).set_index(["task", "method"])
    without = speed_table(kept_turns, seed, n_resamples).set_index(["task", "method"])
    flagged = degenerate.flagged_keys(turns)
    rows = []
    for (task, method), row in everything.iterrows():
        other = without.loc[(task, method)] if (task, method) in without.index else None
        cell_steps = steps[(steps.task == task) & (steps.method == method)]
        cell_kept = kept_steps[(kept_steps.task == task) & (kept_steps.method == method)]
        rows.append({"task": task, "method": method, "flagged_turns": int((flagged.task == task).sum()),
                     "n_turns": int(row.n_turns), "n_turns_without": int(other.n_turns) if other is not None else 0,
                     "speedup": row.speedup, "speedup_lo": row.speedup_lo, "speedup_hi": row.speedup_hi,
                     "verdict": row.verdict,
                     "speedup_without": other.speedup if other is not None else np.nan,
                     "speedup_without_lo": other.speedup_lo if other is not None else np.nan,
                     "speedup_without_hi": other.speedup_hi if other is not None else np.nan,
                     "verdict_without": other.verdict if other is not None else "",
                     "tau": metrics.tau(cell_steps), "tau_without": metrics.tau(cell_kept)})
    return pd.DataFrame(rows, columns=DEGENERATE_COLUMNS)
