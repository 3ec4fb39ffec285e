"""A speculation policy, measured: which method (or no drafting at all) to use per context bin of a task, and
what switching by context buys over the best fixed method, scored on held-out trajectories.

Deployers ask for exactly this switch (speculate at short contexts, stop or change method at long ones: vLLM
issues #47602, #54691); the records hold everything needed to measure it, since every method decoded the same
turns.

- Candidates: every drafting method of the task and "no drafting" (`ar`: speedup 1 by construction). A turn is
  used when every candidate decoded it paired with `ar` (complete cases; the rest are counted).
- Context bins: the task's turn-context bins (`breakeven.turn_bins`, the bins of the τ/speedup table).
- Choosing (on a set of trajectories): the fixed choice is the candidate with the highest pooled speedup
  (`metrics.speedup_ratio` over the set's turns); the context policy takes, in each bin, the candidate with the
  highest pooled speedup over the set's turns in that bin (the fixed choice where the set has none there).
- Held out (two-fold cross-fitting): the task's trajectories are ordered by sha256 of (seed, "policy", task,
  trajectory) and split into two halves; the choices made on one half are scored on the other, and both halves'
  scores pooled, so no turn is scored by a choice its own trajectory helped make.
- Scores: the pooled speedup over `ar` of the policy and of the fixed choice on the held-out turns, and their
  ratio (the gain of switching); 95 % intervals by a paired cluster bootstrap over trajectories with the choices
  held fixed (they were made on the other half).

Pure functions of the turns table (no model, no torch).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from evalsuite import metrics
from evalsuite.conventions import BASELINE
from evalsuite.report import breakeven, stats

NO_DRAFTING = BASELINE
POLICY_CONVENTION = (
    "speculation policy: candidates = each drafting method and no drafting (`ar`); per context bin of the task "
    "(quantile bins as in the τ/speedup table, their edges from the choosing half's contexts) the candidate with "
    "the highest pooled decode speedup on the choosing half; the "
    "fixed choice = the candidate with the highest pooled speedup on the choosing half over all bins; held out by "
    "two-fold cross-fitting: trajectories ordered by sha256(seed, 'policy', task, trajectory) and halved, each "
    "half's choices scored on the other half, the two scores pooled; gain = policy speedup / fixed-choice speedup "
    "on the same held-out turns; 95 % intervals by a paired cluster bootstrap over trajectories, the choices held "
    "fixed; only turns every candidate decoded (paired with `ar`) are used")
POLICY_COLUMNS = ["task", "switch_by", "n_trajectories", "n_turns", "n_bins", "split_seed", "fixed_choices", "policy_speedup",
                  "policy_speedup_lo", "policy_speedup_hi", "fixed_speedup", "fixed_speedup_lo", "fixed_speedup_hi",
                  "gain", "gain_lo", "gain_hi", "switches", "dropped_turns"]
CHOICE_COLUMNS = ["task", "context_lo", "context_hi", "n_trajectories", "n_turns", "best", "best_speedup",
                  "best_speedup_lo", "best_speedup_hi", "runner_up", "runner_up_speedup"]


def complete_cases(turns: pd.DataFrame, max_bins: int = 6) -> tuple[pd.DataFrame, int]:
    """(one row per (run, task, sample_id, turn, candidate) with decode_s, new_tokens, ar_decode_s,
    ar_new_tokens, bin, context_lo/hi, trajectory; the number of turns dropped because a candidate lacks them)."""
    pairs = metrics.paired(turns)
    if pairs.empty:
        return pd.DataFrame(), 0
    bins = breakeven.turn_bins(turns, max_bins)
    keys = ["run", "task", "sample_id", "turn"]
    rows = pairs[keys + ["method", "decode_s", "new_tokens", "ar_decode_s", "ar_new_tokens"]].copy()
    if BASELINE not in set(rows.method):  # no drafting: the paired AR measurement of each turn
        ar = rows.drop_duplicates(keys).assign(method=BASELINE)
        ar["decode_s"], ar["new_tokens"] = ar.ar_decode_s, ar.ar_new_tokens
        rows = pd.concat([rows, ar], ignore_index=True)
    rows = rows.merge(bins[keys + ["turn_context", "bin", "context_lo", "context_hi"]], on=keys, how="inner")
    dropped = 0
    kept = []
    for _, task_rows in rows.groupby("task", sort=False):
        wanted = task_rows.method.nunique()
        counts = task_rows.groupby(keys[:1] + keys[2:]).method.transform("nunique")
        complete = task_rows[counts == wanted]
        dropped += int(task_rows[counts < wanted].drop_duplicates(keys).shape[0])
        kept.append(complete)
    rows = pd.concat(kept, ignore_index=True) if kept else rows.iloc[:0]
    rows["trajectory"] = stats.trajectory_keys(rows) if len(rows) else pd.Series(dtype=str)
    return rows, dropped


def _pooled(cell: pd.DataFrame) -> float:
    return float(metrics.speedup_ratio(cell.ar_decode_s.sum(), cell.ar_new_tokens.sum(), cell.decode_s.sum(),
                                       cell.new_tokens.sum())) if len(cell) else float("nan")


def _best(cell: pd.DataFrame) -> str:
    """The candidate with the highest pooled speedup; ties go to no drafting (`ar`: it costs nothing to deploy),
    then to name order."""
    scores = {m: _pooled(c) for m, c in cell.groupby("method", sort=False)}
    order = sorted(scores, key=lambda m: (-(scores[m] if np.isfinite(scores[m]) else -np.inf), m != BASELINE, m))
    return order[0]


def choose(rows: pd.DataFrame, key: str = "bin") -> tuple[str, dict]:
    """(the fixed choice, {key value: choice}) from the candidate rows of one task's choosing set."""
    return _best(rows), {k: _best(cell) for k, cell in rows.groupby(key)}


