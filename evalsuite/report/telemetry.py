"""The DLite paper's telemetry table on the user's data: per task × method, peak drafter memory,
τ, acceptance at positions 1/3/5, TTFT, inter-token latency P50/P95, end-to-end turn latency and speedup.

Timeline of one turn as the engine records it (evalsuite/engines/loop.py): the target prefills the context's new tokens
and its logits give the first output token; the drafter's start-of-turn work follows (`draft_prefill_s`); then
verify steps, each emitting `emitted` tokens in `step_s`. So a turn of n new tokens has n − 1 tokens from its steps
(Σ emitted = new_tokens − 1) and decode_s = draft_prefill_s + Σ step_s (+ a few µs).

Conventions (TELEMETRY_CONVENTIONS, printed under the table):
- The target prefill is shared: all methods of a turn reuse one prefill of the context's new tokens (the engine's
  prefix cache), which the method that ran first in the turn's shuffled order pays; the others record ~0.5 ms.
  Each method is charged the turn's *shared* prefill: the prefill_s of the turn's row that prefilled the most
  tokens (NaN where no row of the turn in these tables did: e.g. a filter removed it). It is incremental (only
  the tokens the cache did not hold), as a serving engine with prefix caching would pay.
- TTFT = shared prefill + the method's start-of-turn drafter work; mean over decoded turns.
- ITL (amortized, default): a step of step_s that emits e tokens gives e inter-token intervals of step_s / e each;
  P50/P95 are token-weighted percentiles over all emitted tokens of the cell. The alternative ("burst": the e
  tokens arrive together, one interval of step_s and e − 1 of 0, what a streaming client sees) is available as
  `itl_convention="burst"`; its P50 is 0 for any method with τ > 2, so it is not the table's default.
- Turn latency = shared prefill + decode_s (which includes the drafter's start-of-turn work); mean over decoded
  turns, so TTFT + Σ ITL ≈ turn latency per turn.
- aux memory = the largest draft_state_bytes of any step (drafter history + working state), 0 for `ar`.
- τ and speedup as in the report (conventions.TAU, conventions.SPEEDUP); acc_pos j = the marginal
  P(positions 1..j all accepted) over every step with budget room for j drafts (conventions.POSITION).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from evalsuite import metrics
from evalsuite.conventions import BASELINE
from evalsuite.report import positions, stats

TELEMETRY_COLUMNS = ["task", "method", "aux_memory_bytes", "tau", "acc_pos1", "acc_pos3", "acc_pos5", "ttft_ms",
                     "itl_p50_ms", "itl_p95_ms", "turn_latency_ms", "speedup"]
TELEMETRY_EXTRA_COLUMNS = ["n_trajectories", "n_turns", "n_tokens", "prefill_ms", "draft_prefill_ms",
                           "itl_mean_ms", "turn_new_tokens"]
ITL_CONVENTIONS = ("amortized", "burst")

TELEMETRY_CONVENTIONS = [
    "aux_memory_bytes = the largest drafter state (draft_state_bytes: history + working memory) over all of the "
    "cell's steps; 0 for `ar`",
    "acc_pos j = marginal acceptance P(draft positions 1..j all accepted) over every verify step whose token budget "
    "left room for j drafts (a drafter that proposed fewer than j counts as not accepted; not conditioned on "
    "drafting ≥ j), as in the per-position table",
    "TTFT = the turn's shared target prefill + the method's start-of-turn drafter work (draft_prefill_s), mean over "
    "decoded turns; the prefill is incremental (prefix cache) and shared by all methods of a turn, so every method "
    "is charged the prefill_s of the turn's row that prefilled the most tokens, whichever method ran first",
    "ITL = inter-token latency per emitted token after the first: a verify step of step_s that emits e tokens "
    "counts as e intervals of step_s / e (amortized); P50/P95 over all of the cell's emitted tokens (token-weighted)",
    "turn latency = shared target prefill + decode (decode includes the drafter's start-of-turn work), end to end "
    "per turn, mean over decoded turns",
    "τ and speedup as defined under Table 1 (speedup: paired with `ar` on the same turns, decode only)",
]


def shared_prefill(turns: pd.DataFrame) -> pd.Series:
    """Per (run, task, sample_id, turn): the prefill_s of the row that prefilled the most tokens (NaN when no row
    prefilled any: the shared prefill was recorded on a row these tables do not hold)."""
    keys = ["run", "task", "sample_id", "turn"]
    done = metrics.decoded(turns)
    if done.empty:
        return pd.Series(dtype=float)
    top = done.sort_values("prefill_tokens", ascending=False, kind="stable").drop_duplicates(keys)
    values = top.prefill_s.where(top.prefill_tokens > 0)
    return pd.Series(values.to_numpy(float), index=pd.MultiIndex.from_frame(top[keys]))


def itl_values(steps: pd.DataFrame, convention: str = "amortized") -> tuple[np.ndarray, np.ndarray]:
    """(interval seconds, weight in tokens) over the steps: one entry per step, weight e = emitted.

    amortized: each of a step's e tokens waited step_s / e (value step_s / e, weight e);
    burst: the step's first token waited step_s and the other e − 1 waited 0 (two entries per step)."""
    if convention not in ITL_CONVENTIONS:
        raise ValueError(f"itl convention {convention!r}: use one of {', '.join(ITL_CONVENTIONS)}")
    emitted = steps.emitted.to_numpy(float)
    seconds = steps.step_s.to_numpy(float)
    keep = emitted > 0
    emitted, seconds = emitted[keep], seconds[keep]
    if convention == "amortized":
        return seconds / emitted, emitted
    values = np.concatenate([seconds, np.zeros(len(seconds))])
    weights = np.concatenate([np.ones(len(seconds)), emitted - 1])
    return values, weights


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The q-th percentile (0..100) of values repeated `weights` times (integer weights), numpy's linear rule."""
    values, weights = np.asarray(values, float), np.asarray(weights, float)
    keep = weights > 0
    if not keep.any():
        return float("nan")
    order = np.argsort(values[keep], kind="stable")
    return float(_sorted_percentiles(values[keep][order], np.cumsum(weights[keep][order]), [q])[0])


