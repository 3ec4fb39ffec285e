"""Acceptance by span type and by copying: pure pandas over the steps, turns and spans tables.

**Where a step's drafts land in the output** (evalsuite/engines/loop.py `decode_turn`). Output position 0 is the token
the prefill produces; no step drafts it. Step s starts when the output holds n_s tokens (n_0 = 1, n_{s+1} = n_s +
emitted_s, so the steps' `emitted` sum to new_tokens - 1). Its j-th draft (j = 1 … num_drafted) proposes the token
at output position n_s + j - 1; the first num_accepted of them are accepted and are the output there, the bonus
(the target's own token) is at n_s + num_accepted. A rejected draft is counted at the position it aimed at,
whatever token the output holds there (at T = 0 the token the target chose, emitted by this or a later step).
Drafts aimed past the end of the reply (the turn stopped at an EOS inside the step) are counted at its last
position. So every drafted and accepted token of a labelled turn is counted at exactly one output position, and
the counts add up to the run's totals over those turns. A step *starts* in the span of position n_s, the first
position it drafts (and the one its bonus fills when nothing is accepted).

**Measures** per task × method × span (span: each kind of evalsuite.spans.KINDS; `copied` / `novel` by the copy
threshold; `all`):
- n_tokens, share_of_output: emitted tokens (output positions) in the span, and their share of the method's output;
- drafted, accepted: drafts aimed at positions in the span, and those accepted;
- acceptance_per_drafted = accepted / drafted;
- mean_accepted_per_step: mean accepted drafts (bonus excluded) of the steps that start in the span; steps the
  token budget left no room to draft are left out, as τ leaves them out (τ of those steps = this + 1).
The `ar` baseline drafts nothing and is left out. Turns without labels (or whose labels were a recorded skip) are
left out and counted by `coverage`.

**Copy ratio**: the share of a reply's tokens whose copy length reaches the threshold (copied from the context or
from earlier in the reply), and the share copied from the context alone; a property of the workload, so it is taken
from the `ar` turns where the runs have them (else from every method's turns pooled).

Importing this module does not import torch; the table and figure builders import the report's own modules when
called.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from evalsuite import metrics
from evalsuite.conventions import BASELINE
from evalsuite.errors import UserError
from evalsuite.spans import (COPY_SPANS, DEFAULT_THRESHOLD, KINDS, LABELLER_VERSION, SPANS_SCHEMA, SPANS_TABLE,
                             of_version)
from evalsuite.store.run_store import read_table
SPANS = (*KINDS, *COPY_SPANS, "all")
# Tasks whose samples carry function schemas, where a JSON object or call list is a tool call; elsewhere (MT-Bench,
# GSM8K, SWE-Bench's mini-swe-agent, which acts through shell code blocks) the labeller's `tool_call` kind is
# structured output (JSON, a call list) and is shown as "structured".
TASKS_WITH_TOOLS = ("bfcl-v3",)


def shown_kind(kind: str, task: str) -> str:
    """The name a span kind is shown under for a task: `tool_call` → "structured" where the task has no tools (a
    run with --data-path and a trajectory format may carry tools: shown as labelled, "tool call")."""
    base = str(task).split(" T=")[0].split(":")[0]
    if kind == "tool_call":
        return "tool call" if base in TASKS_WITH_TOOLS else "structured"
    return kind.replace("_", " ")
COLUMNS = ["task", "method", "span", "n_tokens", "share_of_output", "drafted", "accepted", "acceptance_per_drafted",
           "mean_accepted_per_step"]
COPY_COLUMNS = ["task", "contexts", "context_lo", "context_hi", "turns", "tokens", "copy_ratio",
                "context_copy_ratio"]
SPAN_CONVENTION = ("a step's j-th draft aims at output position n + j - 1, where n is the output length when the "
                   "step starts (position 0 is the prefill's token); rejected drafts count at the position they "
                   "aimed at, drafts past the reply's end at its last position; acceptance per drafted = accepted / "
                   "drafted there; mean accepted per step: steps that start (first drafted position) in the span, "
                   "bonus excluded, budget-limited steps left out")


def _keys(*frames: pd.DataFrame) -> list[str]:
    keys = ["method", "sample_id", "turn"]
    return (["run"] if all("run" in f.columns for f in frames) else []) + keys


def resolve_threshold(spans: pd.DataFrame, threshold: int | None) -> int:
    """The copy threshold: the one given, else the one the labels recorded (they must agree)."""
    if threshold is not None:
        if threshold < 1:
            raise UserError(f"copy threshold {threshold}: must be >= 1 (tokens)")
        return int(threshold)
    recorded = sorted(set(spans.threshold.dropna().astype(int))) if len(spans) else []
    if len(recorded) > 1:
        raise UserError(f"the span labels were made with copy thresholds {recorded}; pass one threshold")
    return recorded[0] if recorded else DEFAULT_THRESHOLD


def labelled(turns: pd.DataFrame, spans: pd.DataFrame) -> pd.DataFrame:
    """The decoded turns with usable labels: one row per turn with `task`, its `n_tokens` and the label lists.
    A label row whose length differs from the turn's output is not used (it was made for another output)."""
    keys = _keys(turns, spans)
    good = spans[(spans.skip_reason.fillna("") == "") & (spans.kind.map(len) == spans.n_tokens)]
    done = turns[turns.stop_reason != "skipped"]
    columns = [*keys, "kind", "copy_len", "context_copy_len"]
    both = done[[*keys, "task", "new_tokens", "context_len"]].merge(good[columns], on=keys, how="inner")
    return both[both.new_tokens == both.kind.map(len)].reset_index(drop=True)


