"""Paper-style tables: each of the report's tables built from the stats as a `formatting.Table` (the model and its
Markdown, LaTeX (booktabs), HTML and CSV renderers live in `evalsuite.report.formatting`).

Conventions are attached to each table as notes and printed under it in every format.
"""

from __future__ import annotations

import math

import pandas as pd

from evalsuite import conventions, metrics
from evalsuite.conventions import BASELINE
from evalsuite.report import (breakeven, checks, decisions, effects, hardware, points, policy, positions, stats,
                              telemetry)
from evalsuite.report.formatting import Cell, Table, is_number

FEW_NOTE = (f"† fewer than {stats.MIN_TRAJECTORIES} trajectories in this cell: its interval is rough (below "
            f"{stats.MIN_INTERVAL_TRAJECTORIES} there is none, and the cell prints its n)")
BOLD_NOTE = ("bold = best of its column by a paired bootstrap: the ratio of the best to the runner-up, resampling "
             "the trajectories both ran on the turns both decoded, has its 95 % interval above 1; ≈ = tied for best "
             "(that paired interval contains 1: the best, the runner-up and each next method whose paired ratio to "
             "the best still contains 1), so none is bold; no mark where fewer than "
             f"{stats.MIN_INTERVAL_TRAJECTORIES} shared trajectories leave it undecided (overlapping marginal "
             "intervals decide nothing)")


# ---- helpers ---------------------------------------------------------------------------------------------------
def mark_ranked(rows: list[list[Cell]], column: int, status: dict[str, str]) -> None:
    """Bold / ≈ one column from the paired ranking {method: status} of `decisions.rank_methods` (the rows' first
    cell names the method): "best" is bold, "tied for best" gets ≈, anything else (behind, undecided) no mark."""
    for row in rows:
        state = status.get(str(row[0].value), "")
        if not is_number(row[column].value) or (isinstance(row[column].value, float) and
                                                  math.isnan(row[column].value)):
            continue
        row[column].bold = state == "best"
        row[column].tie = state == "tied for best"


def _summary_lookup(summary: pd.DataFrame) -> dict[tuple[str, str], pd.Series]:
    return {(r.method, r.task): r for r in summary.itertuples(index=False)}


def _skipped_note(summary: pd.DataFrame) -> str:
    skipped = int(summary.skipped.sum())
    return f"{stats.SKIPPED_CONVENTION}: {skipped} turn(s) skipped in this table's cells"


def _drafting_methods(methods: list[str]) -> list[str]:
    return [m for m in methods if m != BASELINE]


# ---- the headline: Table 1 with τ and speedup per task, one block per temperature -----------------------------
def headline_tables(summary: pd.DataFrame, methods: list[str], tasks: list[str],
                    ranks: pd.DataFrame | None = None, e2e: pd.DataFrame | None = None) -> list[Table]:
    """Paper-style Table 1: rows = drafting methods, per task τ and speedup side by side, then the Mean over tasks;
    one table per temperature. Each task's header says its n; a cell whose n differs prints its own. `ranks`
    (`decisions.rank_methods` for "tau" and "speedup", stacked) decides bold and ties; without it nothing is
    marked. `e2e` (`telemetry.end_to_end`) adds an end-to-end (turn-latency) speedup beside each decode-only one."""
    tables = []
    width = 3 if e2e is not None and len(e2e) else 2
    latency = {(r.method, r.task): r for r in e2e.itertuples(index=False)} if width == 3 else {}
    temperatures = sorted(set(summary.temperature.dropna())) or [float("nan")]
    for temperature in temperatures:
        block = summary[(summary.temperature == temperature) & summary.method.isin(_drafting_methods(methods))]
        block_tasks = [t for t in tasks if t in set(block.task)]
        if block.empty:
            continue
        lookup = _summary_lookup(block)
        common_n = {t: int(block[block.task == t].trajectories.max()) for t in block_tasks}
        rows, records = [], []
        for method in [m for m in _drafting_methods(methods) if m in set(block.method)]:
            row, taus, speedups, ends = [Cell(method)], [], [], []
            for task in block_tasks:
                r = lookup.get((method, task))
                if r is None:
                    row += [Cell(None)] * width
                    taus.append(float("nan"))
                    speedups.append(float("nan"))
                    ends.append(float("nan"))
                    continue
                n = int(r.trajectories)
                row += [Cell(r.tau, r.tau_ci_low, r.tau_ci_high, n),
                        Cell(r.speedup, r.speedup_ci_low, r.speedup_ci_high, n)]
                if n != common_n[task] and n >= stats.MIN_INTERVAL_TRAJECTORIES:
                    row[-1].count = n
                if width == 3:
                    e = latency.get((method, task))
                    row.append(Cell(e.latency_speedup, e.latency_speedup_lo, e.latency_speedup_hi,
                                    int(e.n_trajectories)) if e is not None else Cell(None))
                    ends.append(e.latency_speedup if e is not None else float("nan"))
                taus.append(r.tau)
                speedups.append(r.speedup)
                records.append({"temperature": temperature, "method": method, "task": task,
                                **{c: getattr(r, c) for c in ("trajectories", "turns", "tau", "tau_ci_low",
                                                              "tau_ci_high", "speedup", "speedup_ci_low",
                                                              "speedup_ci_high")}})
            mean_tau, mean_speedup = _mean(taus), _mean(speedups)
            row += [Cell(mean_tau), Cell(mean_speedup)] + ([Cell(_mean(ends))] if width == 3 else [])
            records.append({"temperature": temperature, "method": method, "task": "Mean", "tau": mean_tau,
                            "speedup": mean_speedup})
            rows.append(row)
        if ranks is not None and len(ranks):
            for i, task in enumerate(block_tasks):
                for offset, measure in ((1, "tau"), (2, "speedup")):
                    cells = ranks[(ranks.task == task) & (ranks.measure == measure)]
                    mark_ranked(rows, 1 + width * i + offset - 1, dict(zip(cells.method, cells.status)))
        turns_of = {t: int(block[block.task == t].turns.max()) for t in block_tasks}
        groups = [("", 1)] + [(f"{t} (n={common_n[t]}, {turns_of[t]} turns)", width) for t in block_tasks] + \
                 [("Mean", width)]
        notes = [conventions.TAU, conventions.SPEEDUP + " (the decode-only speedup)", stats.CI_CONVENTION,
                 "n = trajectories (sampled tasks / conversations) per cell, as in each task's header unless the "
                 "cell says otherwise", BOLD_NOTE,
                 "Mean = unweighted mean over the tasks of this block (no interval; blank when a method lacks a task)",
                 f"`{BASELINE}` (τ = 1, speedup = 1 by construction) is the reference; its speed is in the next table",
                 _skipped_note(block)]
        if any(c.few for row in rows for c in row):
            notes.insert(0, FEW_NOTE)
        if width == 3:
            notes.insert(2, "end-to-end = the turn-latency speedup: (Σ `ar` (shared prefill + decode) / Σ `ar` "
                            "tokens) / (Σ (shared prefill + decode) / Σ tokens) over the paired turns, what a user "
                            "waiting for the whole reply sees; the end-to-end table below has TTFT and ITL too")
        label = f"T = {temperature:g}"
        columns = ["τ", "speedup", "end-to-end"] if width == 3 else ["τ", "speedup"]
        tables.append(Table(f"table1_T{temperature:g}", f"Table 1 ({label}): τ and speedup per task"
                            + (" (decode-only and end to end)" if width == 3 else ""),
                            ["Method"] + columns * (len(block_tasks) + 1), rows, notes,
                            pd.DataFrame(records), groups=groups))
    return tables


