"""Degenerate turns: replies whose speed says little about drafting, because the target repeats itself. A
model-free drafter then copies long spans for free (MT-Bench turns where the target repeats its earlier answer
reach τ 7-8 of 8), which looks like a context effect and is not.

A decoded reply is flagged (thresholds and wording in `evalsuite.conventions`) when

- copy: it holds an exact contiguous copy of at least DEGENERATE_COPY_MIN_TOKENS tokens of an earlier reply of the
  same trajectory (the replies the same method produced before it), or
- loop: a pattern of 1..DEGENERATE_LOOP_MAX_PERIOD tokens repeats back to back at least
  DEGENERATE_LOOP_MIN_REPEATS times and the repetition covers at least DEGENERATE_LOOP_MIN_TOKENS tokens.

`flag_reply` is what the runner calls per turn (its result lands in turns.parquet's `degenerate` and
`degenerate_reason`); `flag_turns` computes the same over a stored turns table, for runs written before the column
existed. `drop_flagged` removes a (run, task, sample, turn) from every method when any method's reply there is
flagged, so paired comparisons keep the same turns on both sides. Pure numpy/pandas; no torch.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from evalsuite.conventions import (DEGENERATE_COPY_MIN_TOKENS, DEGENERATE_LOOP_MAX_PERIOD, DEGENERATE_LOOP_MIN_REPEATS,
                                   DEGENERATE_LOOP_MIN_TOKENS, SKIPPED)

FLAG_COLUMNS = ["degenerate", "degenerate_reason"]
TURN_KEYS = ["run", "task", "sample_id", "turn"]


def _as_bytes(tokens) -> bytes:
    return np.asarray(tokens, dtype=np.int64).tobytes()


def _shares_run(a: bytes, b: bytes, length: int) -> bool:
    """Do the token sequences (int64 bytes) share a contiguous run of `length` tokens?"""
    width = 8 * length
    if len(a) < width or len(b) < width:
        return False
    windows = {b[i:i + width] for i in range(0, len(b) - width + 1, 8)}
    return any(a[i:i + width] in windows for i in range(0, len(a) - width + 1, 8))


def longest_common_run(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest contiguous token run shared by `a` and `b` (binary search over the length, each
    probe a set of windows: O((len a + len b) · L · log L) byte work, fast for replies of thousands of tokens)."""
    x, y = _as_bytes(list(a)), _as_bytes(list(b))
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if _shares_run(x, y, middle):
            low = middle
        else:
            high = middle - 1
    return low


def longest_loop(tokens: Sequence[int], max_period: int = DEGENERATE_LOOP_MAX_PERIOD) -> tuple[int, int]:
    """(period, tokens covered) of the longest back-to-back repetition of a pattern of at most `max_period` tokens:
    the longest stretch where token[i] == token[i - p], plus the pattern's first copy. The shortest period wins
    ties, so one token repeated is period 1, not 2."""
    tokens = np.asarray(list(tokens))
    best = (0, 0)
    for p in range(1, min(max_period, len(tokens) // 2) + 1):
        same = tokens[p:] == tokens[:-p]
        if not same.any():
            continue
        edges = np.flatnonzero(np.diff(np.concatenate([[0], same.astype(np.int8), [0]])))
        covered = int((edges[1::2] - edges[::2]).max()) + p
        if covered > best[1]:
            best = (p, covered)
    return best


def flag_reply(tokens: Sequence[int], earlier: Sequence[tuple[int, Sequence[int]]],
               copy_min_tokens: int = DEGENERATE_COPY_MIN_TOKENS, loop_max_period: int = DEGENERATE_LOOP_MAX_PERIOD,
               loop_min_repeats: int = DEGENERATE_LOOP_MIN_REPEATS,
               loop_min_tokens: int = DEGENERATE_LOOP_MIN_TOKENS) -> tuple[bool, str]:
    """(flagged, reason) for one reply against the earlier replies [(turn, tokens), ...] of its trajectory. The
    reason names the evidence: "copies 47 tokens of turn 0's reply"; "loops: a 3-token pattern repeated 9.0×, 27
    tokens"."""
    tokens = list(tokens if tokens is not None else [])
    reasons = []
    copy_tokens, copy_of = 0, -1
    reply = _as_bytes(tokens)
    for turn, previous in earlier:
        previous = list(previous if previous is not None else [])
        if not _shares_run(reply, _as_bytes(previous), max(copy_min_tokens, copy_tokens + 1)):
            continue  # cannot beat the longest copy found so far, nor reach the threshold
        length = longest_common_run(tokens, previous)
        if length > copy_tokens:
            copy_tokens, copy_of = length, int(turn)
    if copy_tokens >= copy_min_tokens:
        reasons.append(f"copies {copy_tokens} tokens of turn {copy_of}'s reply")
    period, covered = longest_loop(tokens, loop_max_period)
    if period and covered >= loop_min_tokens and covered >= loop_min_repeats * period:
        reasons.append(f"loops: a {period}-token pattern repeated {covered / period:.1f}×, {covered} tokens")
    return bool(reasons), "; ".join(reasons)


def flag_turns(turns: pd.DataFrame, **thresholds) -> pd.DataFrame:
    """`turns` with `degenerate` and `degenerate_reason` computed from the stored output ids where they are missing
    (runs written before the runner recorded them); stored flags are kept. Skipped turns are never flagged."""
    turns = turns.copy()
    if "degenerate" not in turns.columns:
        turns["degenerate"] = np.nan
    if "degenerate_reason" not in turns.columns:
        turns["degenerate_reason"] = ""
    turns["degenerate"] = turns.degenerate.astype(object)
    missing = turns.degenerate.isna()
    if missing.any():
        keys = [k for k in ("run", "method", "sample_id") if k in turns.columns]
        for _, trajectory in turns.groupby(keys, sort=False):
            if not missing[trajectory.index].any():
                continue
            earlier = []
            for index, row in trajectory.sort_values("turn").iterrows():
                ids = row.output_ids
                ids = list(ids) if isinstance(ids, (list, tuple, np.ndarray)) else []
                if missing[index]:
                    flagged, reason = (False, "") if row.stop_reason == SKIPPED else \
                        flag_reply(ids, earlier, **thresholds)
                    turns.at[index, "degenerate"] = flagged
                    turns.at[index, "degenerate_reason"] = reason
                if ids:
                    earlier.append((int(row.turn), ids))
    turns["degenerate"] = turns.degenerate.astype(bool)
    turns["degenerate_reason"] = turns.degenerate_reason.fillna("").astype(str)
    return turns


def flagged_keys(turns: pd.DataFrame) -> pd.DataFrame:
    """The (run, task, sample_id, turn) whose reply is flagged for any method."""
    keys = [k for k in TURN_KEYS if k in turns.columns]
    return turns[turns.degenerate.astype(bool)][keys].drop_duplicates()


def drop_flagged(frame: pd.DataFrame, turns: pd.DataFrame) -> pd.DataFrame:
    """`frame` (steps or turns) without the turns flagged for any method in `turns` (every method loses them)."""
    bad = flagged_keys(turns)
    if bad.empty:
        return frame
    keys = list(bad.columns)
    marked = frame[keys].merge(bad.assign(_flagged=True), on=keys, how="left")
    return frame[marked._flagged.isna().to_numpy()]