SPAN_SWITCH = "context + previous reply's span kind"
PREVIOUS_KIND_CONVENTION = (
    "previous reply's span kind = the most frequent span kind of the trajectory's previous reply (the `ar` reply "
    "where labelled, else the first labelled method's), known before the turn is decoded; 'start' for a "
    "trajectory's first turn; the policy by context and span kind chooses per (bin, kind) and falls back to its "
    "bin's choice, then to the fixed one, where the choosing half has no turn of that cell")


def previous_kinds(turns: pd.DataFrame, spans: pd.DataFrame) -> pd.Series:
    """{(run, task, sample_id, turn): the dominant span kind of the previous turn's reply} (PREVIOUS_KIND_CONVENTION);
    empty when nothing is labelled."""
    from evalsuite.report.spans import labelled  # the report's span reader (no torch)

    rows = labelled(turns, spans) if len(spans) else pd.DataFrame()
    if rows.empty:
        return pd.Series(dtype=object)
    rows = rows.assign(rank=(rows.method != BASELINE).astype(int)).sort_values("rank", kind="stable")
    keys = [k for k in ("run", "task", "sample_id", "turn") if k in rows.columns]
    rows = rows.drop_duplicates(keys)
    dominant = rows.kind.map(lambda kinds: pd.Series(list(kinds)).mode().iloc[0] if len(kinds) else "none")
    following = rows[keys].assign(turn=rows.turn + 1)
    return pd.Series(dominant.to_numpy(), index=pd.MultiIndex.from_frame(following))


def halves(trajectories, seed: int, task: str) -> tuple[list[str], list[str]]:
    """The two halves of a task's trajectories: ordered by sha256(seed, 'policy', task, trajectory), cut in the
    middle (the first half gets the odd one)."""
    ordered = sorted(set(trajectories),
                     key=lambda t: hashlib.sha256(f"{seed}\0policy\0{task}\0{t}".encode()).hexdigest())
    cut = (len(ordered) + 1) // 2
    return ordered[:cut], ordered[cut:]