def _mean(values: list[float]) -> float:
    return float(sum(values) / len(values)) if values and not any(math.isnan(v) for v in values) else float("nan")


def baseline_table(summary: pd.DataFrame, turns: pd.DataFrame, tasks: list[str]) -> Table | None:
    """The `ar` baseline's absolute speed per task, with n: what every speedup is relative to."""
    rows, records = [], []
    for task in tasks:
        cells = summary[summary.task == task]
        if cells.empty:
            continue
        ms = float(cells.ar_ms_per_token.iloc[0])
        ar = metrics.decoded(turns[(turns.task == task) & (turns.method == BASELINE)])
        source = f"`{BASELINE}` runs" if not ar.empty else "paired AR decodes"
        n_traj = int(ar.sample_id.nunique()) if not ar.empty else int(cells.trajectories.max())
        n_turns = len(ar) if not ar.empty else int(cells.turns.max())
        tokens = int(ar.new_tokens.sum()) if not ar.empty else int(cells.tokens.max())
        rows.append([Cell(task), Cell(ms, digits=1), Cell(1e3 / ms if ms > 0 else float("nan"), digits=1),
                     Cell(n_traj), Cell(n_turns), Cell(tokens), Cell(source)])
        records.append({"task": task, "ar_ms_per_token": ms, "ar_tokens_per_s": 1e3 / ms if ms > 0 else math.nan,
                        "n_trajectories": n_traj, "n_turns": n_turns, "tokens": tokens})
    if not rows:
        return None
    notes = ["ms/token = decode seconds / generated tokens over the task's decoded turns (target prefill "
             "excluded); tokens/s = its inverse", "the target runs as recorded in the configuration tables at "
             "the end of this page"]
    return Table("ar_baseline", f"The `{BASELINE}` baseline: target decode speed", ["Task", "ms/token", "tokens/s",
                 "trajectories", "turns", "tokens", "from"], rows, notes, pd.DataFrame(records))


SUMMARY_CSV_COLUMNS = ["task", "method", "temperature", "n_trajectories", "n_turns", "tau", "speedup",
                       "ar_ms_per_token", "differs_from_ar"]


def summary_table(summary: pd.DataFrame) -> Table:
    """tables/summary.csv: one row per (task, method), the numbers the headline quotes."""
    frame = summary.rename(columns={"trajectories": "n_trajectories", "turns": "n_turns"})[SUMMARY_CSV_COLUMNS]
    rows = []
    for r in summary.itertuples(index=False):
        differs = (f"{int(r.differs_from_ar)} of {int(r.compared_with_ar)}" if not math.isnan(r.differs_from_ar)
                   else "–")
        rows.append([Cell(r.task), Cell(r.method), Cell(r.temperature, digits=1), Cell(int(r.trajectories)),
                     Cell(int(r.turns)), Cell(r.tau, r.tau_ci_low, r.tau_ci_high, int(r.trajectories)),
                     Cell(r.speedup, r.speedup_ci_low, r.speedup_ci_high, int(r.trajectories)),
                     Cell(r.ar_ms_per_token, digits=1), Cell(differs)])
    notes = ["differs from ar = decoded turns whose output tokens differ from the `ar` output of the same task, "
             "sample and turn, out of those compared; only at T = 0, where a lossless method must reproduce `ar` "
             "(– where it does not apply)", conventions.TAU, conventions.SPEEDUP, stats.CI_CONVENTION]
    if any(r.trajectories < stats.MIN_TRAJECTORIES for r in summary.itertuples()):
        notes.insert(0, FEW_NOTE)
    return Table("summary", "Summary: every task × method",
                 ["Task", "Method", "T", "trajectories", "turns", "τ", "speedup", "ar ms/token", "differs from ar"],
                 rows, notes, frame)