def _sorted_percentiles(sorted_values: np.ndarray, cumulative: np.ndarray, qs) -> np.ndarray:
    """Percentiles (0..100) of sorted values repeated by integer weights whose running sum is `cumulative`: the
    value at 0-based position h = (N − 1)·q/100 of the repeated array, linear between neighbours (numpy's rule
    applied to the repeated values, without repeating them)."""
    total = cumulative[-1] if len(cumulative) else 0
    if total <= 0:
        return np.full(len(qs), np.nan)
    h = (total - 1) * np.asarray(qs, float) / 100.0
    low = np.floor(h)
    at = lambda i: sorted_values[np.minimum(np.searchsorted(cumulative, i, side="right"), len(sorted_values) - 1)]
    return at(low) + (h - low) * (at(np.minimum(low + 1, total - 1)) - at(low))


def percentile_ci(values: np.ndarray, weights: np.ndarray, units: np.ndarray, qs, seed: int,
                  n_resamples: int = stats.DEFAULT_RESAMPLES, level: float = 0.95):
    """Token-weighted percentiles `qs` of `values` and their cluster-bootstrap 95 % intervals: the units (e.g.
    trajectories) are resampled with replacement and each value's weight is multiplied by how often its unit was
    drawn. Returns (point, low, high), arrays over qs; NaN intervals below stats.MIN_INTERVAL_TRAJECTORIES units."""
    values, weights = np.asarray(values, float), np.asarray(weights, float)
    keep = weights > 0
    values, weights, units = values[keep], weights[keep], np.asarray(units)[keep]
    nan = np.full(len(qs), np.nan)
    if not len(values):
        return nan, nan, nan
    order = np.argsort(values, kind="stable")
    values, weights, units = values[order], weights[order], units[order]
    point = _sorted_percentiles(values, np.cumsum(weights), qs)
    names, codes = np.unique(units, return_inverse=True)
    if len(names) < stats.MIN_INTERVAL_TRAJECTORIES:
        return point, nan, nan
    rng = np.random.default_rng(seed)
    draws = rng.multinomial(len(names), np.full(len(names), 1.0 / len(names)), size=n_resamples)
    samples = np.array([_sorted_percentiles(values, np.cumsum(weights * draw[codes]), qs) for draw in draws])
    tail = (1.0 - level) / 2.0
    low, high = np.nanquantile(samples, [tail, 1.0 - tail], axis=0)
    return point, low, high


