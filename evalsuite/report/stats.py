"""The report's statistics over the steps/turns tables: costs, context curves, the per-cell summary and the
trajectory bootstrap. τ, speedup, per-position acceptance and pairing themselves are defined once, in
`evalsuite.metrics`."""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from evalsuite import metrics
from evalsuite.conventions import BASELINE

MIN_INTERVAL_TRAJECTORIES = 3  # no interval (and no claim resting on one) below this many trajectories
CI_CONVENTION = ("95 % CI: percentile bootstrap resampling whole trajectories (sample ids) with replacement, printed "
                 "as [lo, hi] (it is not symmetric, so never as ±); a cell with fewer than "
                 f"{MIN_INTERVAL_TRAJECTORIES} trajectories has no interval and prints its n instead")
CONTEXT_CONVENTION = ("context = the turn's prompt length in tokens (what the target holds before the reply); bins "
                      "are quantile bins of each task's own turn contexts, so no bin mixes tasks; a turn's steps "
                      "and its speedup fall in its turn's bin")
MIN_TRAJECTORIES = 5  # below this many trajectories a cell carries a visible note
MIN_INTERVAL_TURNS = 5  # a context bin with fewer turns shows its point only, marked (no interval)
FEW_TURNS_MARK = "‡"
FEW_TURNS_NOTE = (f"{FEW_TURNS_MARK} fewer than {MIN_INTERVAL_TURNS} turns in this context bin: the point alone, no "
                  f"interval (an interval over so few turns, e.g. a bin of 3 turns, would be far too narrow)")
NO_INTERVAL_NOTE = (f"hollow: fewer than {MIN_INTERVAL_TURNS} turns or {MIN_INTERVAL_TRAJECTORIES} trajectories, "
                    "no interval")  # the figures' word for a point shown without its interval
SKIPPED_CONVENTION = "turns skipped at the context limit are excluded from τ and speedup and counted in `skipped`"

DEFAULT_RESAMPLES = 2000


def interval_allowed(n_turns, n_trajectories):
    """The one rule for an interval on a bin (tables and figures): at least MIN_INTERVAL_TURNS turns and
    MIN_INTERVAL_TRAJECTORIES trajectories in it; scalars give a bool, arrays an array of them."""
    allowed = (np.asarray(n_turns) >= MIN_INTERVAL_TURNS) & (np.asarray(n_trajectories) >= MIN_INTERVAL_TRAJECTORIES)
    return bool(allowed) if allowed.ndim == 0 else allowed


def speedup_from_sums(sums: np.ndarray) -> np.ndarray:
    """sums[..., :] = (AR seconds, AR tokens, method seconds, method tokens)."""
    return metrics.speedup_ratio(sums[..., 0], sums[..., 1], sums[..., 2], sums[..., 3])


_speedup_from_sums = speedup_from_sums


def _ratio(sums: np.ndarray) -> np.ndarray:
    """τ of summed (Σ step tokens, steps) pairs on the last axis."""
    return metrics.tau_ratio(sums[..., 0], sums[..., 1])


# ---- costs -----------------------------------------------------------------------------------------------------
@dataclass
class Cost:
    draft_ms: float  # mean draft time per verify step
    verify_ms: float  # mean verify time per step
    draft_verify_ratio: float  # total draft time / total verify time
    median_context: float
    bytes_at_median: float  # draft-state bytes at the step whose context is nearest the median context
    max_context: int
    bytes_at_max: float  # draft-state bytes at the largest context


def cost(steps: pd.DataFrame) -> Cost:
    if steps.empty:
        nan = float("nan")
        return Cost(nan, nan, nan, nan, nan, 0, nan)
    context = steps.context_len.to_numpy()
    median = float(np.median(context))
    distance = np.abs(context - median)
    at_median = steps.draft_state_bytes[distance == distance.min()]
    largest = int(context.max())
    verify_total = steps.verify_s.sum()
    return Cost(
        draft_ms=1e3 * float(steps.draft_s.mean()),
        verify_ms=1e3 * float(steps.verify_s.mean()),
        draft_verify_ratio=float(steps.draft_s.sum() / verify_total) if verify_total > 0 else float("nan"),
        median_context=median,
        bytes_at_median=float(at_median.median()),
        max_context=largest,
        bytes_at_max=float(steps.draft_state_bytes[context == largest].max()),
    )