# ---- context within each task ----------------------------------------------------------------------------------
def context_table(curves: pd.DataFrame) -> Table | None:
    """τ (with its break-even τ* where `curves` carries `tau_break_even`) and speedup per turn-context bin."""
    if curves.empty:
        return None
    with_star = "tau_break_even" in curves.columns
    rows = []
    for r in curves.itertuples(index=False):
        n = int(r.n_trajectories)
        few = stats.FEW_TURNS_MARK if int(r.n_turns) < stats.MIN_INTERVAL_TURNS and \
            n >= stats.MIN_INTERVAL_TRAJECTORIES else ""
        rows.append([Cell(r.task), Cell(r.method), Cell(f"{r.context_lo:,}–{r.context_hi:,}"), Cell(n),
                     Cell(int(r.n_turns)), Cell(int(r.n_steps)), Cell(r.tau, r.tau_lo, r.tau_hi, n, mark=few)]
                    + ([Cell(r.tau_break_even)] if with_star else [])
                    + [Cell(r.speedup, r.speedup_lo, r.speedup_hi, n, mark=few)])
    notes = [stats.CONTEXT_CONVENTION, conventions.TAU, conventions.SPEEDUP, stats.CI_CONVENTION,
             stats.FEW_TURNS_NOTE]
    if with_star:
        notes.insert(1, breakeven.BREAK_EVEN_CONVENTION)
    if (curves.n_trajectories < stats.MIN_TRAJECTORIES).any():
        notes.insert(0, FEW_NOTE)
    columns = list(stats.CONTEXT_CURVE_COLUMNS)
    if with_star:
        columns.insert(columns.index("tau_hi") + 1, "tau_break_even")
    return Table("speedup_vs_context", "τ, break-even τ* and speedup against context, within each task",
                 ["Task", "Method", "context (tokens)", "trajectories", "turns", "steps", "τ"]
                 + (["τ* (break-even)"] if with_star else []) + ["speedup"], rows, notes, curves[columns])


def cost_context_table(costs: pd.DataFrame) -> Table | None:
    if costs.empty:
        return None
    rows = []
    for r in costs.itertuples(index=False):
        drafting = r.method != BASELINE
        rows.append([Cell(r.task), Cell(r.method), Cell(f"{r.step_context_lo:,}–{r.step_context_hi:,}"),
                     Cell(int(r.n_steps)), Cell(r.ar_decode_ms, digits=1),
                     Cell(r.verify_ms if drafting else None, digits=1),
                     Cell(r.draft_ms if drafting else None, digits=2),
                     Cell(r.draft_state_bytes if drafting else None, unit="bytes")])
    notes = ["target 1-token decode = mean ms of the `ar` method's forward steps in the same task and step-context "
             "bin (what a drafter must beat per emitted token); verify = mean ms of the method's verify forward "
             "(its K+1 tokens); draft = mean ms of the drafter's work per step; state = mean draft-state bytes",
             stats.COST_CONTEXT_CONVENTION]
    return Table("cost_vs_context", "Cost against step context, within each task: target decode, verify and draft",
                 ["Task", "Method", "step context (tokens)", "steps", "target 1-token decode ms", "verify ms",
                  "draft ms", "draft state"], rows, notes, costs[stats.COST_CURVE_COLUMNS])


def break_even_table(overall: pd.DataFrame) -> Table | None:
    """Per task × drafting method: τ against its break-even τ* over the task's turns, the margin with its interval,
    and the speedup the two imply."""
    if overall.empty:
        return None
    rows = [[Cell(r.task), Cell(r.method), Cell(int(r.n_trajectories)), Cell(int(r.n_steps)), Cell(r.tau),
             Cell(r.tau_break_even), Cell(r.tau_margin, r.tau_margin_lo, r.tau_margin_hi, int(r.n_trajectories)),
             Cell(r.verify_ratio), Cell(r.draft_ratio),
             Cell(r.ar_decode_ms, digits=1), Cell(r.draft_ms, digits=2), Cell(r.verify_ms, digits=1),
             Cell(r.speedup_implied)] for r in overall.itertuples(index=False)]
    notes = [breakeven.BREAK_EVEN_CONVENTION,
             "τ − τ*: its 95 % interval resamples whole trajectories (τ and τ* together); speedup implied = τ / "
             "τ*_step, what the step costs alone predict (the measured speedup also pays the drafter's "
             "start-of-turn work)", stats.CI_CONVENTION]
    return Table("break_even", "τ against break-even τ*, per task",
                 ["Task", "Method", "trajectories", "steps", "τ", "τ*", "τ − τ*", "verify / decode", "draft / decode",
                  "target 1-token ms", "draft ms", "verify ms", "speedup implied"], rows, notes, overall)


