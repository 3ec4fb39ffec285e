"""The measures every table and figure uses, defined once: τ, per-position acceptance, speedup, costs, and the
trajectory bootstrap. All are pure functions of the steps/turns tables (pandas DataFrames as `records` stores them).
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

TAU_CONVENTION = ("τ = token-weighted mean over verify steps of (accepted drafts + 1), bonus included "
                  "(steps that drafted nothing count as 1); τ (turn macro) = the unweighted mean of per-turn τ")
SPEEDUP_CONVENTION = ("speedup = paired AR decode time per token / method decode time per token, each pooled over "
                      "all paired turns (sum of seconds / sum of tokens); decode excludes the target prefill and "
                      "includes the drafter's start-of-turn work")
POSITION_CONVENTION = ("position j: conditional = P(j accepted | positions 1..j-1 accepted), marginal = "
                       "P(positions 1..j all accepted); both count only steps that drafted at least j tokens "
                       "(a position that was not drafted is not a rejection)")
CI_CONVENTION = ("95 % CI: percentile bootstrap resampling whole trajectories (sample ids) with replacement; "
                 "± is half the interval's width")
SKIPPED_CONVENTION = "turns skipped at the context limit are excluded from τ and speedup and counted in `skipped`"

DEFAULT_RESAMPLES = 2000
SKIPPED = "skipped"


# ---- τ ---------------------------------------------------------------------------------------------------------
def tau(steps: pd.DataFrame) -> float:
    """Token-weighted τ: sum over steps of (accepted + 1) divided by the number of steps."""
    if steps.empty:
        return float("nan")
    return float((steps.num_accepted + 1).sum() / len(steps))


def tau_turn_macro(steps: pd.DataFrame) -> float:
    """The per-turn macro average: τ of each (run, sample, turn), then their unweighted mean."""
    if steps.empty:
        return float("nan")
    keys = [c for c in ("run", "method", "task", "sample_id", "turn") if c in steps.columns]
    per_turn = (steps.num_accepted + 1).groupby([steps[c] for c in keys]).mean()
    return float(per_turn.mean())


# ---- speedup ---------------------------------------------------------------------------------------------------
def decoded(turns: pd.DataFrame) -> pd.DataFrame:
    return turns[turns.stop_reason != SKIPPED]


def paired(turns: pd.DataFrame) -> pd.DataFrame:
    """Decoded turns that have a paired AR measurement and produced tokens on both sides."""
    ok = (turns.stop_reason != SKIPPED) & (turns.new_tokens > 0) & (turns.ar_new_tokens > 0) & \
         (turns.decode_s > 0) & (turns.ar_decode_s > 0)
    return turns[ok]


def speedup(turns: pd.DataFrame) -> float:
    pairs = paired(turns)
    if pairs.empty:
        return float("nan")
    return float(_speedup_from_sums(np.array([pairs.ar_decode_s.sum(), pairs.ar_new_tokens.sum(),
                                              pairs.decode_s.sum(), pairs.new_tokens.sum()], dtype=float)))


def _speedup_from_sums(sums: np.ndarray) -> np.ndarray:
    """sums[..., :] = (AR seconds, AR tokens, method seconds, method tokens)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return (sums[..., 0] / sums[..., 1]) / (sums[..., 2] / sums[..., 3])


def _ratio(sums: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return sums[..., 0] / sums[..., 1]


# ---- per-position acceptance -----------------------------------------------------------------------------------
def per_position(steps: pd.DataFrame, max_position: int | None = None) -> pd.DataFrame:
    """One row per draft position j = 1..K with the counts behind both rates.

    drafted  = steps that drafted >= j tokens
    reached  = those that also accepted positions 1..j-1
    accepted = those that also accepted position j
    conditional = accepted / reached, marginal = accepted / drafted."""
    drafted_len = steps.num_drafted.to_numpy()
    accepted_len = steps.num_accepted.to_numpy()
    k = int(drafted_len.max()) if len(steps) else 0
    k = k if max_position is None else max_position
    rows = []
    for j in range(1, k + 1):
        drafted = int((drafted_len >= j).sum())
        reached = int(((drafted_len >= j) & (accepted_len >= j - 1)).sum())
        accepted = int(((drafted_len >= j) & (accepted_len >= j)).sum())
        rows.append({"position": j, "drafted": drafted, "reached": reached, "accepted": accepted,
                     "conditional": accepted / reached if reached else float("nan"),
                     "marginal": accepted / drafted if drafted else float("nan")})
    return pd.DataFrame(rows, columns=["position", "drafted", "reached", "accepted", "conditional", "marginal"])


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
    if steps.empty:
        return np.zeros((len(units), 2))
    grouped = (steps.num_accepted + 1).groupby(trajectory_keys(steps)).agg(["sum", "count"])
    return grouped.reindex(units, fill_value=0).to_numpy(dtype=float)


def speedup_sums(turns: pd.DataFrame, units: list[str]) -> np.ndarray:
    """[n_units, 4]: per trajectory, over its paired turns: AR seconds, AR tokens, method seconds, method tokens."""
    pairs = paired(turns)
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
                   "paired_turns", "speedup", "speedup_ci_low", "speedup_ci_high"]


