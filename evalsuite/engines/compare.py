"""`evalsuite compare RUN_A RUN_B`: the same turns decoded by two engines (typically hf and vllm), side by side.

Per (method, sample, turn) both runs decoded: whether the output ids are equal, the first divergence, τ and
the paired speedup on each engine, and whether each engine's method output equals its own `ar` output
(losslessness at T=0). At a divergence the reference target (our HF engine, one forward over the context
and the common prefix) gives the top-2 logit margin at that position: below `near_tie` it is a near-tie,
a numerics difference between kernels rather than a bug.

The frames are pure functions of the stored tables; only `divergence_margins` loads the target.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from evalsuite.errors import UserError
from evalsuite.records import load_turns

KEYS = ["method", "sample_id", "turn"]
NEAR_TIE = 0.1  # logits: a top-2 margin below this at T=0 is a near-tie


def first_divergence(a, b) -> int | None:
    """Index of the first differing token (a shorter sequence ends: its length), None when equal."""
    a, b = list(a), list(b)
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _lossless_vs_ar(turns: pd.DataFrame) -> pd.Series:
    ar = {(r.sample_id, r.turn): list(r.output_ids) for r in turns[turns.method == "ar"].itertuples()}
    return pd.Series([None if (r.sample_id, r.turn) not in ar or r.stop_reason == "skipped"
                      else list(r.output_ids) == ar[(r.sample_id, r.turn)] for r in turns.itertuples()],
                     index=turns.index, dtype="object")


def compare_turns(turns_a: pd.DataFrame, turns_b: pd.DataFrame, label_a: str = "a", label_b: str = "b") -> pd.DataFrame:
    """One row per turn both runs decoded, columns suffixed by the engine labels."""
    frames = []
    for turns, label in ((turns_a, label_a), (turns_b, label_b)):
        t = turns.copy().rename(columns={"speedup_turn": "speedup"})  # the per-turn column (runs before 13.6: speedup)
        t["equal_to_ar"] = _lossless_vs_ar(t)
        t = t[KEYS + ["output_ids", "tau", "speedup", "new_tokens", "stop_reason", "equal_to_ar", "replay"]]
        frames.append(t.rename(columns={c: f"{c}_{label}" for c in t.columns if c not in KEYS}))
    both = frames[0].merge(frames[1], on=KEYS, how="inner")
    both = both[(both[f"stop_reason_{label_a}"] != "skipped") & (both[f"stop_reason_{label_b}"] != "skipped")]
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


def engines_side_by_side(turns_a: pd.DataFrame, turns_b: pd.DataFrame, label_a: str, label_b: str) -> pd.DataFrame:
    """Per method: equal turns, τ (mean over turns, bonus included) and paired speedup (mean over turns) on
    each engine, as columns (for the report)."""
    both = compare_turns(turns_a, turns_b, label_a, label_b)
    rows = []
    for method, g in both.groupby("method", sort=False):
        rows.append({"method": method, "turns": len(g), "equal ids": f"{int(g.equal_ids.sum())}/{len(g)}",
                     f"tau {label_a}": g[f"tau_{label_a}"].mean(), f"tau {label_b}": g[f"tau_{label_b}"].mean(),
                     f"speedup {label_a}": g[f"speedup_{label_a}"].mean(),
                     f"speedup {label_b}": g[f"speedup_{label_b}"].mean(),
                     f"lossless vs ar {label_a}": _share(g[f"equal_to_ar_{label_a}"]),
                     f"lossless vs ar {label_b}": _share(g[f"equal_to_ar_{label_b}"])})
    return pd.DataFrame(rows)


def _share(flags: pd.Series) -> str:
    known = [bool(f) for f in flags if f is not None and not pd.isna(f)]
    return f"{sum(known)}/{len(known)}" if known else "-"


def run_label(run_dir: Path) -> str:
    try:
        return json.loads((Path(run_dir) / "run.json").read_text()).get("engine", "hf")
    except (OSError, ValueError):
        return "hf"


def load_pair(run_a: Path, run_b: Path) -> tuple[pd.DataFrame, pd.DataFrame, str, str]:
    for run in (run_a, run_b):
        if not (Path(run) / "turns.parquet").is_dir():
            raise UserError(f"{run}: not a run directory (no turns.parquet/)")
    label_a, label_b = run_label(run_a), run_label(run_b)
    if label_a == label_b:
        label_a, label_b = f"{label_a}:{Path(run_a).name}", f"{label_b}:{Path(run_b).name}"
    return load_turns(run_a), load_turns(run_b), label_a, label_b


def turn_contexts(run_dir: Path, target, keys: set[tuple[str, str, int]]) -> dict[tuple[str, str, int], list[int]]:
    """The token ids each (method, sample, turn) of a stored run saw, rebuilt as the runner built them (its
    replay module, the target's template, the run's context policy; free replay continues from that run's
    own stored output)."""
    from evalsuite.config import RunConfig
    from evalsuite.replay import MethodReplay, Window, make_policy
    from evalsuite.runner import Runner
    from evalsuite.tasks.base import LoadOptions

    config = json.loads((Path(run_dir) / "run.json").read_text())
    fields = {k: config[k] for k in RunConfig.__dataclass_fields__ if k in config}
    fields.update(resume=True, out=None, engine="hf")
    runner = Runner(RunConfig(**fields), Path(run_dir))
    runner.target = target
    policy = make_policy(runner.config.context_policy,
                         Window(target.max_context, runner.config.max_new_tokens, runner.config.k))
    trajectories = {t.sample_id: t for t in runner.task.load(LoadOptions(
        config.get("limit"), config.get("seed", 0), config.get("data_path"), config.get("subset")))}
    turns = load_turns(run_dir).set_index(KEYS)
    found = {}
    for method, sample in sorted({(m, s) for m, s, _ in keys}):
        trajectory = trajectories.get(sample)
        if trajectory is None:
            continue
        replay = MethodReplay(trajectory, runner.replay, policy,
                              lambda messages, tools=trajectory.tools: runner._render(messages, tools))
        for index in range(len(trajectory.turns[: runner.config.max_turns])):
            context = replay.context(index)
            found[(method, sample, index)] = context.ids
            row = turns.loc[(method, sample, index)] if (method, sample, index) in turns.index else None
            decoded = row is not None and row.stop_reason != "skipped"
            replay.record_reply(index, target.decode(list(row.output_ids)) if decoded else None)
    return found


def divergence_margins(both: pd.DataFrame, run_dir: Path, label_ref: str, target_spec: str,
                       near_tie: float = NEAR_TIE) -> pd.DataFrame:
    """Adds `margin` (top-1 minus top-2 logit of the reference target at the first divergence) and `near_tie`."""
    import torch

    from evalsuite.target import TargetModel

    both = both.copy()
    both["margin"], both["near_tie"] = float("nan"), pd.array([None] * len(both), dtype="boolean")
    todo = both[~both.equal_ids & ~both.history_differs.astype(bool)]
    if todo.empty:
        return both
    target = TargetModel.load(target_spec, "cpu", None, "row-major")
    contexts = turn_contexts(run_dir, target, set(zip(todo.method, todo.sample_id, todo.turn)))
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
    from evalsuite.report.tables import Cell, Table

    rows = [[Cell(v, digits=3) if isinstance(v, float) else Cell(v) for v in r] for r in side.itertuples(index=False)]
    notes = ["τ counts the bonus token (mean over turns); speedup is paired per turn within each engine: "
             "(its ar decode s / tokens) / (its method decode s / tokens)",
             "equal ids: turns whose output ids are identical on both engines; lossless vs ar: turns whose method "
             "output equals that engine's own ar output (expected everywhere at T=0)"]
    return Table(name="engines", title=f"Engines side by side: {label_a} vs {label_b}", header=list(side.columns),
                 rows=rows, notes=notes, csv=side)