# ---- the within-trajectory context effect --------------------------------------------------------------------------
def context_effect_table(effect: pd.DataFrame) -> Table | None:
    if effect.empty:
        return None
    rows = []
    for r in effect.itertuples(index=False):
        n = int(r.n_trajectories)
        rows.append([Cell(r.task), Cell(r.method), Cell(n), Cell(int(r.n_turns)),
                     Cell(r.slope_log_speedup, r.slope_lo, r.slope_hi, n, digits=3),
                     Cell(_change(r.slope_log_speedup, r.context_span)),
                     Cell(r.slope_tau, r.slope_tau_lo, r.slope_tau_hi, n, digits=3),
                     Cell(r.share_turns_above_1, digits=2, count=int(r.n_turns_all)),
                     Cell(r.context_span, digits=2)])
    notes = [effects.EFFECT_CONVENTION, "speedup change = the relative change of the speedup the slope b implies: "
             "per doubling of the context (2^b − 1) where the trajectories' contexts span about 2× or more, else "
             "over their median span (span^b − 1), since a slope fitted over a ×1.05 growth says nothing about a "
             "doubling (there it is mostly a later-turn effect)",
             "– = no trajectory of the cell has two turns at different contexts (e.g. a single-turn task: there "
             "context differs only between samples, which a within-trajectory estimate rightly does not read as a "
             "context effect)"]
    return Table("context_effect", "Context effect within trajectories (trajectory fixed effects)",
                 ["Task", "Method", "trajectories", "turns", "slope log speedup", "speedup change", "slope τ",
                  "share of turns > 1×", "context span ×"], rows, notes,
                 effect[effects.EFFECT_COLUMNS + ["n_turns_all", "context_span"]])


def _change(slope: float, span: float) -> str | None:
    """'+41% per doubling', or '+64% over ×1.05' where the trajectories' contexts grew less than ~2×."""
    if slope is None or not math.isfinite(slope):
        return None
    factor = 2.0 if not math.isfinite(span) or span >= 1.9 else span
    change = effects.change_over(slope, factor)
    return f"{change:+.0%} per doubling" if factor == 2.0 else f"{change:+.0%} over ×{span:.2f}"


# ---- the DLite paper's telemetry table -----------------------------------------------------------------------------
def telemetry_table(table: pd.DataFrame) -> Table | None:
    if table.empty:
        return None
    rows = [[Cell(r.task), Cell(r.method), Cell(r.aux_memory_bytes, unit="bytes"), Cell(r.tau), Cell(r.acc_pos1),
             Cell(r.acc_pos3), Cell(r.acc_pos5), Cell(r.ttft_ms, digits=1), Cell(r.itl_p50_ms, digits=1),
             Cell(r.itl_p95_ms, digits=1), Cell(r.turn_latency_ms, digits=0), Cell(r.speedup),
             Cell(f"{int(r.n_trajectories)} / {int(r.n_turns)}")] for r in table.itertuples(index=False)]
    notes = telemetry.TELEMETRY_CONVENTIONS + ["n = trajectories / decoded turns of the cell; no intervals here "
                                               "(they are in Table 1 and the summary)"]
    return Table("telemetry", "Telemetry per task and method (the DLite paper's table, on these runs)",
                 ["Task", "Method", "aux memory", "τ", "acc@1", "acc@3", "acc@5", "TTFT ms", "ITL P50 ms",
                  "ITL P95 ms", "turn latency ms", "speedup", "n"], rows, notes,
                 table[telemetry.TELEMETRY_COLUMNS + ["n_trajectories", "n_turns"]])


# ---- τ per-turn macro ------------------------------------------------------------------------------------------
def tau_macro_table(summary: pd.DataFrame, methods: list[str], tasks: list[str]) -> Table | None:
    methods = _drafting_methods(methods)
    cells = summary[summary.method.isin(methods)]
    if cells.empty:
        return None
    lookup = _summary_lookup(cells)
    rows = [[Cell(m)] + [Cell(lookup[(m, t)].tau_turn_macro) if (m, t) in lookup else Cell(None) for t in tasks]
            for m in methods]
    csv = cells[["method", "task", "tau_turn_macro", "tau", "turns"]]
    notes = ["τ (turn macro) = mean over decoded turns of each turn's pooled τ; every turn counts equally "
             "(the z-lab DFlash convention), unlike the pooled τ of Table 1", "no interval, so nothing is bolded"]
    return Table("tau_turn_macro", "τ, per-turn macro average", ["Method", *tasks], rows, notes, csv)


# ---- every (method, task) --------------------------------------------------------------------------------------
def results_table(summary: pd.DataFrame) -> Table:
    """Every cell with its counts: the place where skipped turns and the general-task speedups are shown."""
    header = ["Method", "Task", "T", "trajectories", "turns", "skipped", "steps", "tokens", "τ", "τ (turn macro)",
              "paired turns", "speedup"]
    rows = []
    for r in summary.itertuples(index=False):
        rows.append([Cell(r.method), Cell(r.task), Cell(r.temperature, digits=1), Cell(int(r.trajectories)),
                     Cell(int(r.turns)), Cell(int(r.skipped)), Cell(int(r.steps)), Cell(int(r.tokens)),
                     Cell(r.tau, r.tau_ci_low, r.tau_ci_high, int(r.trajectories)), Cell(r.tau_turn_macro),
                     Cell(int(r.paired_turns)),
                     Cell(r.speedup, r.speedup_ci_low, r.speedup_ci_high, int(r.trajectories))])
    notes = ([FEW_NOTE] if (summary.trajectories < stats.MIN_TRAJECTORIES).any() else []) + [conventions.TAU, conventions.SPEEDUP, stats.CI_CONVENTION, stats.SKIPPED_CONVENTION,
             "T = sampling temperature; turns = decoded turns; paired turns = those with an AR measurement"]
    return Table("all_results", "All results: every method × task, with counts", header, rows, notes, summary)