def telemetry(steps: pd.DataFrame, turns: pd.DataFrame, limits: dict | None = None,
              itl_convention: str = "amortized") -> pd.DataFrame:
    """Per (task, method), `ar` included (columns TELEMETRY_COLUMNS, then TELEMETRY_EXTRA_COLUMNS). `limits` is
    `positions.run_limits(results.runs)`, for the budget room behind acc_pos (without it: from the data)."""
    prefill = shared_prefill(turns)
    keys = ["run", "task", "sample_id", "turn"]
    rows = []
    for (task, method), cell_turns in turns.groupby(["task", "method"], sort=False):
        done = metrics.decoded(cell_turns)
        cell_steps = steps[(steps.task == task) & (steps.method == method)]
        turn_prefill = prefill.reindex(pd.MultiIndex.from_frame(done[keys])).to_numpy(float) if len(done) else \
            np.zeros(0)
        ttft = turn_prefill + done.draft_prefill_s.to_numpy(float)
        latency = turn_prefill + done.decode_s.to_numpy(float)
        values, weights = itl_values(cell_steps, itl_convention)
        drafting = method != BASELINE
        accept = positions.acceptance_at(cell_steps, cell_turns, (1, 3, 5), limits) if drafting else \
            {1: np.nan, 3: np.nan, 5: np.nan}
        rows.append({
            "task": task, "method": method,
            "aux_memory_bytes": int(cell_steps.draft_state_bytes.max()) if drafting and len(cell_steps) else 0,
            "tau": metrics.tau(cell_steps), "acc_pos1": accept[1], "acc_pos3": accept[3], "acc_pos5": accept[5],
            "ttft_ms": _mean_ms(ttft), "itl_p50_ms": 1e3 * weighted_percentile(values, weights, 50),
            "itl_p95_ms": 1e3 * weighted_percentile(values, weights, 95), "turn_latency_ms": _mean_ms(latency),
            "speedup": metrics.speedup(cell_turns) if drafting else 1.0,
            "n_trajectories": int(stats.trajectory_keys(done).nunique()) if len(done) else 0,
            "n_turns": len(done), "n_tokens": int(done.new_tokens.sum()),
            "prefill_ms": _mean_ms(turn_prefill), "draft_prefill_ms": _mean_ms(done.draft_prefill_s.to_numpy(float)),
            "itl_mean_ms": 1e3 * float(np.average(values, weights=weights)) if weights.sum() > 0 else np.nan,
            "turn_new_tokens": float(done.new_tokens.mean()) if len(done) else np.nan,
        })
    table = pd.DataFrame(rows, columns=TELEMETRY_COLUMNS + TELEMETRY_EXTRA_COLUMNS)
    order = {task: i for i, task in enumerate(dict.fromkeys(turns.task))}
    return table.sort_values(["task", "method"], key=lambda c: c.map(order) if c.name == "task" else
                             c.map(lambda m: f"{int(m == BASELINE)}{m}"), kind="stable", ignore_index=True)


