"""The report's closed-loop section (`--replay closed` runs, BFCL-v3): what the live agent loop did, and how
speculation fares on the contexts it wrote, against the logged replay of the same entries.

Pure pandas over the stored tables: each closed run's `tool_calls.parquet` (evalsuite/replay/closed.py) joined
with its turns (per-turn τ and paired speedup, `metrics.per_turn`) and steps.

- **What the loop did** (per closed run's task column × method): entries, user turns, decodes (loop steps), calls
  (parsed from the replies), executed (run against the backends; native: the schema check passed), refused (native:
  unknown function, unexpected or missing argument, wrong type), execution errors, parse errors, the share of user
  turns that executed ≥ 1 call with no parse error in the turn (and the same counting only calls in the template's
  own `<tool_call>` tags), calls per user turn, tool-result bytes, solved entries (BFCL's state-based check,
  `tool_calls.solved`, of the loops scored) and the share of replies equal to ar's (T=0).
- **Per loop step** (step = decode index within a user turn; 3 and later pooled): decodes, mean context, mean
  growth of the context since the previous decode (the reply and the tool results it got; for step 0 also the new
  user message), mean tool-result bytes per decode, τ (pooled over verify steps) and speedup (pooled over the
  paired decodes).
- **Live against replayed**: for each closed run, the logged runs among the inputs of the same task and subset
  (`--replay logged`: BFCL's ground-truth calls as the assistant turns, no tool results), restricted to the
  entries the closed run ran; per drafting method and context bin, τ and speedup of each.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from evalsuite import metrics
from evalsuite.conventions import BASELINE
from evalsuite.report import stats

CLOSED = "closed"
CONTEXT_EDGES = (0, 6_000, 8_000, 12_000, 16_000, 24_000, np.inf)
STEP_BUCKETS = ("0", "1", "2", "3+")
SUMMARY_COLUMNS = ["task", "method", "entries", "user_turns", "decodes", "calls", "executed", "refused",
                   "execution_errors", "parse_errors", "turns_executing", "turns_executing_share",
                   "turns_executing_tagged_share", "calls_per_user_turn", "result_bytes", "result_bytes_per_call",
                   "solved", "scored", "same_as_ar"]
STEP_COLUMNS = ["task", "method", "step", "decodes", "context_mean", "growth_mean", "result_bytes_mean", "tau",
                "speedup"]
DIFFERENCE_COLUMNS = ["task", "method", "entries", "live_tau", "replayed_tau", "tau_difference", "tau_low", "tau_high",
                      "live_speedup", "replayed_speedup", "speedup_ratio", "ratio_low", "ratio_high"]
LIVE_COLUMNS = ["task", "method", "context_bin", "live_decodes", "live_tau", "live_speedup", "replayed_decodes",
                "replayed_tau", "replayed_speedup"]


def closed_runs(results) -> list:
    return [r for r in results.runs if r.config.get("replay") == CLOSED]


def _lists(frame: pd.DataFrame, column: str) -> pd.Series:
    return frame[column].map(lambda v: list(v) if isinstance(v, (list, tuple, np.ndarray)) else [])


def loop_rows(results, run) -> pd.DataFrame:
    """One closed run's tool_calls rows joined with its decoded turns (τ, speedup, context)."""
    from evalsuite.replay.closed import read_tool_calls

    tools = read_tool_calls(run.path)
    if tools.empty:
        return tools
    turns = results.turns[results.turns.run == run.key]
    steps = results.steps[results.steps.run == run.key]
    per = metrics.per_turn(steps, turns)
    keys = ["method", "sample_id", "turn"]
    rows = tools.drop(columns=[c for c in ("run_id", "task") if c in tools.columns]).merge(
        per[keys + ["task", "context_len", "stop_reason", "tau", "steps", "speedup_turn", *metrics.SPEEDUP_COLUMNS]],
        on=keys,
        how="inner")
    calls = _lists(rows, "calls")
    executed = _lists(rows, "executed")
    # runs written before `executed`/`forms`: every recorded call was executed (prompt mode)
    executed = [e if len(e) == len(c) else [True] * len(c) for c, e in zip(calls, executed)]
    forms = _lists(rows, "forms")
    forms = [f if len(f) == len(c) else ["python"] * len(c) for c, f in zip(calls, forms)]
    errors = _lists(rows, "errors")
    rows["n_calls"] = [len(c) for c in calls]
    rows["n_executed"] = [sum(e) for e in executed]
    rows["n_tagged"] = [sum(1 for x, f in zip(e, f) if x and f == "tag") for e, f in zip(executed, forms)]
    rows["n_refused"] = [len(e) - sum(e) for e in executed]
    rows["n_exec_errors"] = [sum(1 for x, err in zip(e, r) if x and err) for e, r in zip(executed, errors)]
    rows["bytes"] = [sum(b) for b in _lists(rows, "result_bytes")]
    rows["parse_failed"] = rows.parse_error.fillna("").astype(str) != ""
    rows = rows.sort_values(["method", "sample_id", "turn"]).reset_index(drop=True)
    rows["growth"] = rows.groupby(["method", "sample_id"]).context_len.diff()
    return rows