def repository_table(steps: pd.DataFrame, turns: pd.DataFrame) -> Table | None:
    """τ and paired speedup per repository, for tasks whose samples name one (SWE-Bench: TurnRecord.repo)."""
    if "repo" not in turns.columns or not (turns.repo.fillna("") != "").any():
        return None
    rows, records = [], []
    for (task, repo, method), cell in turns[turns.repo.fillna("") != ""].groupby(["task", "repo", "method"],
                                                                                 sort=True):
        if method == BASELINE:
            continue
        keys = set(zip(cell.run, cell.sample_id))
        cell_steps = steps[(steps.task == task) & (steps.method == method) &
                           pd.Series([k in keys for k in zip(steps.run, steps.sample_id)], index=steps.index)]
        record = {"task": task, "repo": repo, "method": method, "n_trajectories": cell.sample_id.nunique(),
                  "n_turns": len(metrics.decoded(cell)), "tau": metrics.tau(cell_steps),
                  "speedup": metrics.speedup(cell)}
        records.append(record)
        rows.append([Cell(task), Cell(repo), Cell(method), Cell(record["n_trajectories"]), Cell(record["n_turns"]),
                     Cell(record["tau"]), Cell(record["speedup"])])
    if not rows:
        return None
    notes = [conventions.TAU, conventions.SPEEDUP, "per repository of the SWE-Bench instance each trajectory "
             "solves (turns.parquet `repo`); no interval: most repositories hold one or two trajectories"]
    return Table("by_repository", "τ and speedup per repository", ["Task", "Repository", "Method", "trajectories",
                 "turns", "τ", "speedup"], rows, notes, pd.DataFrame(records))


# ---- per-position acceptance and draft lengths -------------------------------------------------------------------
def position_table(table: pd.DataFrame) -> Table | None:
    """Per task × drafting method (all of the task's steps): marginal and conditional acceptance per position, each
    rate with the steps behind it. `table` is `positions.position_table`; the CSV is all of it (terciles too)."""
    whole = table[table.context_part == "all"] if len(table) else table
    if whole.empty:
        return None
    k = int(whole.position.max())
    rows = []
    for (task, method), cell in whole.groupby(["task", "method"], sort=False):
        cell = cell.set_index("position").reindex(range(1, k + 1))
        row = [Cell(task), Cell(method), Cell(str(cell.kind.dropna().iloc[0]) if cell.kind.notna().any() else "")]
        row += [Cell(v, count=int(n)) if n and n > 0 else Cell(None) for v, n in zip(cell.marginal, cell.room)]
        row += [Cell(v, count=int(n)) if n and n > 0 else Cell(None) for v, n in zip(cell.conditional, cell.reached)]
        rows.append(row)
    positions_ = [str(j) for j in range(1, k + 1)]
    notes = [conventions.POSITION, "per task; n = the steps behind each rate (marginal: steps with room for j "
             "drafts; conditional: those that also reached j); – = a position never reached (no rate, not 0)",
             "kind: " + positions.DRAFT_LENGTH_CONVENTION.split("; a method is ")[1],
             "the CSV holds every count, per task and per context tercile (`context_part`)"]
    return Table("per_position", "Per-position acceptance per task", ["Task", "Method", "kind", *positions_,
                 *positions_], rows, notes, table,
                 groups=[("", 3), ("marginal", k), ("conditional", k)])


def position_tercile_table(table: pd.DataFrame) -> Table | None:
    """Marginal acceptance per position in each context tercile of each task."""
    parts = table[table.context_part != "all"] if len(table) else table
    if parts.empty:
        return None
    k = int(parts.position.max())
    rows = []
    for (task, method, part), cell in parts.groupby(["task", "method", "context_part"], sort=False):
        cell = cell.set_index("position").reindex(range(1, k + 1))
        label = f"{part}: {int(cell.context_lo.dropna().iloc[0]):,}–{int(cell.context_hi.dropna().iloc[0]):,}"
        rows.append([Cell(task), Cell(method), Cell(label)] +
                    [Cell(v, count=int(n)) if n and n > 0 else Cell(None) for v, n in zip(cell.marginal, cell.room)])
    notes = [positions.TERCILE_CONVENTION, "marginal as in the per-position table; n = steps with room for j"]
    return Table("per_position_terciles", "Marginal per-position acceptance per context tercile",
                 ["Task", "Method", "turn context (tokens)", *[str(j) for j in range(1, k + 1)]], rows, notes,
                 parts, groups=[("", 3), ("marginal", k)])


def draft_length_table(table: pd.DataFrame) -> Table | None:
    """Mean drafted length per step and acceptance per drafted token, per task × method, whole task and per
    tercile: the numbers that describe a variable-length drafter."""
    if table.empty:
        return None
    rows = []
    for r in table.itertuples(index=False):
        label = "all" if r.context_part == "all" else f"{r.context_part}: {int(r.context_lo):,}–{int(r.context_hi):,}"
        rows.append([Cell(r.task), Cell(r.method), Cell(r.kind), Cell(label), Cell(int(r.n_steps)),
                     Cell(r.mean_drafted), Cell(r.accept_rate_per_drafted_token), Cell(r.share_full_room),
                     Cell(r.tau)])
    notes = [positions.DRAFT_LENGTH_CONVENTION, positions.TERCILE_CONVENTION,
             "full room = share of steps that drafted all the room the budget allowed; τ over the same steps"]
    return Table("draft_length", "Draft length and acceptance per drafted token, per task and context tercile",
                 ["Task", "Method", "kind", "turn context", "steps", "mean drafted", "accepted / drafted",
                  "full room", "τ"], rows, notes, table)


