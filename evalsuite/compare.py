"""`evalsuite compare RUN_A RUN_B`: the same turns decoded by two engines (typically hf and vllm), side by side.

Per (method, sample, turn) both runs decoded: whether the output ids are equal, the first divergence, τ and
the paired speedup on each engine, and whether each engine's method output equals its own `ar` output
(losslessness at T=0). At a divergence the reference target (our HF engine, one forward over the context
and the common prefix) gives the top-2 logit margin at that position: below `near_tie` it is a near-tie,
a numerics difference between kernels rather than a bug.

The frames are pure functions of the stored tables (read with `store.read_run`, measured with `metrics`); only
`divergence_margins` loads the target.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from evalsuite import metrics
from evalsuite.conventions import SKIPPED, SPEEDUP, TAU
from evalsuite.errors import UserError
from evalsuite.store.run_store import RunTables, read_run

KEYS = ["method", "sample_id", "turn"]
NEAR_TIE = 0.1  # logits: a top-2 margin below this at T=0 is a near-tie


def first_divergence(a, b) -> int | None:
    """Index of the first differing token (a shorter sequence ends: its length), None when equal."""
    a, b = list(a), list(b)
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_turns(turns_a: pd.DataFrame, turns_b: pd.DataFrame, label_a: str = "a", label_b: str = "b") -> pd.DataFrame:
    """One row per turn both runs decoded, columns suffixed by the engine labels."""
    frames = []
    for turns, label in ((turns_a, label_a), (turns_b, label_b)):
        t = turns.copy().rename(columns={"speedup_turn": "speedup"})
        t["equal_to_ar"] = metrics.same_as_baseline(t)
        t = t[KEYS + ["output_ids", "tau", "speedup", "new_tokens", "stop_reason", "equal_to_ar", "replay"]]
        frames.append(t.rename(columns={c: f"{c}_{label}" for c in t.columns if c not in KEYS}))
    both = frames[0].merge(frames[1], on=KEYS, how="inner")
    both = both[(both[f"stop_reason_{label_a}"] != SKIPPED) & (both[f"stop_reason_{label_b}"] != SKIPPED)]
    divergence = [first_divergence(x, y) for x, y in zip(both[f"output_ids_{label_a}"], both[f"output_ids_{label_b}"])]
    both["equal_ids"] = [d is None for d in divergence]
    both["first_divergence"] = pd.array(divergence, dtype="Int64")
    # in free replay a turn after a diverged one sees a different history on each engine
    diverged_before, flags = set(), []
    for r in both.sort_values(KEYS).itertuples():
        key = (r.method, r.sample_id)
        flags.append((r.Index, key in diverged_before and getattr(r, f"replay_{label_a}") == "free"))
        if not r.equal_ids:
            diverged_before.add(key)
    both["history_differs"] = pd.Series(dict(flags))
    return both.sort_values(KEYS).reset_index(drop=True)


def engines_side_by_side(run_a: RunTables, run_b: RunTables, label_a: str, label_b: str) -> pd.DataFrame:
    """Per method, over the turns both engines decoded: equal turns, and τ (pooled over verify steps, bonus
    included) and speedup (paired within each engine, pooled over turns) on each engine, as columns."""
    both = compare_turns(run_a.turns, run_b.turns, label_a, label_b)
    rows = []
    for method, g in both.groupby("method", sort=False):
        row = {"method": method, "turns": len(g), "equal ids": f"{int(g.equal_ids.sum())}/{len(g)}"}
        shared = set(zip(g.sample_id, g.turn))
        for label, run in ((label_a, run_a), (label_b, run_b)):
            turns = run.turns[(run.turns.method == method).to_numpy() & _among(run.turns, shared)]
            steps = run.steps[(run.steps.method == method).to_numpy() & _among(run.steps, shared)]
            row[f"tau {label}"] = metrics.tau(steps)
            row[f"speedup {label}"] = metrics.speedup(turns)
        for label in (label_a, label_b):
            row[f"lossless vs ar {label}"] = _share(g[f"equal_to_ar_{label}"])
        rows.append(row)
    columns = ["method", "turns", "equal ids", f"tau {label_a}", f"tau {label_b}", f"speedup {label_a}",
               f"speedup {label_b}", f"lossless vs ar {label_a}", f"lossless vs ar {label_b}"]
    return pd.DataFrame(rows, columns=columns)


def _among(frame: pd.DataFrame, keys: set[tuple[str, int]]):
    return np.array([k in keys for k in zip(frame.sample_id, frame.turn)], dtype=bool)


def _share(flags: pd.Series) -> str:
    known = [bool(f) for f in flags if f is not None and not pd.isna(f)]
    return f"{sum(known)}/{len(known)}" if known else "-"


def run_label(config: dict | None) -> str:
    return (config or {}).get("engine", "hf")


def load_pair(run_a: Path, run_b: Path) -> tuple[RunTables, RunTables, str, str]:
    """Both runs' tables, labelled by engine (and by directory when they share one)."""
    tables = []
    for run in (run_a, run_b):
        if not (Path(run) / "turns.parquet").is_dir():
            raise UserError(f"{run}: not a run directory (no turns.parquet/)")
        tables.append(read_run(run))
    label_a, label_b = run_label(tables[0].config), run_label(tables[1].config)
    if label_a == label_b:
        label_a, label_b = f"{label_a}:{Path(run_a).name}", f"{label_b}:{Path(run_b).name}"
    return tables[0], tables[1], label_a, label_b