# ---- bootstrap -------------------------------------------------------------------------------------------------
def cell_seed(seed: int, *labels) -> int:
    """A seed per table cell, so a cell's interval does not depend on which other cells the report holds."""
    text = "\0".join([str(seed), *map(str, labels)])
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


def bootstrap_ci(per_unit: np.ndarray, statistic: Callable[[np.ndarray], np.ndarray], seed: int,
                 n_resamples: int = DEFAULT_RESAMPLES, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Percentile CI of `statistic(sum over units)`, resampling the units (axis 0) with replacement.

    per_unit: [n_units, ...] additive per-unit sums (e.g. per trajectory: sum of accepted+1, number of steps);
    statistic maps summed arrays [..., q] to the measure. Returns (low, high) with the statistic's shape.
    Resamples whose statistic is undefined (e.g. no steps drawn in a bin) are left out of the percentiles."""
    per_unit = np.asarray(per_unit, dtype=float)
    n = per_unit.shape[0]
    shape = np.shape(statistic(per_unit.sum(axis=0)))
    if n == 0:
        return np.full(shape, np.nan), np.full(shape, np.nan)
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n, np.full(n, 1.0 / n), size=n_resamples).astype(float)  # [B, n]
    totals = np.tensordot(counts, per_unit, axes=(1, 0))  # [B, ...]
    values = statistic(totals)
    tail = (1.0 - level) / 2.0
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(values)
        if not finite.any():
            return np.full(shape, np.nan), np.full(shape, np.nan)
        values = np.where(finite, values, np.nan)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns give NaN, which is what we want
            low, high = np.nanquantile(values, [tail, 1.0 - tail], axis=0)
    return low, high


def trajectory_keys(turns: pd.DataFrame) -> pd.Series:
    """A trajectory is one (run, sample_id); the bootstrap resamples these whole."""
    return turns.run.astype(str) + "\0" + turns.sample_id.astype(str)


def tau_sums(steps: pd.DataFrame, units: list[str]) -> np.ndarray:
    """[n_units, 2]: per trajectory, sum of (accepted + 1) and number of steps (zeros where it has none)."""
    steps = steps[metrics.counted(steps)]
    if steps.empty:
        return np.zeros((len(units), 2))
    grouped = metrics.step_tokens(steps.num_accepted).groupby(trajectory_keys(steps)).agg(["sum", "count"])
    return grouped.reindex(units, fill_value=0).to_numpy(dtype=float)


def speedup_sums(turns: pd.DataFrame, units: list[str]) -> np.ndarray:
    """[n_units, 4]: per trajectory, over its paired turns: AR seconds, AR tokens, method seconds, method tokens."""
    pairs = metrics.paired(turns)
    if pairs.empty:
        return np.zeros((len(units), 4))
    columns = ["ar_decode_s", "ar_new_tokens", "decode_s", "new_tokens"]
    grouped = pairs[columns].astype(float).groupby(trajectory_keys(pairs)).sum()
    return grouped.reindex(units, fill_value=0.0).to_numpy(dtype=float)


def tau_ci(steps: pd.DataFrame, units: list[str], seed: int, n_resamples: int = DEFAULT_RESAMPLES):
    low, high = bootstrap_ci(tau_sums(steps, units), _ratio, seed, n_resamples)
    return float(low), float(high)


def speedup_ci(turns: pd.DataFrame, units: list[str], seed: int, n_resamples: int = DEFAULT_RESAMPLES):
    low, high = bootstrap_ci(speedup_sums(turns, units), _speedup_from_sums, seed, n_resamples)
    return float(low), float(high)


# ---- one row per (method, task) --------------------------------------------------------------------------------
SUMMARY_COLUMNS = ["method", "task", "temperature", "trajectories", "turns", "skipped", "steps", "tokens",
                   "tau", "tau_ci_low", "tau_ci_high", "tau_turn_macro",
                   "paired_turns", "speedup", "speedup_ci_low", "speedup_ci_high", "ar_ms_per_token",
                   "differs_from_ar", "compared_with_ar"]


def summarize(steps: pd.DataFrame, turns: pd.DataFrame, seed: int = 0,
              n_resamples: int = DEFAULT_RESAMPLES) -> pd.DataFrame:
    """τ and speedup with their CIs, per (method, task); the cells of Tables 1-3."""
    rows = []
    for (method, task), cell_turns in turns.groupby(["method", "task"], sort=False):
        cell_steps = steps[(steps.method == method) & (steps.task == task)]
        units = list(dict.fromkeys(trajectory_keys(cell_turns)))
        done = metrics.decoded(cell_turns)
        tau_low, tau_high = tau_ci(cell_steps, units, cell_seed(seed, "tau", method, task), n_resamples)
        sp_low, sp_high = speedup_ci(cell_turns, units, cell_seed(seed, "speedup", method, task), n_resamples)
        if len(units) < MIN_INTERVAL_TRAJECTORIES or method == BASELINE:  # too few, or 1 by construction
            tau_low = tau_high = sp_low = sp_high = float("nan")
        differs, compared = metrics.differs_from_ar(turns[turns.task == task], method)
        rows.append({
            "method": method, "task": task,
            "temperature": float(cell_turns.temperature.iloc[0]) if "temperature" in cell_turns else float("nan"),
            "trajectories": len(units), "turns": len(done), "skipped": int(len(cell_turns) - len(done)),
            "steps": len(cell_steps), "tokens": int(done.new_tokens.sum()),
            "tau": metrics.tau(cell_steps), "tau_ci_low": tau_low, "tau_ci_high": tau_high,
            "tau_turn_macro": metrics.tau_turn_macro(cell_steps),
            "paired_turns": len(metrics.paired(cell_turns)), "speedup": metrics.speedup(cell_turns),
            "speedup_ci_low": sp_low, "speedup_ci_high": sp_high,
            "ar_ms_per_token": metrics.ar_ms_per_token(turns[turns.task == task]),
            "differs_from_ar": differs, "compared_with_ar": compared,
        })
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


# ---- curves ----------------------------------------------------------------------------------------------------
def tau_curve(steps: pd.DataFrame, key: pd.Series, seed: int, n_resamples: int = DEFAULT_RESAMPLES) -> pd.DataFrame:
    """τ per value of `key` (aligned with `steps`: a turn index, a context bin), with a trajectory-bootstrap CI and
    the steps, turns and trajectories behind each value (turns and trajectories with a counted step there)."""
    mask = metrics.counted(steps).to_numpy()
    steps, key = steps[mask], pd.Series(np.asarray(key)[mask], index=steps.index[mask])
    if steps.empty:
        return pd.DataFrame(columns=["key", "tau", "low", "high", "steps", "turns", "trajectories"])
    units = list(dict.fromkeys(trajectory_keys(steps)))
    keys = sorted(key.unique())
    frame = pd.DataFrame({"unit": trajectory_keys(steps), "key": key.to_numpy(),
                          "value": metrics.step_tokens(steps.num_accepted).to_numpy()})
    turns = (frame.unit + "\0" + steps.turn.astype(str).to_numpy()).groupby(frame.key).nunique().reindex(keys)
    sums = frame.pivot_table(index="unit", columns="key", values="value", aggfunc="sum", fill_value=0)
    counts = frame.pivot_table(index="unit", columns="key", values="value", aggfunc="count", fill_value=0)
    sums, counts = sums.reindex(index=units, columns=keys, fill_value=0), counts.reindex(index=units, columns=keys,
                                                                                           fill_value=0)
    per_unit = np.stack([sums.to_numpy(float), counts.to_numpy(float)], axis=-1)  # [units, keys, 2]
    point = _ratio(per_unit.sum(axis=0))
    low, high = bootstrap_ci(per_unit, _ratio, seed, n_resamples)
    return pd.DataFrame({"key": keys, "tau": point, "low": low, "high": high,
                         "steps": counts.sum(axis=0).to_numpy(int), "turns": turns.to_numpy(int),
                         "trajectories": (counts > 0).sum(axis=0).to_numpy(int)})


# ---- context curves within each task ---------------------------------------------------------------------------
CONTEXT_CURVE_COLUMNS = ["task", "method", "context_lo", "context_hi", "n_trajectories", "n_turns", "n_steps",
                         "tau", "tau_lo", "tau_hi", "speedup", "speedup_lo", "speedup_hi"]


def task_context_edges(contexts: pd.Series, max_bins: int = 6, min_turns_per_bin: int = 2,
                       min_spread: float = 1.25) -> np.ndarray:
    """Quantile bin edges over one task's turn contexts: [lo, hi) per bin, the last edge past the maximum.

    At most `max_bins`, few enough that a bin holds about `min_turns_per_bin` distinct contexts, and one bin when
    the longest context is less than `min_spread` times the shortest (nothing to see against context there)."""
    values = np.sort(contexts.to_numpy(float))
    if len(values) == 0:
        return np.array([0.0, 1.0])
    bins = int(max(1, min(max_bins, len(np.unique(values)) // max(1, min_turns_per_bin))))
    if values[-1] < min_spread * max(values[0], 1.0):
        bins = 1
    inner = np.quantile(values, np.linspace(0, 1, bins + 1)[1:-1], method="lower") if bins > 1 else []
    edges = np.unique(np.concatenate([[values[0]], np.ceil(np.asarray(inner, float)) + 1 if len(inner) else [],
                                      [values[-1] + 1]]))
    return edges.astype(float)


def turn_binning(task_turns: pd.DataFrame, max_bins: int = 6) -> tuple[np.ndarray, str]:
    """(edges, column) of one task's context bins over its decoded turns: a bin is `context_bin(turns[column],
    edges)`. Runs decoded at context points (`--context-points`, every turn at one) get one bin per point, by the
    point ([point, next point)), since a point's turn may start just past it (a replayed trajectory) or just below
    it (a one-document task cut to fit it); other runs get quantile bins of the context (`task_context_edges`)."""
    if "context_point" in task_turns.columns and len(task_turns) and (task_turns.context_point > 0).all():
        points = np.unique(task_turns.context_point.to_numpy(float))
        return np.concatenate([points, [points[-1] + 1]]), "context_point"
    return task_context_edges(task_turns.context_len, max_bins), "context_len"


def context_bin(values, edges: np.ndarray) -> np.ndarray:
    return np.clip(np.searchsorted(edges, np.asarray(values, float), side="right") - 1, 0, len(edges) - 2)


def context_curves(steps: pd.DataFrame, turns: pd.DataFrame, seed: int = 0, n_resamples: int = DEFAULT_RESAMPLES,
                   max_bins: int = 6) -> pd.DataFrame:
    """τ and pooled speedup per (task, method, context bin), with the cell's n and trajectory-bootstrap CIs.

    Bins are per task (`turn_binning` over all of that task's decoded turns, every method: quantiles of the
    context, or the context points of a `--context-points` run), so a bin
    never mixes tasks and all methods of a task share its bins. A cell with one trajectory has no interval.
    Extra column `context_median` (the median turn context in the cell) is where figures draw the point."""
    rows = []
    for task in list(dict.fromkeys(turns.task)):
        task_turns = metrics.decoded(turns[turns.task == task])
        if task_turns.empty:
            continue
        edges, column = turn_binning(task_turns, max_bins)
        n_bins = len(edges) - 1
        for method in list(dict.fromkeys(task_turns.method)):
            if method == BASELINE:
                continue
            cell_turns = task_turns[task_turns.method == method].copy()
            cell_turns["bin"] = context_bin(cell_turns[column], edges)
            units = list(dict.fromkeys(trajectory_keys(cell_turns)))
            unit_of = trajectory_keys(cell_turns)
            cell_steps = steps[(steps.method == method) & (steps.task == task)]
            cell_steps = cell_steps[metrics.counted(cell_steps)]
            keyed = cell_turns.set_index(["run", "sample_id", "turn"]).bin
            step_bin = keyed.reindex(pd.MultiIndex.from_frame(cell_steps[["run", "sample_id", "turn"]])).to_numpy()
            has_bin = ~pd.isna(step_bin)
            cell_steps, step_bin = cell_steps[has_bin], step_bin[has_bin].astype(int)
            tau_units = np.zeros((len(units), n_bins, 2))
            unit_index = {u: i for i, u in enumerate(units)}
            if len(cell_steps):
                u = trajectory_keys(cell_steps).map(unit_index).to_numpy()
                np.add.at(tau_units, (u, step_bin, 0), metrics.step_tokens(cell_steps.num_accepted).to_numpy(float))
                np.add.at(tau_units, (u, step_bin, 1), 1.0)
            pairs = metrics.paired(cell_turns)
            sp_units = np.zeros((len(units), n_bins, 4))
            if len(pairs):
                u = trajectory_keys(pairs).map(unit_index).to_numpy()
                values = pairs[["ar_decode_s", "ar_new_tokens", "decode_s", "new_tokens"]].to_numpy(float)
                for q in range(4):
                    np.add.at(sp_units, (u, pairs.bin.to_numpy(), q), values[:, q])
            tau_point, sp_point = _ratio(tau_units.sum(0)), _speedup_from_sums(sp_units.sum(0))
            tau_low, tau_high = bootstrap_ci(tau_units, _ratio, cell_seed(seed, "ctx-tau", method, task), n_resamples)
            sp_low, sp_high = bootstrap_ci(sp_units, _speedup_from_sums, cell_seed(seed, "ctx-sp", method, task),
                                           n_resamples)
            for b in range(n_bins):
                in_bin = cell_turns.bin.to_numpy() == b
                if not in_bin.any():
                    continue
                n_traj = int(unit_of[in_bin].nunique())
                interval = interval_allowed(int(in_bin.sum()), n_traj)
                rows.append({
                    "task": task, "method": method, "context_lo": int(edges[b]), "context_hi": int(edges[b + 1]) - 1,
                    "n_trajectories": n_traj, "n_turns": int(in_bin.sum()), "n_steps": int(tau_units[:, b, 1].sum()),
                    "tau": float(tau_point[b]),
                    "tau_lo": float(tau_low[b]) if interval else np.nan,
                    "tau_hi": float(tau_high[b]) if interval else np.nan,
                    "speedup": float(sp_point[b]),
                    "speedup_lo": float(sp_low[b]) if interval else np.nan,
                    "speedup_hi": float(sp_high[b]) if interval else np.nan,
                    "context_median": float(np.median(cell_turns.context_len[in_bin])),
                })
    return pd.DataFrame(rows, columns=CONTEXT_CURVE_COLUMNS + ["context_median"])


COST_CURVE_COLUMNS = ["task", "method", "step_context_lo", "step_context_hi", "n_steps", "ar_decode_ms", "verify_ms",
                      "draft_ms", "draft_state_bytes"]
COST_CONTEXT_CONVENTION = ("step context = the target's KV length when a verify step starts; the cost bins are "
                           "quantile bins of each task's step contexts (every method's steps), labelled by their own "
                           "edges, and each step falls in the bin of its own context; they are not the turn-context "
                           "bins of the τ and speedup table, whose break-even τ* uses the costs of that table's own "
                           "turns")


def cost_curves(steps: pd.DataFrame, turns: pd.DataFrame, max_bins: int = 6) -> pd.DataFrame:
    """Per (task, method, step-context bin of the task): mean ms per verify step of the target (`verify_ms`) and of
    the drafter (`draft_ms`), mean draft-state bytes, and the target's one-token decode ms (`ar_decode_ms`: the `ar`
    method's steps in the same bin). The bins are the task's own step-context quantile bins (COST_CONTEXT_CONVENTION)
    and carry their own edges (`step_context_lo/hi`); `context_median` (where figures draw the bin) is the median
    context of all the task's steps in the bin, the same for every method."""
    rows = []
    for task in list(dict.fromkeys(turns.task)):
        decoded_turns = metrics.decoded(turns[turns.task == task])
        task_steps = steps[steps.task == task]
        if decoded_turns.empty or task_steps.empty:
            continue
        edges = task_context_edges(task_steps.context_len, max_bins)
        bins = context_bin(task_steps.context_len, edges)
        frame = task_steps.assign(bin=bins)
        ar = frame[frame.method == BASELINE].groupby("bin").verify_s.mean()
        where = frame.groupby("bin").context_len.median()  # one x per bin, shared by every method
        for method in list(dict.fromkeys(frame.method)):
            for b, cell in frame[frame.method == method].groupby("bin"):
                rows.append({"task": task, "method": method, "step_context_lo": int(edges[b]),
                             "step_context_hi": int(edges[b + 1]) - 1, "n_steps": len(cell),
                             "ar_decode_ms": 1e3 * float(ar.get(b, np.nan)),
                             "verify_ms": 1e3 * float(cell.verify_s.mean()),
                             "draft_ms": 1e3 * float(cell.draft_s.mean()),
                             "draft_state_bytes": float(cell.draft_state_bytes.mean()),
                             "context_median": float(where[b])})
    return pd.DataFrame(rows, columns=COST_CURVE_COLUMNS + ["context_median"])