# ---- cost ------------------------------------------------------------------------------------------------------
def cost_table(steps: pd.DataFrame, methods: list[str], tasks: list[str]) -> Table | None:
    rows, records = [], []
    for method in methods:
        for task in tasks:
            cell = steps[(steps.method == method) & (steps.task == task)]
            if cell.empty:
                continue
            c = stats.cost(cell)
            rows.append([Cell(method), Cell(task), Cell(c.draft_ms, digits=3), Cell(c.verify_ms, digits=1),
                         Cell(c.draft_verify_ratio, digits=3), Cell(int(round(c.median_context))),
                         Cell(c.bytes_at_median, unit="bytes"), Cell(int(c.max_context)),
                         Cell(c.bytes_at_max, unit="bytes")])
            records.append({"method": method, "task": task, **vars(c)})
    if not rows:
        return None
    notes = ["draft ms/step and verify ms/step are means over verify steps; draft/verify = total draft time / "
             "total verify time",
             "draft-state bytes: the drafter's memory after a step (history + working); at the median context = "
             "the step whose context length is nearest the median (median of ties), at the largest context = the "
             "maximum over the steps at the largest context length",
             "context = target KV length when the step starts"]
    header = ["Method", "Task", "draft ms/step", "verify ms/step", "draft/verify", "median ctx", "state @ median",
              "max ctx", "state @ max"]
    return Table("cost", "Cost per verify step and draft-state memory", header, rows, notes, pd.DataFrame(records))


# ---- degenerate turns --------------------------------------------------------------------------------------------
def degenerate_turns_table(turns: pd.DataFrame) -> Table | None:
    """Every flagged (task, sample, turn): which methods' replies were flagged and why."""
    if "degenerate" not in turns.columns:
        return None
    flagged = turns[turns.degenerate.astype(bool)]
    records = []
    for (run, task, sample, turn), group in flagged.groupby(["run", "task", "sample_id", "turn"], sort=False):
        every = set(group.method) == set(turns[(turns.task == task) & (turns.run == run)].method)
        records.append({"task": task, "run": run, "sample_id": sample, "turn": int(turn),
                        "context_len": int(group.context_len.iloc[0]),
                        "methods": "every method" if every else ", ".join(sorted(group.method)),
                        "reason": group.degenerate_reason.iloc[0]})
    csv = pd.DataFrame(records, columns=["task", "run", "sample_id", "turn", "context_len", "methods", "reason"])
    rows = [[Cell(r.task), Cell(r.sample_id), Cell(r.turn + 1), Cell(r.context_len), Cell(r.methods), Cell(r.reason)]
            for r in csv.itertuples(index=False)]
    notes = [conventions.DEGENERATE, "recorded per turn by the runner (turns.parquet `degenerate`, "
             "`degenerate_reason`); for runs written before, computed here from the stored output ids",
             "turn is 1-based here (0-based in the CSV and in turns.parquet)"]
    if not rows:
        notes.insert(0, "no turn is flagged")
    return Table("degenerate_turns", "Degenerate turns (the target repeats itself)",
                 ["Task", "Sample", "turn", "context", "flagged for", "evidence"], rows, notes, csv)


def without_degenerate_table(table: pd.DataFrame) -> Table | None:
    """Per task × drafting method: speedup and τ with every turn and without the flagged ones."""
    if table.empty:
        return None
    rows = []
    for r in table.itertuples(index=False):
        rows.append([Cell(r.task), Cell(r.method), Cell(int(r.flagged_turns)),
                     Cell(f"{int(r.n_turns)} → {int(r.n_turns_without)}"),
                     Cell(r.speedup, r.speedup_lo, r.speedup_hi), Cell(r.verdict),
                     Cell(r.speedup_without, r.speedup_without_lo, r.speedup_without_hi), Cell(r.verdict_without),
                     Cell(r.tau), Cell(r.tau_without)])
    notes = ["without = every turn flagged degenerate for any method left out for every method, so the pairs stay "
             "the same turns", decisions.FASTER_CONVENTION, stats.CI_CONVENTION]
    return Table("without_degenerate", "With and without degenerate turns",
                 ["Task", "Method", "flagged turns", "paired turns", "speedup", "against ar", "speedup without",
                  "against ar without", "τ", "τ without"], rows, notes, table)


# ---- issue 32: tested differences, the design gate, end to end, the policy, checks, hardware, noise ----------------
def design_table(design: pd.DataFrame) -> Table | None:
    if design.empty:
        return None
    rows = [[Cell(r.task), Cell(int(r.n_trajectories)), Cell(int(r.n_multi_turn)), Cell(int(r.n_spanning)),
             Cell(r.median_span, digits=2), Cell("yes" if r.measurable else "not measurable here"), Cell(r.reason)]
            for r in design.itertuples(index=False)]
    return Table("context_design", "Can this design show a context effect? (per task)",
                 ["Task", "trajectories", "multi-turn", f"growing ×{effects.MIN_DESIGN_SPAN:g}+", "median growth ×",
                  "context effect", "reason"], rows, [effects.DESIGN_CONVENTION], design)


def slope_difference_table(differences: pd.DataFrame) -> Table | None:
    """Every pair of methods on one task: the paired difference of their within-trajectory slopes."""
    if differences.empty:
        return None
    rows = []
    for r in differences.itertuples(index=False):
        n = int(r.n_trajectories)
        per_doubling = (f"{2 ** r.difference - 1:+.1%}" if r.measure == "log_speedup"
                        else f"{r.difference * math.log(2):+.3f} τ") if math.isfinite(r.difference) else None
        rows.append([Cell(r.task), Cell("log speedup" if r.measure == "log_speedup" else "τ"),
                     Cell(f"{r.method_a} − {r.method_b}"), Cell(n), Cell(r.slope_a, digits=3),
                     Cell(r.slope_b, digits=3),
                     Cell(r.difference, r.difference_lo, r.difference_hi, n, digits=3), Cell(per_doubling),
                     Cell("yes" if r.separable else "no"), Cell("yes" if r.measurable else "no")])
    notes = [effects.DIFFERENCE_CONVENTION, "per doubling: for log speedup the relative change of the speedup ratio "
             "a/b per doubling of the context (2^d − 1); for τ the change of τ(a) − τ(b) per doubling (d · ln 2)",
             stats.CI_CONVENTION]
    return Table("slope_differences", "Trends compared: paired differences of within-trajectory slopes",
                 ["Task", "measure", "a − b", "trajectories", "slope a", "slope b", "difference", "per doubling",
                  "interval excludes 0", "design measurable"], rows, notes, differences)