def coverage(turns: pd.DataFrame, spans: pd.DataFrame) -> dict[str, int]:
    """Decoded turns, and how many of them have usable labels."""
    done = turns[turns.stop_reason != "skipped"]
    return {"decoded_turns": len(done), "labelled_turns": len(labelled(turns, spans))}


def _positions(steps: pd.DataFrame, rows: pd.DataFrame, threshold: int):
    """Per labelled turn: the emitted positions' labels, every drafted position (span and acceptance) and every
    counted step's start span. Returns three frames (tokens, drafts, starts), keyed by task and method."""
    keys = _keys(steps, rows)
    by_turn = {key: group for key, group in steps.groupby(keys, sort=False)}
    tokens, drafts, starts = [], [], []
    for row in rows.itertuples(index=False):
        key = tuple(getattr(row, k) for k in keys)
        kinds = np.asarray(row.kind, dtype=object)
        copied = np.asarray(row.copy_len) >= threshold
        n = len(kinds)
        tokens.append((row.task, row.method, kinds, copied))
        group = by_turn.get(key)
        if group is None or n == 0:
            continue
        group = group.sort_values("step")
        emitted = group.emitted.to_numpy(int)
        if int(emitted.sum()) + 1 != n:
            raise UserError(f"{row.method} {row.sample_id} turn {row.turn}: its steps emitted "
                            f"{int(emitted.sum()) + 1} tokens with the prefill's, its output has {n}")
        first = 1 + np.concatenate([[0], np.cumsum(emitted)[:-1]])  # n_s: the step's first drafted position
        drafted = group.num_drafted.to_numpy(int)
        accepted = group.num_accepted.to_numpy(int)
        offset = np.arange(drafted.sum()) - np.repeat(np.cumsum(drafted) - drafted, drafted)
        position = np.minimum(np.repeat(first, drafted) + offset, n - 1)
        drafts.append((row.task, row.method, kinds[position], copied[position], offset < np.repeat(accepted, drafted)))
        counted = ~group.budget_limited.to_numpy(bool) if "budget_limited" in group.columns \
            else np.ones(len(group), bool)
        start = np.minimum(first, n - 1)[counted]
        starts.append((row.task, row.method, kinds[start], copied[start], accepted[counted]))

    def frame(parts, names):
        if not parts:
            return pd.DataFrame(columns=["task", "method", *names])
        lengths = [len(p[2]) for p in parts]
        columns = {"task": np.repeat([p[0] for p in parts], lengths),
                   "method": np.repeat([p[1] for p in parts], lengths)}
        for i, name in enumerate(names):
            columns[name] = np.concatenate([np.asarray(p[2 + i]) for p in parts]) if sum(lengths) else []
        return pd.DataFrame(columns)

    return (frame(tokens, ["kind", "copied"]), frame(drafts, ["kind", "copied", "accepted"]),
            frame(starts, ["kind", "copied", "num_accepted"]))


