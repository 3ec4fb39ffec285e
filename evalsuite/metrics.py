"""The one definition of each measure: τ, break-even τ, speedup, per-position acceptance, and pairing with the
`ar` baseline (which methods are decoded beside which, and how a turn's speedup pairs them).

Used by the runner (each turn's τ and speedup_turn, the methods it decodes), the plan, the Ray progress bar, the
CLI summary, `evalsuite compare`, `evalsuite concurrency`, training's greedy τ and the report, so every consumer
gets the same numbers. The conventions' wording is in `evalsuite.conventions`. Pure numpy/pandas; frames are the
steps/turns tables as the store reads them. `tests/test_one_home.py` fails on a τ or τ* formula written out
anywhere else in the package.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Mapping, TypeVar

import numpy as np
import pandas as pd

from evalsuite.conventions import BASELINE, SKIPPED

R = TypeVar("R")


# ---- primitives ------------------------------------------------------------------------------------------------
def step_tokens(num_accepted):
    """The tokens one verify step yields: its accepted drafts plus the bonus token (the target's own next token).
    τ averages this over the steps it counts. Works on an int, an array or a Series."""
    return num_accepted + 1


def tau_ratio(tokens, steps):
    """τ from its sums: Σ step_tokens / number of steps; arrays broadcast; NaN where there is no step."""
    steps = np.asarray(steps, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = np.where(steps > 0, np.asarray(tokens, float) / steps, np.nan)
    return float(value) if np.ndim(value) == 0 else value


def tau_sums(num_accepted: Iterable[int], budget_limited: Iterable[bool] | None = None) -> tuple[float, int]:
    """(Σ step_tokens, number of steps) over the steps τ counts: not those the token budget (or the window) left
    no room to draft (`budget_limited`; all steps count without it)."""
    accepted = np.asarray(list(num_accepted) if not hasattr(num_accepted, "__len__") else num_accepted, float)
    if budget_limited is None:
        keep = np.ones(len(accepted), bool)
    else:
        keep = ~np.asarray(list(budget_limited) if not hasattr(budget_limited, "__len__") else budget_limited, bool)
    return float(step_tokens(accepted[keep]).sum()), int(keep.sum())


def tau_of(num_accepted: Iterable[int], budget_limited: Iterable[bool] | None = None) -> float:
    """τ of a set of steps: the pooled ratio Σ(accepted + 1) / steps, bonus included; NaN without a counted step."""
    return tau_ratio(*tau_sums(num_accepted, budget_limited))


def tau_break_even(step_cost, decode_cost):
    """Break-even τ (τ*): the τ at which one verify step costs as much as τ one-token decodes of `ar`, so a method
    is faster than `ar` per token exactly when its τ exceeds τ*. `step_cost` is what a step pays (draft + verify of
    the drafted block; or a whole step's time, for τ*_step), `decode_cost` one one-token decode, in one unit;
    arrays broadcast; NaN where the decode cost is 0 or unknown."""
    decode = np.asarray(decode_cost, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = np.where((decode != 0) & ~np.isnan(decode), np.asarray(step_cost, float) / decode, np.nan)
    return float(value) if np.ndim(value) == 0 else value


def speedup_ratio(ar_s, ar_tokens, method_s, method_tokens):
    """(AR seconds / AR tokens) / (method seconds / method tokens); arrays broadcast; NaN where undefined."""
    with np.errstate(divide="ignore", invalid="ignore"):
        value = (np.asarray(ar_s, float) / np.asarray(ar_tokens, float)) / \
                (np.asarray(method_s, float) / np.asarray(method_tokens, float))
    ok = (np.asarray(ar_s, float) > 0) & (np.asarray(ar_tokens, float) > 0) & \
         (np.asarray(method_s, float) > 0) & (np.asarray(method_tokens, float) > 0)
    value = np.where(ok, value, np.nan)
    return float(value) if np.ndim(value) == 0 else value


def with_baseline(methods: Iterable[str]) -> list[str]:
    """The methods to decode for `methods`: `ar` is added (last) when any other method is among them, since each
    is paired with `ar`'s decode of the same turn; the order is kept and nothing is added to an empty list."""
    methods = list(methods)
    if any(m != BASELINE for m in methods) and BASELINE not in methods:
        methods.append(BASELINE)
    return methods


def turn_pairing(baseline: tuple[float, int] | None, decode_s: float, new_tokens: int) -> dict:
    """A turn's pairing with the baseline's decode of the same turn, (its decode seconds, its new tokens), where
    both were decoded (`baseline` None: unpaired): the `ar_decode_s`, `ar_new_tokens` and `speedup_turn` of the
    turn's record."""
    if baseline is None:
        return {"ar_decode_s": 0.0, "ar_new_tokens": 0, "speedup_turn": float("nan")}
    ar_s, ar_tokens = baseline
    return {"ar_decode_s": ar_s, "ar_new_tokens": ar_tokens,
            "speedup_turn": speedup_ratio(ar_s, ar_tokens, decode_s, new_tokens)}


# ---- over the stored tables ------------------------------------------------------------------------------------
def counted(steps: pd.DataFrame) -> pd.Series:
    """The steps τ counts (not `budget_limited`)."""
    if "budget_limited" not in steps.columns:
        return pd.Series(True, index=steps.index)
    return ~steps.budget_limited.fillna(False).astype(bool)


def tau(steps: pd.DataFrame) -> float:
    """τ over the steps of a frame (any grouping): pooled, bonus included."""
    return tau_of(steps.num_accepted.to_numpy(), (~counted(steps)).to_numpy())


def tau_turn_macro(steps: pd.DataFrame) -> float:
    """The per-turn macro average: τ of each (run, method, task, sample, turn), then their unweighted mean."""
    steps = steps[counted(steps)]
    if steps.empty:
        return float("nan")
    keys = [c for c in ("run", "method", "task", "sample_id", "turn") if c in steps.columns]
    return float(step_tokens(steps.num_accepted).groupby([steps[c] for c in keys]).mean().mean())


def decoded(turns: pd.DataFrame) -> pd.DataFrame:
    return turns[turns.stop_reason != SKIPPED]


def paired(turns: pd.DataFrame) -> pd.DataFrame:
    """Decoded turns with a paired AR measurement and tokens and time on both sides."""
    ok = (turns.stop_reason != SKIPPED) & (turns.new_tokens > 0) & (turns.ar_new_tokens > 0) & \
         (turns.decode_s > 0) & (turns.ar_decode_s > 0)
    return turns[ok]


SPEEDUP_COLUMNS = ["ar_decode_s", "ar_new_tokens", "decode_s", "new_tokens"]


def speedup(turns: pd.DataFrame) -> float:
    """Pooled over the paired turns: (Σ AR s / Σ AR tokens) / (Σ method s / Σ method tokens)."""
    pairs = paired(turns)
    if pairs.empty:
        return float("nan")
    return speedup_ratio(*(pairs[c].sum() for c in SPEEDUP_COLUMNS))


def per_turn(steps: pd.DataFrame, turns: pd.DataFrame) -> pd.DataFrame:
    """One row per decoded turn with its τ (from its steps) and its paired speedup (`speedup_turn` recomputed from
    the stored seconds and tokens, so older runs read the same)."""
    done = decoded(turns).copy()
    keys = [k for k in ("run", "method", "task", "sample_id", "turn") if k in done.columns and k in steps.columns]
    counted_steps = steps[counted(steps)]
    grouped = step_tokens(counted_steps.num_accepted).groupby([counted_steps[k] for k in keys]).agg(["sum", "count"])
    done = done.drop(columns=[c for c in ("tau", "steps") if c in done.columns]).join(grouped, on=keys)
    done["tau"] = done["sum"] / done["count"]
    done["steps"] = done["count"].fillna(0).astype(int)
    done["speedup_turn"] = speedup_ratio(*(done[c].to_numpy(float) for c in SPEEDUP_COLUMNS)) if len(done) else []
    return done.drop(columns=["sum", "count"])


TURN_KEYS = ["run", "method", "task", "sample_id", "turn"]


def draft_room(steps: pd.DataFrame, turns: pd.DataFrame | None = None,
               limits: Mapping[str, Mapping] | None = None) -> pd.Series:
    """The draft length the engine offered at each step (aligned with `steps`), as the decode loop computes it:
    room = min(K, token_limit - tokens produced before the step - 1), 0 for `budget_limited` steps.

    tokens produced before the step = the step's context_len - its turn's context_len + 1 (the KV holds the
    context and every output token but the newest); token_limit = the turn's new_tokens where it stopped at its
    budget (`max_new_tokens`, `context_limit`), else min(max_new_tokens, max_context - context) from `limits`
    ({run: {"k", "max_new_tokens", "max_context"}}, run.json's k, max_new_tokens and target_max_context), else
    unbounded. K = the run's `k` from `limits`, else the largest draft the method made in that run. Without
    `turns` only K and `budget_limited` bound the room."""
    if steps.empty:
        return pd.Series(np.zeros(0), index=steps.index, dtype=float)
    limits = limits or {}
    run = steps.run if "run" in steps.columns else pd.Series("", index=steps.index)
    method = steps.method if "method" in steps.columns else pd.Series("", index=steps.index)
    largest = steps.num_drafted.groupby([run, method]).transform("max").astype(float)
    k = run.map(lambda r: (limits.get(r) or {}).get("k")).astype(float).fillna(largest)
    token_limit = pd.Series(np.inf, index=steps.index)
    keys = [c for c in TURN_KEYS if c in steps.columns]
    if turns is not None and len(turns) and keys and all(c in turns.columns for c in keys):
        index = pd.MultiIndex.from_frame(steps[keys])
        keyed = turns.drop_duplicates(keys).set_index(keys)
        turn_context = keyed.context_len.reindex(index).to_numpy(float)
        at_budget = np.isin(keyed.stop_reason.reindex(index).to_numpy(object), ["max_new_tokens", "context_limit"])
        limit = np.where(at_budget, keyed.new_tokens.reindex(index).to_numpy(float), np.inf)
        for key, value in limits.items():  # EOS turns: the budget the loop had, from the run's configuration
            mine = (run == key).to_numpy() & ~at_budget
            if not mine.any() or not value:
                continue
            cap = np.full(mine.sum(), float(value.get("max_new_tokens") or np.inf))
            if value.get("max_context"):
                cap = np.minimum(cap, float(value["max_context"]) - turn_context[mine])
            limit[mine] = cap
        produced = steps.context_len.to_numpy(float) - turn_context + 1
        token_limit = pd.Series(limit - produced, index=steps.index)
    room = np.minimum(k, token_limit - 1).clip(lower=0).fillna(k)
    if "budget_limited" in steps.columns:
        room[steps.budget_limited.fillna(False).astype(bool).to_numpy()] = 0
    return room


def per_position(steps: pd.DataFrame, max_position: int | None = None, room=None) -> pd.DataFrame:
    """One row per draft position j = 1..K with the counts behind both rates, over the steps with room > 0:
    room = steps whose room allowed j drafts (`draft_room`, computed from the steps alone when not given);
    drafted = those that drafted >= j; reached = room >= j and positions 1..j-1 accepted; accepted = room >= j and
    1..j accepted; marginal = accepted / room, conditional = accepted / reached (conventions.POSITION). A drafter
    that proposed fewer than j tokens where it had room counts as not accepted at j."""
    room = draft_room(steps) if room is None else pd.Series(np.asarray(room, float), index=steps.index)
    keep = (room > 0).to_numpy()
    drafted_len = steps.num_drafted.to_numpy()[keep]
    accepted_len = steps.num_accepted.to_numpy()[keep]
    room_len = room.to_numpy(float)[keep]
    k = int(max(drafted_len.max(initial=0), room_len.max(initial=0))) if max_position is None else max_position
    rows = []
    for j in range(1, k + 1):
        has_room = room_len >= j
        n_room = int(has_room.sum())
        reached = int((has_room & (accepted_len >= j - 1)).sum())
        accepted = int((has_room & (accepted_len >= j)).sum())
        rows.append({"position": j, "room": n_room, "drafted": int((drafted_len >= j).sum()), "reached": reached,
                     "accepted": accepted, "conditional": accepted / reached if reached else float("nan"),
                     "marginal": accepted / n_room if n_room else float("nan")})
    return pd.DataFrame(rows, columns=["position", "room", "drafted", "reached", "accepted", "conditional",
                                       "marginal"])


def draft_lengths(steps: pd.DataFrame, room=None) -> dict:
    """Over the steps with room > 0: mean drafted length per step, acceptance per drafted token (Σ accepted /
    Σ drafted), the share of steps that drafted their full room (a fixed-K drafter: about 1) and their τ."""
    room = draft_room(steps) if room is None else pd.Series(np.asarray(room, float), index=steps.index)
    keep = (room > 0).to_numpy()
    cell, room = steps[keep], room[keep]
    drafted = float(cell.num_drafted.sum())
    return {"n_steps": len(cell), "mean_drafted": float(cell.num_drafted.mean()) if len(cell) else float("nan"),
            "accept_rate_per_drafted_token": float(cell.num_accepted.sum()) / drafted if drafted else float("nan"),
            "share_full_room": float((cell.num_drafted.to_numpy() >= room.to_numpy()).mean()) if len(cell)
            else float("nan"),
            "tau": tau_of(cell.num_accepted.to_numpy())}


def ar_ms_per_token(turns: pd.DataFrame) -> float:
    """The baseline's decode ms per token over a set of turns: from the `ar` method's own turns where it ran,
    else from the paired AR measurements stored with the other methods' turns (each turn once)."""
    ar = decoded(turns[turns.method == BASELINE])
    if not ar.empty and ar.new_tokens.sum() > 0:
        return float(1e3 * ar.decode_s.sum() / ar.new_tokens.sum())
    pairs = paired(turns)
    if pairs.empty:
        return float("nan")
    per_turn_pairs = pairs.drop_duplicates([c for c in ("run", "task", "sample_id", "turn") if c in pairs.columns])
    return float(1e3 * per_turn_pairs.ar_decode_s.sum() / per_turn_pairs.ar_new_tokens.sum())


def same_as_baseline(turns: pd.DataFrame) -> pd.Series:
    """Per decoded turn: do its output ids equal the `ar` output of the same (task, sample, turn)? None where
    there is nothing to compare (no `ar` decode of that turn, the baseline itself, or no stored ids)."""
    keys = ["task", "sample_id", "turn"]  # the baseline may come from another merged run of the same task
    ar = {tuple(r[k] for k in keys): r["output_ids"] for _, r in decoded(turns[turns.method == BASELINE]).iterrows()}
    flags = []
    for _, r in turns.iterrows():
        key = tuple(r[k] for k in keys)
        if r.method == BASELINE or r.stop_reason == SKIPPED or key not in ar or r.output_ids is None or \
                ar[key] is None:
            flags.append(None)
        else:
            flags.append(list(r.output_ids) == list(ar[key]))
    return pd.Series(flags, index=turns.index, dtype="object")


def differs_from_ar(turns: pd.DataFrame, method: str) -> tuple[float, int]:
    """(turns of `method` whose output differs from `ar`'s on the same turn, turns compared). Only at temperature
    0, where a lossless method reproduces `ar` token for token; (NaN, 0) where that does not apply."""
    if method == BASELINE or "output_ids" not in turns.columns or turns.empty:
        return float("nan"), 0
    if "temperature" in turns.columns and not (turns.temperature == 0).all():
        return float("nan"), 0
    ours = turns[(turns.method == method) | (turns.method == BASELINE)]
    flags = same_as_baseline(ours)[ours.method == method]
    known = [bool(f) for f in flags if f is not None]
    if not known:
        return float("nan"), 0
    return float(sum(not f for f in known)), len(known)