def skipped_user_turns(run) -> pd.DataFrame:
    """Per method: user turns none of whose decodes ran (every one skipped at the context limit), which the
    summary's user turns and shares leave out; [task, method, skipped_user_turns]."""
    from evalsuite.replay.closed import read_tool_calls

    tools = read_tool_calls(run.path)
    if tools.empty or "stop" not in tools.columns:
        return pd.DataFrame(columns=["task", "method", "skipped_user_turns"])
    skipped = (tools.stop == "skipped").groupby([tools.method, tools.sample_id, tools.user_turn]).all()
    counts = skipped.groupby(level="method").sum().astype(int)
    return pd.DataFrame({"task": run.task_label, "method": counts.index, "skipped_user_turns": counts.to_numpy()})


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    records = []
    for (task, method), group in rows.groupby(["task", "method"], sort=False):
        turns = group.groupby(["sample_id", "user_turn"]).agg(executed=("n_executed", "sum"),
                                                              tagged=("n_tagged", "sum"),
                                                              parse=("parse_failed", "any"))
        clean = ~turns.parse
        executing = int(((turns.executed > 0) & clean).sum())
        tagged = int(((turns.tagged > 0) & clean).sum())
        scored = group.solved.dropna() if "solved" in group.columns else pd.Series(dtype=bool)
        same = group.matches_ar.dropna() if "matches_ar" in group.columns else pd.Series(dtype=bool)
        n_turns, calls = len(turns), int(group.n_calls.sum())
        executed = int(group.n_executed.sum())
        records.append({
            "task": task, "method": method, "entries": group.sample_id.nunique(), "user_turns": n_turns,
            "decodes": len(group), "calls": calls, "executed": executed, "refused": int(group.n_refused.sum()),
            "execution_errors": int(group.n_exec_errors.sum()), "parse_errors": int(group.parse_failed.sum()),
            "turns_executing": executing, "turns_executing_share": executing / n_turns if n_turns else np.nan,
            "turns_executing_tagged_share": tagged / n_turns if n_turns else np.nan,
            "calls_per_user_turn": calls / n_turns if n_turns else np.nan, "result_bytes": int(group.bytes.sum()),
            "result_bytes_per_call": group.bytes.sum() / calls if calls else np.nan,
            "solved": int(scored.astype(bool).sum()), "scored": len(scored),
            "same_as_ar": float(same.astype(bool).mean()) if len(same) else np.nan})
    return pd.DataFrame(records, columns=SUMMARY_COLUMNS)


def _tau(group: pd.DataFrame) -> float:
    counted = group.steps.fillna(0)
    return float((group.tau.fillna(0) * counted).sum() / counted.sum()) if counted.sum() else np.nan


def per_step(rows: pd.DataFrame) -> pd.DataFrame:
    rows = rows.assign(bucket=rows.step.map(lambda s: str(int(s)) if s < 3 else "3+"))
    records = []
    for (task, method, bucket), group in rows.groupby(["task", "method", "bucket"], sort=False):
        drafting = method != BASELINE
        records.append({"task": task, "method": method, "step": bucket, "decodes": len(group),
                        "context_mean": float(group.context_len.mean()), "growth_mean": float(group.growth.mean()),
                        "result_bytes_mean": float(group.bytes.mean()),
                        "tau": _tau(group) if drafting else np.nan,
                        "speedup": metrics.speedup(group) if drafting else np.nan})
    frame = pd.DataFrame(records, columns=STEP_COLUMNS)
    if frame.empty:
        return frame
    order = {b: i for i, b in enumerate(STEP_BUCKETS)}
    return frame.sort_values(["task", "method", "step"], key=lambda s: s.map(order) if s.name == "step" else s)


def context_bin(length: float) -> str:
    for low, high in zip(CONTEXT_EDGES, CONTEXT_EDGES[1:]):
        if low <= length < high:
            return f"≥ {low / 1000:g}k" if high == np.inf else f"{low / 1000:g}–{high / 1000:g}k"
    return "?"