def _rebinned(rows: pd.DataFrame, edges: np.ndarray) -> pd.DataFrame:
    """`rows` with each turn's bin (and the (bin, previous kind) cell) under `edges`."""
    rows = rows.assign(bin=stats.context_bin(rows.turn_context, edges))
    if "kind" in rows.columns:
        rows["cell"] = list(zip(rows.bin, rows.kind))
    return rows


def _chosen(rows: pd.DataFrame, fixed: str, per_bin: dict, per_cell: dict | None = None
            ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the policy's rows, the fixed choice's rows) of a scoring set: one row per turn. `per_cell`: choices per
    (bin, previous kind), falling back to the bin's."""
    if per_cell is None:
        pick = rows.bin.map(lambda b: per_bin.get(b, fixed))
    else:
        pick = pd.Series([per_cell.get(c, per_bin.get(b, fixed)) for b, c in zip(rows.bin, rows.cell)],
                         index=rows.index)
    return rows[rows.method == pick], rows[rows.method == fixed]


def _gain_from_sums(sums: np.ndarray) -> np.ndarray:
    """sums[..., :] = (ar s, ar tokens, policy s, policy tokens, fixed s, fixed tokens)."""
    policy = metrics.speedup_ratio(sums[..., 0], sums[..., 1], sums[..., 2], sums[..., 3])
    fixed = metrics.speedup_ratio(sums[..., 0], sums[..., 1], sums[..., 4], sums[..., 5])
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.stack([np.asarray(policy, float), np.asarray(fixed, float),
                         np.asarray(policy, float) / np.asarray(fixed, float)], axis=-1)