def summarize(steps: pd.DataFrame, turns: pd.DataFrame, seed: int = 0,
              n_resamples: int = DEFAULT_RESAMPLES) -> pd.DataFrame:
    """τ and speedup with their CIs, per (method, task); the cells of Tables 1-3."""
    rows = []
    for (method, task), cell_turns in turns.groupby(["method", "task"], sort=False):
        cell_steps = steps[(steps.method == method) & (steps.task == task)]
        units = list(dict.fromkeys(trajectory_keys(cell_turns)))
        done = decoded(cell_turns)
        tau_low, tau_high = tau_ci(cell_steps, units, cell_seed(seed, "tau", method, task), n_resamples)
        sp_low, sp_high = speedup_ci(cell_turns, units, cell_seed(seed, "speedup", method, task), n_resamples)
        rows.append({
            "method": method, "task": task,
            "temperature": float(cell_turns.temperature.iloc[0]) if "temperature" in cell_turns else float("nan"),
            "trajectories": len(units), "turns": len(done), "skipped": int(len(cell_turns) - len(done)),
            "steps": len(cell_steps), "tokens": int(done.new_tokens.sum()),
            "tau": tau(cell_steps), "tau_ci_low": tau_low, "tau_ci_high": tau_high,
            "tau_turn_macro": tau_turn_macro(cell_steps),
            "paired_turns": len(paired(cell_turns)), "speedup": speedup(cell_turns),
            "speedup_ci_low": sp_low, "speedup_ci_high": sp_high,
        })
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


# ---- curves ----------------------------------------------------------------------------------------------------
def tau_curve(steps: pd.DataFrame, key: pd.Series, seed: int, n_resamples: int = DEFAULT_RESAMPLES) -> pd.DataFrame:
    """τ per value of `key` (aligned with `steps`: a turn index, a context bin), with a trajectory-bootstrap CI."""
    if steps.empty:
        return pd.DataFrame(columns=["key", "tau", "low", "high", "steps"])
    units = list(dict.fromkeys(trajectory_keys(steps)))
    keys = sorted(key.unique())
    frame = pd.DataFrame({"unit": trajectory_keys(steps), "key": key.to_numpy(),
                          "value": (steps.num_accepted + 1).to_numpy()})
    sums = frame.pivot_table(index="unit", columns="key", values="value", aggfunc="sum", fill_value=0)
    counts = frame.pivot_table(index="unit", columns="key", values="value", aggfunc="count", fill_value=0)
    sums, counts = sums.reindex(index=units, columns=keys, fill_value=0), counts.reindex(index=units, columns=keys,
                                                                                           fill_value=0)
    per_unit = np.stack([sums.to_numpy(float), counts.to_numpy(float)], axis=-1)  # [units, keys, 2]
    point = _ratio(per_unit.sum(axis=0))
    low, high = bootstrap_ci(per_unit, _ratio, seed, n_resamples)
    return pd.DataFrame({"key": keys, "tau": point, "low": low, "high": high,
                         "steps": counts.sum(axis=0).to_numpy(int)})


def context_bins(context_len: pd.Series, n_bins: int = 8) -> np.ndarray:
    """Log-spaced bin edges covering every context length (one bin when they are all equal)."""
    low, high = float(context_len.min()), float(context_len.max())
    if high <= low:
        return np.array([low, low + 1.0])
    edges = np.unique(np.round(np.geomspace(max(low, 1.0), high + 1.0, n_bins + 1)))
    edges[0], edges[-1] = min(edges[0], low), max(edges[-1], high + 1.0)
    return edges


def bin_index(values: pd.Series, edges: np.ndarray) -> pd.Series:
    index = np.clip(np.searchsorted(edges, values.to_numpy(float), side="right") - 1, 0, len(edges) - 2)
    return pd.Series(index, index=values.index)