def _live_and_replayed(results, run, rows: pd.DataFrame) -> pd.DataFrame:
    """The closed run's decoded turns (source "live") and the logged runs' turns on the same entries (source
    "replayed"), drafting methods only, with per-turn τ, steps and the paired speedup columns."""
    logged = [r for r in results.runs if r.config.get("replay") in ("logged", "auto") and
              r.config.get("task") == run.config.get("task") and r.config.get("subset") == run.config.get("subset")
              and r.config.get("temperature") == run.config.get("temperature")]
    samples = set(rows.sample_id)
    live = rows[rows.method != BASELINE].assign(source="live")
    replayed = []
    for other in logged:
        turns = results.turns[(results.turns.run == other.key) & results.turns.sample_id.isin(samples)]
        steps = results.steps[(results.steps.run == other.key) & results.steps.sample_id.isin(samples)]
        if len(turns):
            replayed.append(metrics.per_turn(steps, turns))
    both = [live] + [r[r.method != BASELINE].assign(source="replayed") for r in replayed]
    return pd.concat(both, ignore_index=True)


def live_vs_replayed(results, run, rows: pd.DataFrame) -> pd.DataFrame:
    """Per drafting method × context bin: the closed run's τ and speedup, and the logged runs' on the same
    entries."""
    frame = _live_and_replayed(results, run, rows)
    if frame.empty:
        return pd.DataFrame(columns=LIVE_COLUMNS)
    frame["context_bin"] = frame.context_len.map(context_bin)
    task = rows.task.iloc[0]
    records = []
    order = [context_bin(e) for e in CONTEXT_EDGES[:-1]] + ["all"]
    for method, group in frame.groupby("method", sort=True):
        for label in order:
            cell = group if label == "all" else group[group.context_bin == label]
            if cell.empty:
                continue
            record = {"task": task, "method": method, "context_bin": label}
            for source in ("live", "replayed"):
                part = cell[cell.source == source]
                record[f"{source}_decodes"] = len(part)
                record[f"{source}_tau"] = _tau(part) if len(part) else np.nan
                record[f"{source}_speedup"] = metrics.speedup(part) if len(part) else np.nan
            records.append(record)
    return pd.DataFrame(records, columns=LIVE_COLUMNS)


def _entry_sums(part: pd.DataFrame, entries: list) -> np.ndarray:
    """[n_entries, 6] per entry: Σ τ·steps, Σ steps (τ pooled over verify steps), then the paired speedup's sums
    (AR seconds, AR tokens, method seconds, method tokens) over its paired decodes; zeros where it has none."""
    steps = part.steps.fillna(0)
    tau = pd.DataFrame({"tokens": part.tau.fillna(0) * steps, "steps": steps, "sample_id": part.sample_id})
    sums = tau.groupby("sample_id").sum().reindex(entries, fill_value=0)
    pairs = metrics.paired(part)
    speed = pairs.groupby("sample_id")[metrics.SPEEDUP_COLUMNS].sum().reindex(entries, fill_value=0)
    return np.hstack([sums.to_numpy(float), speed.to_numpy(float)])