def acceptance_by_span(steps: pd.DataFrame, turns: pd.DataFrame, spans: pd.DataFrame,
                       threshold: int | None = None) -> pd.DataFrame:
    """One row per task × drafting method × span (`COLUMNS`; the mapping and measures in the module docstring)."""
    threshold = resolve_threshold(spans, threshold)
    rows = labelled(turns[turns.method != BASELINE], spans)
    tokens, drafts, starts = _positions(steps[steps.method != BASELINE], rows, threshold)
    records = []
    for (task, method), own in tokens.groupby(["task", "method"], sort=False):
        own_drafts = drafts[(drafts.task == task) & (drafts.method == method)]
        own_starts = starts[(starts.task == task) & (starts.method == method)]
        for span in SPANS:
            records.append(_cell(task, method, span, own, own_drafts, own_starts))
    return pd.DataFrame(records, columns=COLUMNS)


def _in_span(frame: pd.DataFrame, span: str) -> pd.Series:
    if span == "all":
        return pd.Series(True, index=frame.index)
    if span in COPY_SPANS:
        return frame.copied.astype(bool) == (span == "copied")
    return frame.kind == span


def _cell(task, method, span, tokens, drafts, starts) -> dict:
    n_tokens = int(_in_span(tokens, span).sum())
    drafted_here = drafts[_in_span(drafts, span)]
    starting = starts[_in_span(starts, span)]
    drafted, accepted = len(drafted_here), int(drafted_here.accepted.astype(bool).sum())
    return {"task": task, "method": method, "span": span, "n_tokens": n_tokens,
            "share_of_output": n_tokens / len(tokens) if len(tokens) else float("nan"),
            "drafted": drafted, "accepted": accepted,
            "acceptance_per_drafted": accepted / drafted if drafted else float("nan"),
            "mean_accepted_per_step": float(starting.num_accepted.mean()) if len(starting) else float("nan")}


# ---- copy ratio ----------------------------------------------------------------------------------------------------
def copy_ratio_per_turn(turns: pd.DataFrame, spans: pd.DataFrame, threshold: int | None = None) -> pd.DataFrame:
    """One row per labelled turn: context_len, tokens, copy_ratio (copy length ≥ threshold), context_copy_ratio
    (from the context alone) and each kind's share of the reply."""
    threshold = resolve_threshold(spans, threshold)
    rows = labelled(turns, spans)
    keys = _keys(turns, spans)
    out = rows[[*keys, "task", "context_len"]].copy()
    out["tokens"] = rows.kind.map(len).astype(int)
    out["copied"] = rows.copy_len.map(lambda c: int((np.asarray(c) >= threshold).sum())).astype(int)
    out["context_copied"] = rows.context_copy_len.map(lambda c: int((np.asarray(c) >= threshold).sum())).astype(int)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["copy_ratio"] = out.copied / out.tokens
        out["context_copy_ratio"] = out.context_copied / out.tokens
        for kind in KINDS:
            out[f"share_{kind}"] = rows.kind.map(lambda ks, k=kind: sum(1 for x in ks if x == k)) / out.tokens
    return out


def reference_turns(per_turn: pd.DataFrame) -> pd.DataFrame:
    """The copy ratio is the workload's: per task, the `ar` turns when there are any, else all methods' turns."""
    parts = []
    for _, own in per_turn.groupby("task", sort=False):
        ar = own[own.method == BASELINE]
        parts.append(ar if len(ar) else own)
    return pd.concat(parts, ignore_index=True) if parts else per_turn