def end_to_end_table(table: pd.DataFrame) -> Table | None:
    if table.empty:
        return None
    rows = []
    for r in table.itertuples(index=False):
        n = int(r.n_trajectories)
        rows.append([Cell(r.task), Cell(r.method), Cell(n), Cell(int(r.n_turns)),
                     Cell(r.decode_speedup, r.decode_speedup_lo, r.decode_speedup_hi, n),
                     Cell(r.latency_speedup, r.latency_speedup_lo, r.latency_speedup_hi, n),
                     Cell(r.ttft_speedup, r.ttft_speedup_lo, r.ttft_speedup_hi, n, digits=3),
                     Cell(r.ttft_ms, digits=1), Cell(r.turn_latency_ms, digits=0),
                     Cell(r.itl_p50_ms, r.itl_p50_lo, r.itl_p50_hi, n, digits=1),
                     Cell(r.itl_p95_ms, r.itl_p95_lo, r.itl_p95_hi, n, digits=1),
                     Cell(r.itl_p99_ms, r.itl_p99_lo, r.itl_p99_hi, n, digits=1)])
    notes = [telemetry.E2E_CONVENTION, stats.CI_CONVENTION, "per-turn values: tables/end_to_end_turns.csv"]
    if (table.n_trajectories < stats.MIN_TRAJECTORIES).any():
        notes.insert(0, FEW_NOTE)
    return Table("end_to_end", "End to end beside decode-only: TTFT, decode and turn-latency speedups, ITL",
                 ["Task", "Method", "trajectories", "turns", "decode speedup", "turn-latency speedup",
                  "TTFT speedup", "TTFT ms", "turn latency ms", "ITL P50 ms", "ITL P95 ms", "ITL P99 ms"],
                 rows, notes, table)


def policy_table(table: pd.DataFrame) -> Table | None:
    if table.empty:
        return None
    rows = []
    for r in table.itertuples(index=False):
        n = int(r.n_trajectories)
        rows.append([Cell(r.task), Cell(r.switch_by), Cell(n), Cell(int(r.n_turns)), Cell(int(r.n_bins)),
                     Cell(r.fixed_choices),
                     Cell(r.fixed_speedup, r.fixed_speedup_lo, r.fixed_speedup_hi, n),
                     Cell(r.policy_speedup, r.policy_speedup_lo, r.policy_speedup_hi, n),
                     Cell(r.gain, r.gain_lo, r.gain_hi, n, digits=3), Cell(int(r.switches))])
    notes = [policy.POLICY_CONVENTION, f"split seed = the report's --seed ({int(table.split_seed.iloc[0])})",
             "fixed choice = the candidate each half chose for the other (first half's / second half's); switches = "
             "context bins where the policy's choice differs from the fixed one, summed over the two halves",
             policy.PREVIOUS_KIND_CONVENTION + " (a reply's own span kinds are known only after it is written, "
             "so the switch uses the previous reply's)", stats.CI_CONVENTION]
    if (table.n_trajectories < stats.MIN_TRAJECTORIES).any():
        notes.insert(0, FEW_NOTE)
    return Table("policy", "A speculation policy that switches by context, scored on held-out trajectories",
                 ["Task", "switch by", "trajectories", "turns", "bins", "fixed choice", "fixed speedup",
                  "policy speedup",
                  "gain (policy / fixed)", "switches"], rows, notes, table)


def choice_table(table: pd.DataFrame) -> Table | None:
    if table.empty:
        return None
    rows = []
    for r in table.itertuples(index=False):
        n = int(r.n_trajectories)
        few = stats.FEW_TURNS_MARK if int(r.n_turns) < stats.MIN_INTERVAL_TURNS and \
            n >= stats.MIN_INTERVAL_TRAJECTORIES else ""
        rows.append([Cell(r.task), Cell(f"{r.context_lo:,}–{r.context_hi:,}"), Cell(n), Cell(int(r.n_turns)),
                     Cell("no drafting (ar)" if r.best == BASELINE else r.best),
                     Cell(r.best_speedup, r.best_speedup_lo, r.best_speedup_hi, n, mark=few),
                     Cell("no drafting (ar)" if r.runner_up == BASELINE else r.runner_up),
                     Cell(r.runner_up_speedup)])
    notes = ["in-sample (all trajectories): the candidate with the highest pooled decode speedup in each context "
             "bin of the task, among the drafting methods and no drafting (`ar`, 1× by construction); the held-out "
             "score of choosing this way is the policy table", stats.FEW_TURNS_NOTE, stats.CI_CONVENTION]
    return Table("best_choice", "Best choice per task and context bin (methods and no drafting)",
                 ["Task", "context (tokens)", "trajectories", "turns", "best", "its speedup", "runner-up",
                  "runner-up speedup"], rows, notes, table)