def _tau_and_speedup(sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with np.errstate(invalid="ignore", divide="ignore"):
        return (metrics.tau_ratio(sums[..., 0], sums[..., 1]),
                metrics.speedup_ratio(sums[..., 2], sums[..., 3], sums[..., 4], sums[..., 5]))


def live_minus_replayed(results, run, rows: pd.DataFrame, seed: int, n_resamples: int) -> pd.DataFrame:
    """Per drafting method: live τ − replayed τ and live speedup ÷ replayed speedup over the entries both ran,
    each with a 95 % percentile bootstrap interval resampling whole entries (an entry's live loop and its replay
    drawn together, so the comparison is paired by entry)."""
    frame = _live_and_replayed(results, run, rows)
    records = []
    for method, group in frame.groupby("method", sort=True):
        live, replayed = group[group.source == "live"], group[group.source == "replayed"]
        entries = sorted(set(live.sample_id) & set(replayed.sample_id))
        if not entries:
            continue
        per_entry = np.stack([_entry_sums(live, entries), _entry_sums(replayed, entries)], axis=1)  # [n, 2, 6]

        def statistic(totals: np.ndarray) -> np.ndarray:
            tau, speed = _tau_and_speedup(totals)  # [..., 2]: live, replayed
            return np.stack([tau[..., 0] - tau[..., 1], speed[..., 0] / speed[..., 1]], axis=-1)

        point = statistic(per_entry.sum(axis=0))
        enough = len(entries) >= stats.MIN_INTERVAL_TRAJECTORIES
        low, high = stats.bootstrap_ci(per_entry, statistic, stats.cell_seed(seed, run.key, method, "live-replayed"),
                                       n_resamples) if enough else (np.full(2, np.nan), np.full(2, np.nan))
        tau, speed = _tau_and_speedup(per_entry.sum(axis=0))
        records.append({"task": rows.task.iloc[0], "method": method, "entries": len(entries),
                        "live_tau": tau[0], "replayed_tau": tau[1], "tau_difference": point[0],
                        "tau_low": low[0], "tau_high": high[0], "live_speedup": speed[0], "replayed_speedup": speed[1],
                        "speedup_ratio": point[1], "ratio_low": low[1], "ratio_high": high[1]})
    return pd.DataFrame(records, columns=DIFFERENCE_COLUMNS)


def _reading(row) -> str:
    """Which way the interval points: a difference is claimed only where its interval excludes no-difference."""
    if np.isnan(row.tau_low):
        return f"undecided (n = {row.entries})"
    if row.tau_low > 0:
        return "higher live"
    if row.tau_high < 0:
        return "lower live"
    return "no difference shown"


def _signed(value: float) -> str:
    """+0.12; a value that two decimals would print as ±0.00 gets two significant digits (-0.0003), so the sign
    and the size the reading rests on both show."""
    return f"{value:+.2g}" if value != 0 and round(value, 2) == 0 else f"{value:+.2f}"


def _interval(low: float, high: float, signed: bool = False) -> str:
    if np.isnan(low) or np.isnan(high):
        return "–"
    return f"[{_signed(low)}, {_signed(high)}]" if signed else f"[{low:.2f}, {high:.2f}]"


def _pct(value) -> str:
    return "–" if value is None or (isinstance(value, float) and np.isnan(value)) else f"{100 * value:.0f} %"


def closed_loop_section(results, seed: int = 0, n_resamples: int = stats.DEFAULT_RESAMPLES) -> list:
    """The section's items (paragraphs and tables); [] when no input run is a closed loop."""
    from evalsuite.report.formatting import Cell, Table

    runs = closed_runs(results)
    if not runs:
        return []
    frames = [loop_rows(results, run) for run in runs]
    rows = pd.concat([f for f in frames if len(f)], ignore_index=True) if any(len(f) for f in frames) else None
    if rows is None:
        return ["The closed-loop runs hold no tool_calls rows (written before the table existed, or unfinished)."]
    formats = sorted({(r.config.get("closed_loop") or {}).get("tool_format") or r.config.get("tool_format")
                      or "prompt" for r in runs})
    items = [f"Live agent loops on BFCL-v3 (`--replay closed`, tool format {', '.join(formats)}): the target's own "
             "calls were executed against bfcl-eval's simulated backends and their results were its next context; "
             "each decode of the loop is one turn of the records. Solved: BFCL's state-based multi-turn check "
             "(bfcl-eval's state and response checkers against possible_answer)."]
    table = summary(rows)
    skipped = pd.concat([skipped_user_turns(run) for run in runs], ignore_index=True)
    table["skipped_user_turns"] = table.merge(skipped, on=["task", "method"], how="left").skipped_user_turns \
        .fillna(0).astype(int).to_numpy()
    body = [[Cell(r.task), Cell(r.method), Cell(int(r.entries)), Cell(int(r.user_turns)),
             Cell(int(r.skipped_user_turns)), Cell(int(r.decodes)),
             Cell(int(r.calls)), Cell(int(r.executed)), Cell(int(r.refused)), Cell(int(r.execution_errors)),
             Cell(int(r.parse_errors)), Cell(_pct(r.turns_executing_share)),
             Cell(_pct(r.turns_executing_tagged_share)), Cell(r.calls_per_user_turn),
             Cell(r.result_bytes, unit="bytes"), Cell(f"{int(r.solved)} / {int(r.scored)}"),
             Cell(_pct(r.same_as_ar))] for r in table.itertuples(index=False)]
    items.append(Table("closed_loop", "Closed loop: what the live agent did",
                       ["Task", "Method", "entries", "user turns", "skipped", "decodes", "calls", "executed", "refused",
                        "exec. errors", "parse errors", "turns executing", "… tagged", "calls / turn",
                        "result bytes", "solved", "same as ar"], body,
                       ["user turns: those with ≥ 1 decode run; skipped: user turns whose every decode was "
                        "skipped at the context limit (the context had outgrown the window), left out of the shares",
                        "turns executing: user turns with ≥ 1 executed call and no parse error in the turn; "
                        "… tagged: counting only calls in the template's own <tool_call> tags",
                        "refused: native calls that failed their tool's schema (not executed, an error "
                        "observation); exec. errors: executed calls whose backend raised or returned an error",
                        "solved: entries whose loop passed BFCL's state-based check / loops scored (at T=0 a method "
                        "whose replies differ from ar's is not scored: the loop followed ar's)",
                        "same as ar: replies equal to ar's on the same context (T=0)"], table))
    steps = per_step(rows)
    body = [[Cell(r.task), Cell(r.method), Cell(r.step), Cell(int(r.decodes)), Cell(r.context_mean, digits=0),
             Cell(r.growth_mean, digits=0), Cell(r.result_bytes_mean, unit="bytes"), Cell(r.tau), Cell(r.speedup)]
            for r in steps.itertuples(index=False)]
    items.append(Table("closed_loop_steps", "Closed loop: τ and speedup per loop step",
                       ["Task", "Method", "step", "decodes", "context", "growth", "result bytes", "τ", "speedup"],
                       body, ["step: the decode's index within its user turn (0: answering the user message; "
                              "k > 0: after k rounds of tool results), 3 and later pooled",
                              "context: mean tokens before the decode; growth: mean tokens added since the previous "
                              "decode of the loop (its reply and the tool results; at step 0 also the user message)",
                              "τ pooled over verify steps, speedup pooled over the paired decodes (ar: –)"], steps))
    live = pd.concat([live_vs_replayed(results, run, rows[rows.task == run.task_label]) for run in runs
                      if (rows.task == run.task_label).any()], ignore_index=True)
    if live.empty or not live.replayed_decodes.sum():
        items.append("No logged replay of the same entries among the inputs: pass the `--replay logged` runs of the "
                     "same task, subset and entries to compare live and replayed contexts.")
    if not live.empty:
        body = [[Cell(r.task), Cell(r.method), Cell(r.context_bin), Cell(int(r.live_decodes)), Cell(r.live_tau),
                 Cell(r.live_speedup), Cell(int(r.replayed_decodes)), Cell(r.replayed_tau),
                 Cell(r.replayed_speedup)] for r in live.itertuples(index=False)]
        items.append(Table("closed_loop_live_vs_replayed", "Closed loop: live contexts against the logged replay",
                           ["Task", "Method", "context", "decodes", "τ", "speedup", "decodes", "τ", "speedup"],
                           body, ["live: the closed loop's decodes (the target's own calls and the tools' real "
                                  "results in context); replayed: the logged replay of the same entries (BFCL's "
                                  "ground-truth calls as assistant turns, no tool results)",
                                  "context bins by the decode's context tokens"], live,
                           groups=[("", 3), ("live", 3), ("replayed", 3)]))
    difference = pd.concat([live_minus_replayed(results, run, rows[rows.task == run.task_label], seed, n_resamples)
                            for run in runs if (rows.task == run.task_label).any()], ignore_index=True)
    if not difference.empty:
        body = [[Cell(r.task), Cell(r.method), Cell(int(r.entries)), Cell(r.live_tau), Cell(r.replayed_tau),
                 Cell(_signed(r.tau_difference)), Cell(_interval(r.tau_low, r.tau_high, signed=True)),
                 Cell(r.speedup_ratio), Cell(_interval(r.ratio_low, r.ratio_high)), Cell(_reading(r))]
                for r in difference.itertuples(index=False)]
        items.append(Table("closed_loop_live_minus_replayed", "Closed loop: live against replayed, paired by entry",
                           ["Task", "Method", "entries", "live τ", "replayed τ", "τ live − replayed", "95 % CI",
                            "speedup live ÷ replayed", "95 % CI", "τ reading"], body,
                           ["τ pooled over verify steps (bonus included), speedup pooled over the paired decodes, "
                            "each over the entries both the closed run and its logged replay ran",
                            "95 % CI: percentile bootstrap resampling whole entries, an entry's live loop and its "
                            "replay drawn together (paired by entry); none below "
                            f"{stats.MIN_INTERVAL_TRAJECTORIES} entries",
                            "τ reading: higher/lower live where the interval of the difference excludes 0; "
                            "otherwise no difference is shown (which is not a shown equality)"], difference))
    return items
