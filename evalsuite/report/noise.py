"""Timing noise, measured: the spread of each turn's decode time over its `--repeats` decodes.

The engine decodes every turn `--repeats` times from the same seed and keeps the median repeat's record (the lower
middle one for an even count: of 2 repeats, the faster, which is not a median). Since the runner records every
repeat's decode seconds (`repeat_decode_s` in turns.parquet), the report measures the noise those repeats show:
per turn the coefficient of variation CV = sample standard deviation / mean of its repeats' decode seconds, and per
method the median CV over its turns. With 2 repeats a CV is one difference (a rough spread); with 3 or more it is
a spread. A speedup difference between two methods smaller than their combined noise
(√(CV_a² + CV_b²)) is called a tie, whatever its interval says. Runs written before the column existed, and runs
with one repeat, carry no spread: their noise is "unmeasured", said so.

Pure functions (no torch).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from evalsuite import metrics

NOISE_COLUMNS = ["task", "method", "repeats", "n_turns_measured", "n_turns", "median_cv", "p90_cv", "status"]
NOISE_CONVENTION = (
    "timing noise: per decoded turn CV = sample standard deviation / mean of the decode seconds of its --repeats "
    "decodes from the same seed (turns.parquet `repeat_decode_s`); per task × method the median (and 90th "
    "percentile) CV over its turns; the record kept is the median repeat (the lower middle one for an even count, "
    "so of 2 repeats the faster); a speedup difference smaller than √(CV_a² + CV_b²) of the two methods is a tie; "
    "'unmeasured' = the runs recorded no repeats' times (written before the column, or --repeats 1)")


def turn_cv(repeats) -> float:
    """CV of one turn's repeat decode seconds; NaN with fewer than 2 positive values."""
    if repeats is None or (isinstance(repeats, float) and math.isnan(repeats)):
        return float("nan")
    values = np.asarray(list(repeats), float)
    values = values[np.isfinite(values) & (values > 0)]
    if len(values) < 2:
        return float("nan")
    return float(values.std(ddof=1) / values.mean())


def noise_table(turns: pd.DataFrame, repeats: dict[str, int] | None = None) -> pd.DataFrame:
    """Per task × method (NOISE_COLUMNS). `repeats`: {run key: --repeats} from run.json."""
    done = metrics.decoded(turns)
    rows = []
    for (task, method), cell in done.groupby(["task", "method"], sort=False):
        column = cell["repeat_decode_s"] if "repeat_decode_s" in cell.columns else pd.Series(None, index=cell.index)
        cv = column.map(turn_cv).to_numpy(float)
        measured = np.isfinite(cv)
        n_repeats = sorted({int((repeats or {}).get(str(r), 1)) for r in cell.run}) if "run" in cell else [1]
        rows.append({"task": task, "method": method, "repeats": ", ".join(map(str, n_repeats)),
                     "n_turns_measured": int(measured.sum()), "n_turns": len(cell),
                     "median_cv": float(np.median(cv[measured])) if measured.any() else np.nan,
                     "p90_cv": float(np.quantile(cv[measured], 0.9)) if measured.any() else np.nan,
                     "status": "measured" if measured.any() else
                     ("unmeasured: one decode per turn" if n_repeats == [1] else
                      "unmeasured: the runs predate the recorded repeats (turns.parquet has no repeat_decode_s)")})
    return pd.DataFrame(rows, columns=NOISE_COLUMNS)


def combined_noise(noise: pd.DataFrame, task: str, a: str, b: str) -> float:
    """√(CV_a² + CV_b²) of two methods on a task; NaN when either is unmeasured (the `ar` baseline's own CV is
    used for `ar`)."""
    cells = noise[noise.task == task].set_index("method").median_cv
    if a not in cells.index or b not in cells.index:
        return float("nan")
    return float(math.hypot(cells[a], cells[b])) if np.isfinite(cells[a]) and np.isfinite(cells[b]) else float("nan")


def is_tie(level: float, ratio: float) -> bool:
    """A ratio of two timings (or a speedup against `ar`) nearer to 1 than the measured noise `level` (NaN: not)."""
    return bool(np.isfinite(level) and np.isfinite(ratio) and abs(ratio - 1.0) < level)


def tie_clause(noise: pd.DataFrame, ranked: pd.DataFrame, task: str) -> str:
    """'' or a clause saying the best and the runner-up differ by less than their timing noise (a tie)."""
    cells = ranked[ranked.task == task].sort_values("rank")
    if len(cells) < 2 or noise.empty:
        return ""
    best, runner = cells.iloc[0], cells.iloc[1]
    level = combined_noise(noise, task, best.method, runner.method)
    ratio = float(runner.ratio_to_best)  # the paired ratio best / runner-up
    if is_tie(level, ratio):
        return (f" (their {abs(ratio - 1.0):.1%} difference is below the timing noise of {level:.1%}, "
                "√(CV² + CV²) of the two: a tie)")
    return ""


def noise_sentence(noise: pd.DataFrame) -> str:
    if noise.empty:
        return ""
    measured = noise[noise.n_turns_measured > 0]
    if measured.empty:
        reasons = sorted(set(noise.status))
        return "Timing noise is " + "; ".join(reasons) + "."
    per_method = measured.groupby("method").median_cv.median().sort_values()
    return ("Timing noise (median CV of a turn's decode seconds over its repeats): " +
            ", ".join(f"{m} {v:.1%}" for m, v in per_method.items()) + ".")


def with_noise_ties(ranks: pd.DataFrame, noise: pd.DataFrame) -> pd.DataFrame:
    """`decisions.rank_methods` rows with the speedup ranking's "best" demoted to "tied for best" where the
    runner-up (and each next method) is nearer to it than their timing noise, √(CV² + CV²): a difference the
    repeats show the clock cannot resolve is a tie, whatever the bootstrap over trajectories says. Unmeasured noise
    changes nothing."""
    if noise is None or noise.empty or ranks.empty:
        return ranks
    ranks = ranks.copy()
    for task in ranks.task.unique():
        mask = (ranks.task == task) & (ranks.measure == "speedup")
        cells = ranks[mask].sort_values("rank")
        if len(cells) < 2 or cells.status.iloc[0] != "best":
            continue
        best = cells.iloc[0]
        tied = []
        for index, row in cells.iloc[1:].iterrows():
            if not is_tie(combined_noise(noise, task, best.method, row.method), float(row.ratio_to_best)):
                break
            tied.append(index)
        if tied:
            ranks.loc[[cells.index[0], *tied], "status"] = "tied for best"
    return ranks