def evaluate_policy(turns: pd.DataFrame, seed: int = 0, n_resamples: int = stats.DEFAULT_RESAMPLES,
                    max_bins: int = 6, spans: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per task: the held-out speedup of the context policy, of the best fixed choice, and the gain
    (POLICY_COLUMNS; POLICY_CONVENTION); with span labels (`spans`) also a policy that switches by context and the
    previous reply's span kind (PREVIOUS_KIND_CONVENTION)."""
    rows, dropped_all = complete_cases(turns, max_bins)
    out = []
    if rows.empty:
        return pd.DataFrame(columns=POLICY_COLUMNS)
    kinds = previous_kinds(turns, spans) if spans is not None else pd.Series(dtype=object)
    variants = ["context"] + ([SPAN_SWITCH] if len(kinds) else [])
    if len(kinds):
        index = pd.MultiIndex.from_frame(rows[["run", "task", "sample_id", "turn"]])
        previous = kinds.reindex(index).to_numpy(object)
        rows = rows.assign(kind=np.where(rows.turn.to_numpy() == rows.groupby("trajectory").turn.transform("min"),
                                         "start", pd.Series(previous).fillna("unlabelled").to_numpy()))
        rows["cell"] = list(zip(rows.bin, rows.kind))
    for task, task_rows in rows.groupby("task", sort=False):
        first, second = halves(task_rows.trajectory, seed, task)
        for variant in variants:
            scored, fixed_names, switches = [], [], 0
            for choose_on, score_on in ((first, second), (second, first)):
                if not choose_on or not score_on:
                    continue
                # bin edges from the choosing half's contexts only: nothing of the scoring half shapes the choice
                chooser = task_rows[task_rows.trajectory.isin(choose_on)].drop_duplicates(["trajectory", "turn"])
                edges = stats.task_context_edges(chooser.turn_context, max_bins)
                binned = _rebinned(task_rows, edges)
                train = binned[binned.trajectory.isin(choose_on)]
                fixed, per_bin = choose(train)
                per_cell = choose(train, "cell")[1] if variant == SPAN_SWITCH else None
                fixed_names.append(fixed)
                switches += sum(1 for choice in (per_cell or per_bin).values() if choice != fixed)
                test = binned[binned.trajectory.isin(score_on)]
                scored.append(_chosen(test, fixed, per_bin, per_cell))
            if not scored:
                continue
            policy_rows = pd.concat([p for p, _ in scored], ignore_index=True)
            fixed_rows = pd.concat([f for _, f in scored], ignore_index=True)
            columns = ["ar_decode_s", "ar_new_tokens", "decode_s", "new_tokens"]
            per_policy = policy_rows.groupby("trajectory")[columns].sum()
            per_fixed = fixed_rows.groupby("trajectory")[columns].sum().reindex(per_policy.index)
            sums = np.column_stack([per_policy.to_numpy(float),
                                    per_fixed[["decode_s", "new_tokens"]].to_numpy(float)])
            point = _gain_from_sums(sums.sum(axis=0))
            low = high = np.full(3, np.nan)
            if len(sums) >= stats.MIN_INTERVAL_TRAJECTORIES:
                low, high = stats.bootstrap_ci(sums, _gain_from_sums, stats.cell_seed(seed, "policy", variant, task),
                                               n_resamples)
            out.append({"task": task, "switch_by": variant, "n_trajectories": len(sums),
                        "n_turns": len(policy_rows), "n_bins": int(task_rows.bin.nunique()), "split_seed": seed,
                        "fixed_choices": " / ".join(fixed_names), "policy_speedup": point[0],
                        "policy_speedup_lo": low[0], "policy_speedup_hi": high[0], "fixed_speedup": point[1],
                        "fixed_speedup_lo": low[1], "fixed_speedup_hi": high[1], "gain": point[2],
                        "gain_lo": low[2], "gain_hi": high[2], "switches": switches, "dropped_turns": dropped_all})
    return pd.DataFrame(out, columns=POLICY_COLUMNS)


def best_choices(turns: pd.DataFrame, seed: int = 0, n_resamples: int = stats.DEFAULT_RESAMPLES,
                 max_bins: int = 6) -> pd.DataFrame:
    """Per (task, context bin), over all trajectories (in-sample, the map a policy is read from): the best
    candidate and its pooled speedup with a trajectory-bootstrap interval, and the runner-up (CHOICE_COLUMNS)."""
    rows, _ = complete_cases(turns, max_bins)
    out = []
    if rows.empty:
        return pd.DataFrame(columns=CHOICE_COLUMNS)
    for (task, b), cell in rows.groupby(["task", "bin"], sort=False):
        scores = {m: _pooled(c) for m, c in cell.groupby("method", sort=False)}
        order = sorted(scores, key=lambda m: (-(scores[m] if np.isfinite(scores[m]) else -np.inf), m != BASELINE, m))
        best = cell[cell.method == order[0]]
        sums = best.groupby("trajectory")[["ar_decode_s", "ar_new_tokens", "decode_s", "new_tokens"]].sum()
        low = high = np.nan
        if stats.interval_allowed(len(best), len(sums)) and order[0] != BASELINE:
            low, high = stats.bootstrap_ci(sums.to_numpy(float), stats.speedup_from_sums,
                                           stats.cell_seed(seed, "choice", task, b), n_resamples)
        out.append({"task": task, "context_lo": int(cell.context_lo.iloc[0]), "context_hi": int(cell.context_hi.iloc[0]),
                    "n_trajectories": int(cell.trajectory.nunique()), "n_turns": int(len(best)), "best": order[0],
                    "best_speedup": scores[order[0]], "best_speedup_lo": float(low), "best_speedup_hi": float(high),
                    "runner_up": order[1] if len(order) > 1 else "",
                    "runner_up_speedup": scores[order[1]] if len(order) > 1 else np.nan})
    table = pd.DataFrame(out, columns=CHOICE_COLUMNS)
    order = {task: i for i, task in enumerate(dict.fromkeys(turns.task))}
    return table.sort_values(["task", "context_lo"], key=lambda c: c.map(order) if c.name == "task" else c,
                             kind="stable", ignore_index=True)