def _mean_ms(seconds: np.ndarray) -> float:
    seconds = np.asarray(seconds, float)
    if not len(seconds) or np.isnan(seconds).any():  # a turn whose shared prefill is unknown: no honest mean
        return float("nan")
    return 1e3 * float(seconds.mean())


# ---- end to end beside decode-only ---------------------------------------------------------------------------------
E2E_COLUMNS = ["task", "method", "n_trajectories", "n_turns", "ttft_speedup", "ttft_speedup_lo", "ttft_speedup_hi",
               "decode_speedup", "decode_speedup_lo", "decode_speedup_hi", "latency_speedup", "latency_speedup_lo",
               "latency_speedup_hi", "ttft_ms", "turn_latency_ms", "itl_p50_ms", "itl_p50_lo", "itl_p50_hi",
               "itl_p95_ms", "itl_p95_lo", "itl_p95_hi", "itl_p99_ms", "itl_p99_lo", "itl_p99_hi"]
E2E_CONVENTION = (
    "end to end beside decode-only, over the turns paired with `ar` (the same turn decoded by both): TTFT speedup = "
    "Σ `ar` TTFT / Σ the method's TTFT (TTFT = the turn's shared target prefill + the method's start-of-turn "
    "drafter work; `ar` has none); decode speedup = the report's speedup (decode only, per token); turn-latency "
    "speedup = (Σ `ar` (prefill + decode) / Σ `ar` tokens) / (Σ (prefill + decode) / Σ tokens), the end-to-end "
    "speedup a user waiting for the whole reply sees; ITL P50/P95/P99 = token-weighted percentiles of the amortized "
    "inter-token interval (a step of step_s emitting e tokens gives e intervals of step_s / e); every interval a "
    "95 % cluster bootstrap over trajectories (none below 3)")
E2E_TURN_COLUMNS = ["task", "method", "run", "sample_id", "turn", "context_len", "prefill_s", "ttft_s", "ar_ttft_s",
                    "decode_s", "ar_decode_s", "latency_s", "ar_latency_s", "new_tokens", "ar_new_tokens",
                    "ttft_speedup", "decode_speedup", "latency_speedup"]


def end_to_end_turns(turns: pd.DataFrame) -> pd.DataFrame:
    """One row per paired turn of a drafting method (and `ar` itself, paired with its own stored AR values):
    TTFT, decode and turn latency of the method and of `ar`, and the three per-turn speedups (E2E_CONVENTION)."""
    keys = ["run", "task", "sample_id", "turn"]
    pairs = metrics.paired(turns)
    if pairs.empty:
        return pd.DataFrame(columns=E2E_TURN_COLUMNS)
    prefill = shared_prefill(turns).reindex(pd.MultiIndex.from_frame(pairs[keys])).to_numpy(float)
    out = pairs[["task", "method", "run", "sample_id", "turn", "context_len"]].copy()
    draft = pairs.draft_prefill_s.fillna(0.0).to_numpy(float)
    out["prefill_s"] = prefill
    out["ttft_s"] = prefill + draft
    out["ar_ttft_s"] = prefill
    out["decode_s"] = pairs.decode_s.to_numpy(float)
    out["ar_decode_s"] = pairs.ar_decode_s.to_numpy(float)
    out["latency_s"] = prefill + out.decode_s
    out["ar_latency_s"] = prefill + out.ar_decode_s
    out["new_tokens"] = pairs.new_tokens.to_numpy(float)
    out["ar_new_tokens"] = pairs.ar_new_tokens.to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["ttft_speedup"] = out.ar_ttft_s / out.ttft_s
    out["decode_speedup"] = metrics.speedup_ratio(out.ar_decode_s, out.ar_new_tokens, out.decode_s, out.new_tokens)
    out["latency_speedup"] = metrics.speedup_ratio(out.ar_latency_s, out.ar_new_tokens, out.latency_s,
                                                   out.new_tokens)
    return out[E2E_TURN_COLUMNS].reset_index(drop=True)