def turn_contexts(run_dir: Path, chat, keys: set[tuple[str, str, int]]) -> dict[tuple[str, str, int], list[int]]:
    """The token ids each turn of the (method, sample) pairs in `keys` saw, rebuilt as the runner built them
    (`replay.stored_contexts`: the task's data, the run's replay and context policy, the target's template from
    `chat`, no weights needed, and the run's own stored replies)."""
    from evalsuite.replay import stored_contexts

    tables = read_run(run_dir)
    contexts = stored_contexts(tables.config or {}, tables.turns, chat, {(m, s) for m, s, _ in keys})
    return {key: context.ids for key, context in contexts.items()}


def divergence_margins(both: pd.DataFrame, run_dir: Path, label_ref: str, target_spec: str,
                       near_tie: float = NEAR_TIE) -> pd.DataFrame:
    """Adds `margin` (top-1 minus top-2 logit of the reference target at the first divergence) and `near_tie`."""
    import torch

    from evalsuite.target.model import TargetModel

    both = both.copy()
    both["margin"], both["near_tie"] = float("nan"), pd.array([None] * len(both), dtype="boolean")
    todo = both[~both.equal_ids & ~both.history_differs.astype(bool)]
    if todo.empty:
        return both
    target = TargetModel.load(target_spec, "cpu", None, "row-major")
    contexts = turn_contexts(run_dir, target.chat, set(zip(todo.method, todo.sample_id, todo.turn)))
    for index, r in todo.iterrows():
        context = contexts.get((r.method, r.sample_id, r.turn))
        if context is None:
            continue
        prefix = list(r[f"output_ids_{label_ref}"])[: int(r.first_divergence)]
        with torch.no_grad():
            cache = target.new_cache()
            logits = target.forward(torch.tensor(context + prefix, dtype=torch.long), cache, (), last_only=True).logits
        top = torch.topk(logits[-1].float(), 2).values
        margin = float(top[0] - top[1])
        both.loc[index, "margin"] = margin
        both.loc[index, "near_tie"] = margin < near_tie
    return both


def engines_table(side: pd.DataFrame, label_a: str, label_b: str):
    """The side-by-side frame as a report `Table` (Markdown/LaTeX/HTML/CSV through evalsuite.report.tables)."""
    from evalsuite.report.formatting import Cell, Table

    rows = [[Cell(v, digits=3) if isinstance(v, float) else Cell(v) for v in r] for r in side.itertuples(index=False)]
    notes = [TAU, "speedup is paired within each engine (its own ar) and pooled over the turns both engines decoded: "
             + SPEEDUP,
             "equal ids: turns whose output ids are identical on both engines; lossless vs ar: turns whose method "
             "output equals that engine's own ar output (expected everywhere at T=0)"]
    return Table(name="engines", title=f"Engines side by side: {label_a} vs {label_b}", header=list(side.columns),
                 rows=rows, notes=notes, csv=side)
