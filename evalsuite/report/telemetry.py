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
    keep = weights > 0
    if not keep.any():
        return float("nan")
    return float(np.percentile(np.repeat(values[keep], weights[keep].astype(int)), q))


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