def _context_edges(contexts: pd.Series, bins: int = 3, min_turns: int = 3) -> np.ndarray:
    """Quantile edges [lo, hi) over one task's turn contexts: up to `bins` bins of about `min_turns` turns or more."""
    values = np.sort(contexts.to_numpy(float))
    count = int(max(1, min(bins, len(np.unique(values)) // max(1, min_turns))))
    inner = np.quantile(values, np.linspace(0, 1, count + 1)[1:-1], method="lower") if count > 1 else []
    return np.unique(np.concatenate([[values[0]], np.asarray(inner, float) + 1, [values[-1] + 1]]))


def copy_ratio_by_task(turns: pd.DataFrame, spans: pd.DataFrame, steps: pd.DataFrame | None = None,
                       threshold: int | None = None, bins: int = 3) -> pd.DataFrame:
    """Per task: one `all` row and one row per context bin (quantile bins of the task's turn contexts), with the
    pooled copy ratios of the reference turns (`reference_turns`) and, given the steps, τ of each drafting method
    over the same turns (`tau <method>` columns; τ as the report defines it, budget-limited steps left out)."""
    per_turn = reference_turns(copy_ratio_per_turn(turns, spans, threshold))
    records = []
    methods = [] if steps is None else sorted(set(steps.method) - {BASELINE})
    for task, own in per_turn.groupby("task", sort=False):
        edges = _context_edges(own.context_len, bins)
        index = np.clip(np.searchsorted(edges, own.context_len.to_numpy(float), side="right") - 1, 0, len(edges) - 2)
        groups = [("all", own)] + ([(f"bin{b}", own[index == b]) for b in range(len(edges) - 1)]
                                   if len(edges) > 2 else [])
        for label, cell in groups:
            if cell.empty:
                continue
            record = {"task": task, "contexts": label, "context_lo": int(cell.context_len.min()),
                      "context_hi": int(cell.context_len.max()), "turns": len(cell), "tokens": int(cell.tokens.sum()),
                      "copy_ratio": cell.copied.sum() / max(int(cell.tokens.sum()), 1),
                      "context_copy_ratio": cell.context_copied.sum() / max(int(cell.tokens.sum()), 1)}
            for method in methods:
                record[f"tau {method}"] = _tau(steps, task, method, cell)
            records.append(record)
    return pd.DataFrame(records, columns=[*COPY_COLUMNS, *[f"tau {m}" for m in methods]])


def _tau(steps: pd.DataFrame, task: str, method: str, turns: pd.DataFrame) -> float:
    """τ of `method` over the turns (sample, turn) of `turns` (pooled over steps, bonus included)."""
    own = steps[(steps.task == task) & (steps.method == method)]
    wanted = set(zip(turns.sample_id, turns.turn))
    own = own[[(s, t) in wanted for s, t in zip(own.sample_id, own.turn)]]
    return metrics.tau(own)


# ---- reading -------------------------------------------------------------------------------------------------
def load_spans(run_dir, version: str = LABELLER_VERSION) -> pd.DataFrame:
    """The span labels of one run directory (this labeller version), read by the store's reader as steps and turns
    are (parts of unfinished turns ignored, rows seen twice dropped); empty with the schema's columns when none."""
    return of_version(read_table(Path(run_dir), SPANS_TABLE, SPANS_SCHEMA), version)


def load_run_spans(results) -> pd.DataFrame:
    """The span labels of every run in a report's `Results` (evalsuite.report.load), with its `run` key and task
    label, as the steps and turns there carry them; empty when no run has been labelled."""
    frames = []
    for run in results.runs:
        spans = load_spans(run.path)
        if len(spans):
            spans["run"], spans["task"] = run.key, run.task_label
            frames.append(spans)
    if not frames:
        return SPANS_SCHEMA.empty_table().to_pandas().assign(run=pd.Series(dtype=str))
    return pd.concat(frames, ignore_index=True)


# ---- the report section ------------------------------------------------------------------------------------------


def _kind_shares(per_turn: pd.DataFrame, task: str = "") -> str:
    weights = per_turn.tokens
    shares = {kind: float((per_turn[f"share_{kind}"] * weights).sum() / max(weights.sum(), 1)) for kind in KINDS}
    return ", ".join(f"{share:.0%} {shown_kind(kind, task)}" for kind, share in
                     sorted(shares.items(), key=lambda kv: -kv[1]) if share >= 0.005)


def span_paragraph(acceptance: pd.DataFrame, copy: pd.DataFrame, per_turn: pd.DataFrame, threshold: int) -> str:
    """One generated paragraph: how much of each workload is copyable, and how each method does on copied and
    novel text (per drafted token)."""
    sentences = []
    reference = reference_turns(per_turn)
    for task in dict.fromkeys(copy.task):
        rows = copy[copy.task == task]
        whole = rows[rows.contexts == "all"].iloc[0]
        sentence = (f"On {task}, {whole.copy_ratio:.0%} of the reply tokens are copied (the {threshold} or more "
                    f"tokens ending there occur earlier in the context or the reply; {whole.context_copy_ratio:.0%} "
                    f"from the context alone; {int(whole.tokens):,} tokens in {int(whole.turns)} turns)")
        binned = rows[rows.contexts != "all"]
        if len(binned) >= 2:
            low, high = binned.iloc[0], binned.iloc[-1]
            sentence += (f", {low.copy_ratio:.0%} in the shortest contexts ({low.context_lo:,}–{low.context_hi:,} "
                         f"tokens) and {high.copy_ratio:.0%} in the longest ({high.context_lo:,}–{high.context_hi:,})")
        kinds = _kind_shares(reference[reference.task == task], task)
        sentence += f"; the replies are {kinds}." if kinds else "."
        cells = acceptance[acceptance.task == task].set_index(["method", "span"])
        pairs = []
        for method in dict.fromkeys(acceptance[acceptance.task == task].method):
            copied = cells.acceptance_per_drafted.get((method, "copied"), float("nan"))
            novel = cells.acceptance_per_drafted.get((method, "novel"), float("nan"))
            pairs.append((method, copied, novel))
        pairs.sort(key=lambda p: -(p[1] if pd.notna(p[1]) else -1))
        if pairs:
            listing = ", ".join(f"{m} {_rate(c)} and {_rate(n)}" for m, c, n in pairs)
            sentence += f" Accepted per drafted token on copied and on novel text: {listing}."
            novel_best = max(pairs, key=lambda p: p[2] if pd.notna(p[2]) else -1)
            if pd.notna(novel_best[2]):
                sentence += f" On novel text the best is {novel_best[0]} ({_rate(novel_best[2])})."
        sentences.append(sentence)
    return " ".join(sentences)


def _percent(share: float) -> str:
    return "<1%" if 0 < share < 0.005 else f"{share:.0%}"


def _rate(value) -> str:
    return "–" if value is None or pd.isna(value) else f"{value:.2f}"


def acceptance_table(acceptance: pd.DataFrame, threshold: int):
    """The acceptance-by-span frame as a report `Table` (tables/acceptance_by_span.*); spans with neither tokens
    nor drafts are left out of the printed rows (the CSV keeps every row)."""
    from evalsuite.report.formatting import Cell, Table

    shown = acceptance[(acceptance.n_tokens > 0) | (acceptance.drafted > 0)]
    rows = [[Cell(r.task), Cell(r.method), Cell(shown_kind(r.span, r.task)), Cell(int(r.n_tokens)), Cell(float(r.share_of_output), digits=3),
             Cell(int(r.drafted)), Cell(int(r.accepted)), Cell(float(r.acceptance_per_drafted)),
             Cell(float(r.mean_accepted_per_step))] for r in shown.itertuples()]
    notes = [f"span: the kind of text at the position (tool call on tasks with tools, structured (JSON, call "
             f"lists) elsewhere, code, prose, other; docs/spans.md), or copied "
             f"(copy length ≥ {threshold} tokens: the tokens ending there occur earlier in the context or the reply) "
             f"and novel; all: every position",
             SPAN_CONVENTION]
    header = ["Task", "Method", "Span", "Tokens", "Share of output", "Drafted", "Accepted", "Accepted / drafted",
              "Mean accepted / step"]
    return Table("acceptance_by_span", "Acceptance by span type and by copying", header, rows, notes,
                 acceptance[COLUMNS].reset_index(drop=True))


def copy_table(copy: pd.DataFrame, threshold: int):
    """The copy ratio per task (and per context bin within it), beside each method's τ (tables/copy_ratio.*)."""
    from evalsuite.report.formatting import Cell, Table

    taus = [c for c in copy.columns if c.startswith("tau ")]
    rows = []
    for r in copy.itertuples(index=False):
        record = r._asdict()
        label = "all" if r.contexts == "all" else f"{r.context_lo:,}–{r.context_hi:,}"
        rows.append([Cell(r.task), Cell(label), Cell(int(r.turns)), Cell(int(r.tokens)), Cell(float(r.copy_ratio)),
                     Cell(float(r.context_copy_ratio))]
                    + [Cell(float(value)) for value in list(record.values())[len(COPY_COLUMNS):]])
    notes = [f"copy ratio: share of reply tokens whose copy length is ≥ {threshold} tokens (a match in the context "
             "or earlier in the reply); from context: the match lies in the context; taken from the `ar` turns "
             "(the workload's own replies) where the runs have them",
             "contexts: all turns of the task, then quantile bins of its turn contexts (tokens, lowest–highest); τ of "
             "each method over the same turns (pooled, bonus included)"]
    header = ["Task", "Contexts", "Turns", "Tokens", "Copy ratio", "From context", *[f"τ {c[4:]}" for c in taus]]
    return Table("copy_ratio", "Copy ratio per task against context, beside τ", header, rows, notes,
                 copy.reset_index(drop=True))


def span_figure(acceptance: pd.DataFrame, tasks: list[str], methods: list[str]):
    """Accepted per drafted token by span (kinds, then copied / novel), methods side by side, one full-width panel
    per task (a row: room for six methods' bars over six spans), the drafted tokens behind each bar printed on it (a rate over 9 drafts must not look like one over 3,000); a
    span a method drafted nothing in has no bar. Returns a matplotlib Figure (Agg, no pyplot) or None when nothing
    was drafted."""
    from evalsuite.report.style import Palette, count, grid, legend

    cells = acceptance[acceptance.drafted > 0]
    tasks = [t for t in tasks if t in set(cells.task)]
    methods = [m for m in methods if m in set(cells.method)]
    if not tasks or not methods:
        return None
    palette = Palette(methods)
    figure, axes = grid(len(tasks), 1, height=2.1)
    width = 0.8 / len(methods)
    for r, task in enumerate(tasks):
        ax = axes[r, 0]
        own = acceptance[acceptance.task == task]
        present = [s for s in (*KINDS, *COPY_SPANS) if (own[own.span == s].n_tokens > 0).any()]
        # shares of the output pooled over the panel's methods: the kinds add to 100 %, copied + novel too
        pooled = own[own.span.isin(present)].groupby("span").n_tokens.sum()
        total_kinds = max(int(pooled.reindex(KINDS).fillna(0).sum()), 1)
        total_copy = max(int(pooled.reindex(COPY_SPANS).fillna(0).sum()), 1)
        x_of = {}
        for i, span in enumerate(present):
            x_of[span] = i + (0.6 if span in COPY_SPANS else 0.0)  # a gap between kinds and copied/novel
        for i, method in enumerate(methods):
            rows = own[(own.method == method) & own.span.isin(present)].set_index("span")
            x = np.array([x_of[s] for s in present]) + (i - (len(methods) - 1) / 2) * width
            values = np.array([rows.acceptance_per_drafted.get(s, np.nan) for s in present], float)
            drafted = np.array([rows.drafted.get(s, 0) for s in present], int)
            bars = ax.bar(x[drafted > 0], values[drafted > 0], width=width, color=palette(method), label=method)
            ax.bar_label(bars, labels=[f"n={count(n)}" for n in drafted[drafted > 0]], fontsize=5.5, rotation=90,
                         padding=1.0, color="#3b4550")
        shares = {s: pooled.get(s, 0) / (total_copy if s in COPY_SPANS else total_kinds) for s in present}
        ax.set_xticks([x_of[s] for s in present],
                      [f"{shown_kind(s, task)} {_percent(shares.get(s, 0))}" for s in present], fontsize=8)
        if any(s in COPY_SPANS for s in present) and any(s in KINDS for s in present):
            ax.axvline(max(x_of[s] for s in present if s in KINDS) + 0.8, color="#999999", linewidth=0.8)
        ax.set_ylim(0, 1.3)  # room for the n above a bar at 1
        ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
        ax.set_title(task, fontsize=9)
        ax.set_ylabel("accepted / drafted")
    legend(figure, axes)
    return figure


def span_section(results, directory, threshold: int | None = None, spans: pd.DataFrame | None = None):
    """The report section "Acceptance by span type and by copying": (items in page order: paragraph, figure,
    tables), written figure files, notes; all empty when no run of `results` holds span labels."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from evalsuite.report.style import DPI, STYLE, FigureFile

    spans = load_run_spans(results) if spans is None else spans
    if spans.empty:
        return [], [], []
    notes = []
    if threshold is None and spans.threshold.nunique() > 1:
        threshold = DEFAULT_THRESHOLD
        notes.append(f"the runs' span labels were made with copy thresholds {sorted(set(spans.threshold))}; the "
                     f"section applies {threshold} to all of them (copy lengths are stored whole)")
    threshold = resolve_threshold(spans, threshold)
    task_rank = {t: i for i, t in enumerate(results.tasks)}
    method_rank = {m: i for i, m in enumerate(results.methods)}
    acceptance = acceptance_by_span(results.steps, results.turns, spans, threshold)
    acceptance = acceptance.assign(
        _order=[(task_rank.get(t, 99), method_rank.get(m, 99), SPANS.index(s))
                for t, m, s in zip(acceptance.task, acceptance.method, acceptance.span)]
    ).sort_values("_order").drop(columns="_order").reset_index(drop=True)
    per_turn = copy_ratio_per_turn(results.turns, spans, threshold)
    copy = copy_ratio_by_task(results.turns, spans, results.steps, threshold)
    counts = coverage(results.turns, spans)
    if counts["labelled_turns"] < counts["decoded_turns"]:
        notes.append(f"span labels cover {counts['labelled_turns']} of {counts['decoded_turns']} decoded turns "
                     "(label the rest with `evalsuite label RUN_DIR`)")
    items: list = []
    files: list = []
    if acceptance.empty and copy.empty:
        return items, files, notes + ["span section: no labelled turns to show"]
    items.append(span_paragraph(acceptance, copy, per_turn, threshold))
    methods = [m for m in results.methods if m != BASELINE]
    with matplotlib.rc_context(STYLE):
        figure = span_figure(acceptance, results.tasks, methods)
        if figure is not None:
            directory = Path(directory)
            directory.mkdir(parents=True, exist_ok=True)
            png, svg = directory / "acceptance_by_span.png", directory / "acceptance_by_span.svg"
            FigureCanvasAgg(figure)
            figure.savefig(png, dpi=DPI, metadata={"Software": None})
            figure.savefig(svg, metadata={"Date": None, "Creator": None})
            caption = ("Accepted drafts per drafted token at positions of each kind (left) and at copied / novel "
                       f"positions (right; copied: copy length ≥ {threshold} tokens), methods side by side, one row "
                       "per task; n on each bar = the drafted tokens behind it (a span a method drafted nothing in "
                       "has no bar); under each span its share of the output tokens, pooled over the panel's methods "
                       "(the kinds add to 100 %, and copied + novel add to 100 %). A rejected draft counts at the "
                       "position it aimed at. JSON objects and call lists are \"tool call\" only on tasks with tools "
                       f"({', '.join(TASKS_WITH_TOOLS)}), \"structured\" elsewhere.")
            items.append(FigureFile("acceptance_by_span", "Acceptance per drafted token by span", caption, png, svg))
            files += [png, svg]
    if not copy.empty:
        items.append(copy_table(copy, threshold))
    if not acceptance.empty:
        items.append(acceptance_table(acceptance, threshold))
    return items, files, notes