def identity_table(table: pd.DataFrame) -> Table | None:
    if table.empty:
        return None
    rows = [[Cell(r.task), Cell(r.method), Cell(r.kind), Cell(int(r.n_steps)), Cell(r.tau, digits=3),
             Cell(r.tau_from_marginals, digits=3), Cell(f"{r.gap:+.3f}"), Cell(int(r.n_full_room_steps)),
             Cell(r.tau_full_room, digits=3), Cell(f"{r.gap_full_room:+.1e}"),
             Cell(r.tau_from_drafted_conditional, digits=3)] for r in table.itertuples(index=False)]
    return Table("tau_identity", "Check: τ = 1 + Σ marginal acceptance, per task and method",
                 ["Task", "Method", "kind", "steps", "τ", "1 + Σ marginal", "gap", "full-room steps",
                  "τ (full room)", "gap (full room)", "1 + Σ P(acc ≥ j | drafted ≥ j)"], rows,
                 [checks.IDENTITY_CONVENTION, conventions.TAU, conventions.POSITION], table)


def histogram_table(histogram: pd.DataFrame) -> Table | None:
    if histogram.empty:
        return None
    k = int(histogram.accepted.max())
    rows = []
    for method, cell in histogram.groupby("method", sort=False):
        shares = cell.set_index("accepted").share.reindex(range(k + 1)).fillna(0.0)
        rows.append([Cell(method), Cell(int(cell.steps.sum()))] + [Cell(f"{100 * v:.1f} %") for v in shares])
    return Table("accepted_length", "Accepted-length histogram per method (share of verify steps)",
                 ["Method", "steps"] + [f"{a} accepted" for a in range(k + 1)], rows,
                 [checks.HISTOGRAM_CONVENTION, "per task: the CSV (tables/accepted_length_by_task.csv)"], histogram)


def matrix_table(matrix: pd.DataFrame, tasks: list[str], methods: list[str]) -> Table | None:
    if matrix.empty:
        return None
    tasks = [t for t in tasks if t in set(matrix.task)]
    lookup = {(r.task, r.method): r for r in matrix.itertuples(index=False)}
    rows = []
    for method in [m for m in methods if m in set(matrix.method)]:
        row = [Cell(method)]
        for task in tasks:
            r = lookup.get((task, method))
            row += [Cell(r.tau_steps if r else None), Cell(r.tau_requests if r else None),
                    Cell(r.accept_per_drafted if r else None)]
        rows.append(row)
    groups = [("", 1)] + [(t, 3) for t in tasks]
    return Table("acceptance_matrix", "Acceptance matrix, task × method (SPEED-Bench style)",
                 ["Method"] + ["τ (steps)", "τ (requests)", "acc / drafted"] * len(tasks), rows,
                 [checks.MATRIX_CONVENTION], matrix, groups=groups)


def hardware_table(table: pd.DataFrame, notes: list[str]) -> Table | None:
    if table.empty:
        return None
    rows = []
    for r in table.itertuples(index=False):
        rows.append([Cell(r.task), Cell(r.method), Cell(r.surface), Cell(r.tau, digits=2),
                     Cell(r.tau_break_even, digits=2), Cell(r.verify_ratio, digits=2), Cell(r.draft_ratio, digits=2),
                     Cell(r.speedup_projected, digits=2) if not r.outside_share else
                     Cell(f"{r.speedup_projected:.2f} (extrapolated: {r.outside_share:.0%} of steps outside the "
                          "profiled contexts)"),
                     Cell(r.speedup_measured, digits=2),
                     Cell(f"{100 * r.validation_error:.1f} % ({int(r.validated_cells)} bins)"
                          if math.isfinite(r.validation_error) else
                          ("none: a model" if r.kind == "analytic model" else
                           "none: contexts outside the profiled range" if r.same_machine else
                           "none: another machine"))])
    return Table("other_hardware", "This answer on other hardware: measured acceptance priced by other cost surfaces",
                 ["Task", "Method", "cost surface", "τ (measured)", "τ*", "verify / decode", "draft / decode",
                  "projected speedup", "measured here", "validation error"], rows,
                 [hardware.HARDWARE_CONVENTION, conventions.TAU, *notes], table)


def crossing_table(frame: pd.DataFrame) -> Table | None:
    """Where each method's speedup crosses 1.0 against the context points (`points.crossings`)."""
    if frame.empty:
        return None
    rows = [[Cell(r.task), Cell(r.method), Cell(int(r.n_points)), Cell(r.speedup_first, digits=2),
             Cell(r.speedup_last, digits=2), Cell(r.crossing)] for r in frame.itertuples(index=False)]
    return Table("context_crossing", "Where the speedup crosses 1.0 against context (context points)",
                 ["Task", "Method", "points", "speedup at the first point", "at the last point", "crossing"], rows,
                 [points.CROSSING_CONVENTION, conventions.SPEEDUP], frame)


def published_context_table(frame: pd.DataFrame) -> Table | None:
    """Published acceptance against context beside ours at the nearest point (`points.published_beside`)."""
    if frame.empty:
        return None
    rows = []
    for r in frame.itertuples(index=False):
        context = f"{int(r.context):,}" if isinstance(r.context, (int, float)) and math.isfinite(r.context) else "–"
        ours = "–" if pd.isna(r.our_method) or not math.isfinite(r.our_tau) else \
            f"{r.our_tau:.2f} {decisions.format_interval(r.our_tau_lo, r.our_tau_hi)}".rstrip() + \
            f" ({r.our_method} at {int(r.our_point):,})"
        rows.append([Cell(f"{r.source}: {r.target}"), Cell(f"{r.method} ({r.variant})"), Cell(r.their_task),
                     Cell(context), Cell(r.their_tau, digits=2), Cell(r.task), Cell(ours)])
    return Table("published_context", "Published acceptance against context, beside ours at the nearest point",
                 ["published", "drafter", "their task", "context", "their τ", "our task", "our τ"], rows,
                 [points.PUBLISHED_CONVENTION, conventions.TAU], frame)