def _e2e_from_sums(sums: np.ndarray) -> np.ndarray:
    """sums[..., :] = (ar ttft, ttft, ar decode, ar tokens, decode, tokens, ar latency, latency) → the three
    speedups."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ttft = sums[..., 0] / sums[..., 1]
    decode = metrics.speedup_ratio(sums[..., 2], sums[..., 3], sums[..., 4], sums[..., 5])
    latency = metrics.speedup_ratio(sums[..., 6], sums[..., 3], sums[..., 7], sums[..., 5])
    return np.stack([np.asarray(ttft, float), np.asarray(decode, float), np.asarray(latency, float)], axis=-1)


def end_to_end(steps: pd.DataFrame, turns: pd.DataFrame, seed: int = 0,
               n_resamples: int = stats.DEFAULT_RESAMPLES) -> pd.DataFrame:
    """Per (task, method), `ar` included: TTFT, decode and turn-latency speedups over the paired turns and the
    ITL P50/P95/P99, each with its trajectory-bootstrap interval (E2E_COLUMNS, E2E_CONVENTION)."""
    per_turn = end_to_end_turns(turns)
    rows = []
    for (task, method), cell in per_turn.groupby(["task", "method"], sort=False):
        cell = cell[np.isfinite(cell.prefill_s)]
        unit = stats.trajectory_keys(cell)
        columns = ["ar_ttft_s", "ttft_s", "ar_decode_s", "ar_new_tokens", "decode_s", "new_tokens", "ar_latency_s",
                   "latency_s"]
        sums = cell[columns].astype(float).groupby(unit).sum()
        point = _e2e_from_sums(sums.to_numpy().sum(axis=0)) if len(sums) else np.full(3, np.nan)
        low = high = np.full(3, np.nan)
        if len(sums) >= stats.MIN_INTERVAL_TRAJECTORIES and method != BASELINE:
            low, high = stats.bootstrap_ci(sums.to_numpy(), _e2e_from_sums,
                                           stats.cell_seed(seed, "e2e", method, task), n_resamples)
        if method == BASELINE:
            point = np.ones(3)
        own = steps[(steps.task == task) & (steps.method == method)]
        values, weights = itl_values(own)
        units = stats.trajectory_keys(own[own.emitted > 0]).to_numpy() if len(own) else np.zeros(0)
        itl, itl_lo, itl_hi = percentile_ci(values, weights, units, (50, 95, 99),
                                            stats.cell_seed(seed, "itl", method, task), n_resamples)
        rows.append({"task": task, "method": method, "n_trajectories": int(len(sums)), "n_turns": int(len(cell)),
                     "ttft_speedup": point[0], "ttft_speedup_lo": low[0], "ttft_speedup_hi": high[0],
                     "decode_speedup": point[1], "decode_speedup_lo": low[1], "decode_speedup_hi": high[1],
                     "latency_speedup": point[2], "latency_speedup_lo": low[2], "latency_speedup_hi": high[2],
                     "ttft_ms": 1e3 * float(cell.ttft_s.mean()) if len(cell) else np.nan,
                     "turn_latency_ms": 1e3 * float(cell.latency_s.mean()) if len(cell) else np.nan,
                     **{f"itl_p{q}{suffix}": 1e3 * float(v[i]) for i, q in enumerate((50, 95, 99))
                        for suffix, v in (("_ms", itl), ("_lo", itl_lo), ("_hi", itl_hi))}})
    table = pd.DataFrame(rows, columns=E2E_COLUMNS)
    order = {task: i for i, task in enumerate(dict.fromkeys(turns.task))}
    return table.sort_values(["task", "method"], key=lambda c: c.map(order) if c.name == "task" else
                             c.map(lambda m: f"{int(m == BASELINE)}{m}"), kind="stable", ignore_index=True)
