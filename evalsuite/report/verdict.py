"""The verdict per task and the caveat box: text generated from the frames, nothing typed
by hand.

`verdicts(speed, overall, effect)` takes
- speed:   `decisions.speed_table` (paired speedup, its [lo, hi] and the verdict against `ar`),
- overall: `breakeven.break_even_overall` (τ, its break-even τ*, the margin),
- effect:  `effects.context_effect` (within-trajectory slopes),
and says per task whether speculative decoding pays off (a method's speedup interval lies above 1), does not (every
method's interval lies below 1), or is not separable from `ar`, with the numbers, and whether it changes with
context within trajectories (a slope interval clear of 0), as a relative change per doubling of the context.

`caveat_box(configs, cards)` states what decides how far the result carries: target, hardware, window, drafter
training budget and sample size, from run.json dicts and the drafters' training reports (`card_facts`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from evalsuite.conventions import BASELINE
from evalsuite.report import noise as timing_noise
from evalsuite.report.decisions import format_interval
from evalsuite.report.load import REPO_ROOT, machines, task_label
from evalsuite.report.effects import change_over

VERDICT_COLUMNS = ["task", "label", "sentence"]
TIE_WITH_AR = "within timing noise of ar"  # a speedup whose distance from 1 is below the measured timing noise
MIN_SPAN_FOR_CONTEXT = 1.25  # as stats.task_context_edges: below this growth there is no context axis to speak of


def _method_numbers(row, overall_row) -> str:
    text = f"{row.speedup:.2f}×"
    interval = format_interval(row.speedup_lo, row.speedup_hi)
    text += f" {interval}" if interval else f" (n={row.n_trajectories})"
    if overall_row is not None:
        text += f", τ {overall_row.tau:.2f} vs break-even {overall_row.tau_break_even:.2f}"
    return f"{row.method} {text}"


def _join(items: list[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _percent(value: float) -> str:
    return f"{value:+.1%}" if abs(value) < 0.01 else f"{value:+.0%}"


def _over(span: float) -> tuple[float, str]:
    """The context growth a slope is read over: a doubling where trajectories span about that much, else their own
    median span (a slope fitted over 1.2× says nothing about a doubling)."""
    if np.isfinite(span) and span < MIN_SPAN_FOR_CONTEXT:
        return span, (f"from a trajectory's first to its last turn (its context grows only ×{span:.2f} there, so "
                      f"this is a later-turn effect more than a context effect)")
    if np.isfinite(span) and span < 1.9:
        return span, f"over its trajectories' typical context growth (×{span:.2f})"
    return 2.0, "per doubling of the context"


def context_clause(effect: pd.DataFrame, task: str, design: pd.DataFrame | None = None,
                   differences: pd.DataFrame | None = None) -> tuple[str, bool]:
    """(the sentence's context part, whether any method's speedup changes with context within trajectories).

    `design` (`effects.context_design`) gates the claim: where the task's trajectories do not grow their context
    ×2 over at least 5 trajectories the clause says "not measurable here" with the reason, whatever the slopes.
    `differences` (`effects.slope_differences`) is the only basis of a sentence comparing two methods' trends."""
    cells = effect[effect.task == task]
    with_slope = cells[np.isfinite(cells.slope_log_speedup.astype(float))]
    with_interval = with_slope[np.isfinite(with_slope.slope_lo.astype(float))]
    if with_slope.empty:
        return ("no trajectory here has two turns at different contexts, so there is no within-trajectory context "
                "effect to estimate (a context bin of this task compares different samples)"), False
    gate = design[design.task == task] if design is not None else pd.DataFrame()
    if len(gate) and not bool(gate.measurable.iloc[0]):
        return (f"whether the speedup changes with context is not measurable here: {gate.reason.iloc[0]} (the "
                "slopes are in the context-effect table, not read as a verdict)"), False
    if with_interval.empty:
        return (f"within trajectories the slopes rest on fewer than 3 trajectories "
                f"(n={int(with_slope.n_trajectories.max())}): no interval, no claim about context"), False
    moving = with_interval[(with_interval.slope_lo > 0) | (with_interval.slope_hi < 0)]
    n = int(with_interval.n_trajectories.max())
    span = float(with_interval.context_span.median()) if "context_span" in with_interval else float("nan")
    factor, words = _over(span)
    trends = trend_comparisons(differences, task, effect) if differences is not None else ""
    if moving.empty:
        low, high = with_interval.slope_log_speedup.min(), with_interval.slope_log_speedup.max()
        text = (f"within trajectories (n={n}) no method's speedup changes measurably with context: {words} the "
                f"estimates run from {_percent(change_over(low, factor))} to {_percent(change_over(high, factor))} "
                f"and every 95 % interval covers 0")
        return text + (f"; {trends}" if trends else ""), False
    parts = []
    for row in moving.itertuples():
        direction = "rises" if row.slope_log_speedup > 0 else "falls"
        parts.append(f"{row.method}'s speedup {direction} {abs(change_over(row.slope_log_speedup, factor)):.0%} "
                     f"{words} [{_percent(change_over(row.slope_lo, factor))}, "
                     f"{_percent(change_over(row.slope_hi, factor))}]")
    still = sorted(set(with_interval.method) - set(moving.method))
    tail = f"; the others' intervals cover 0 ({', '.join(still)})" if still else ""
    text = f"it changes with context within trajectories (n={n}): " + "; ".join(parts) + tail
    return text + (f". {trends[0].upper()}{trends[1:]}" if trends else ""), True


def _moves(row) -> int:
    """+1 rises, -1 falls, 0 interval covers 0 (or none) for one row of `effects.context_effect`."""
    if not np.isfinite(row.slope_lo):
        return 0
    return 1 if row.slope_lo > 0 else -1 if row.slope_hi < 0 else 0


def trend_comparisons(differences: pd.DataFrame, task: str, effect: pd.DataFrame) -> str:
    """Sentences that compare two methods' speedup trends, only where the paired slope difference's interval
    excludes 0 (`effects.slope_differences`, measure log_speedup); "" when none does. "a holds while b falls"
    needs, besides that, a's own interval covering 0 and b's below 0."""
    rows = differences[(differences.task == task) & (differences.measure == "log_speedup") &
                       differences.separable & differences.measurable]
    if differences[(differences.task == task) & (differences.measure == "log_speedup")].empty:
        return ""
    own = {r.method: r for r in effect[effect.task == task].itertuples()}
    if rows.empty:
        return ("no two methods' speedup trends can be told apart (every paired slope difference's 95 % interval "
                "covers 0)")
    parts = []
    for r in rows.itertuples():
        a, b = (r.method_a, r.method_b) if r.difference > 0 else (r.method_b, r.method_a)
        diff, low, high = (r.difference, r.difference_lo, r.difference_hi) if r.difference > 0 else \
            (-r.difference, -r.difference_hi, -r.difference_lo)
        numbers = (f"slope difference {diff:+.3f} [{low:+.3f}, {high:+.3f}], {_percent(2 ** diff - 1)} per doubling "
                   f"relative to {b}, paired over {int(r.n_trajectories)} trajectories")
        move_a = _moves(own[a]) if a in own else 0
        move_b = _moves(own[b]) if b in own else 0
        if move_a == 0 and move_b < 0:
            parts.append(f"{a} holds while {b} falls ({numbers})")
        elif move_a > 0 and move_b == 0:
            parts.append(f"{a} rises while {b} holds ({numbers})")
        else:
            parts.append(f"{a}'s speedup trend lies above {b}'s ({numbers})")
    return "paired trend tests: " + "; ".join(parts)


def end_to_end_clause(e2e: pd.DataFrame | None, task: str) -> str:
    """The verdict's end-to-end part: each method's turn-latency speedup (prefill + decode) beside the decode-only
    one, the fastest first (`telemetry.end_to_end`)."""
    if e2e is None or e2e.empty:
        return ""
    cells = e2e[(e2e.task == task) & (e2e.method != BASELINE)].sort_values("latency_speedup", ascending=False)
    cells = cells[np.isfinite(cells.latency_speedup.astype(float))]
    if cells.empty:
        return ""
    parts = []
    for r in cells.itertuples():
        interval = format_interval(r.latency_speedup_lo, r.latency_speedup_hi)
        parts.append(f"{r.method} {r.latency_speedup:.2f}×" + (f" {interval}" if interval else ""))
    return ("End to end (turn latency = shared prefill + decode, per token, paired with `ar`; the speedups above "
            "are decode-only): " + ", ".join(parts) + ".")


def verdict(task: str, speed: pd.DataFrame, overall: pd.DataFrame, effect: pd.DataFrame,
            learned: set[str] | None = None, design: pd.DataFrame | None = None,
            differences: pd.DataFrame | None = None, e2e: pd.DataFrame | None = None,
            noise: pd.DataFrame | None = None) -> tuple[str, str]:
    """(label, sentence) for one task. `learned`: the methods with a trained checkpoint, so the sentence can say
    whether any of them pays off (model-free methods often do where learned drafters do not); `design`,
    `differences`: see `context_clause`; `e2e`: `telemetry.end_to_end` (the end-to-end sentence); `noise`:
    `noise.noise_table`, where measured a speedup within the timing noise of 1 is a tie with `ar`, whatever its
    interval."""
    cells = speed[speed.task == task].sort_values("speedup", ascending=False).copy()
    if cells.empty:
        return "no data", f"{task}: no drafting method has paired turns."
    if noise is not None and not noise.empty:
        for index, row in cells.iterrows():
            if row.verdict in ("faster than ar", "slower than ar") and timing_noise.is_tie(
                    timing_noise.combined_noise(noise, task, row.method, BASELINE), float(row.speedup)):
                cells.loc[index, "verdict"] = TIE_WITH_AR
    by_method = {row.method: row for row in overall[overall.task == task].itertuples()}
    groups = {}
    for row in cells.itertuples():
        groups.setdefault(row.verdict, []).append(_method_numbers(row, by_method.get(row.method)))
    n, turns = int(cells.n_trajectories.max()), int(cells.n_turns.max())
    effect_cells = effect[effect.task == task]
    span = ""
    if len(effect_cells) and "context_min" in effect_cells:
        span = f", contexts {int(effect_cells.context_min.min()):,}–{int(effect_cells.context_max.max()):,} tokens"
    pieces = []
    if "faster than ar" in groups:
        pieces.append("speculative decoding pays off (decode-only speedup) with " + _join(groups["faster than ar"]))
    if "slower than ar" in groups:
        lead = "it does not with " if pieces else "speculative decoding does not pay off (decode-only speedup): "
        pieces.append(lead + _join(groups["slower than ar"]))
    if "not separable from ar" in groups:
        pieces.append(_join(groups["not separable from ar"]) + " cannot be told apart from `ar` "
                      "(interval across 1)")
    if TIE_WITH_AR in groups:
        pieces.append(_join(groups[TIE_WITH_AR]) + " within the timing noise of `ar` (|speedup − 1| below "
                      "√(CV² + CV²) of the two, measured over the repeats): a tie")
    undecided = [k for k in groups if k.startswith("no interval")]
    for key in undecided:
        pieces.append(_join(groups[key]) + ": too few trajectories for an interval")
    mine = [m for m in cells.method if learned and m in learned]
    if mine and len(mine) < len(cells):
        faster = [m for m in mine if m in set(cells[cells.verdict == "faster than ar"].method)]
        pieces.append(f"learned drafters faster than `ar`: {', '.join(faster)}" if faster else
                      f"no learned drafter ({', '.join(mine)}) is faster than `ar`")
    clause, moves = context_clause(effect, task, design, differences)
    if "faster than ar" in groups:
        label = "pays off"
    elif set(groups) == {"slower than ar"}:
        label = "does not pay off"
    elif undecided and len(undecided) == len(groups):
        label = "undecided"
    elif set(groups) <= {TIE_WITH_AR, "slower than ar"} and TIE_WITH_AR in groups:
        label = "ties with ar (within timing noise)"
    else:
        label = "not separable from ar" if "not separable from ar" in groups else "does not pay off"
    if moves:
        label += "; changes with context"
    elif clause.startswith("whether the speedup changes with context is not measurable"):
        label += "; context effect not measurable here"
    sentence = f"{task} ({n} trajectories, {turns} turns{span}): " + "; ".join(pieces) + f". {clause[0].upper()}" \
               f"{clause[1:]}."
    tail = end_to_end_clause(e2e, task)
    return label, sentence + (f" {tail}" if tail else "")


def verdicts(speed: pd.DataFrame, overall: pd.DataFrame, effect: pd.DataFrame,
             tasks: list[str] | None = None, learned: set[str] | None = None,
             degenerate: pd.DataFrame | None = None, design: pd.DataFrame | None = None,
             differences: pd.DataFrame | None = None, e2e: pd.DataFrame | None = None,
             noise: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per task: label and sentence (VERDICT_COLUMNS); with `degenerate`
    (`decisions.degenerate_comparison`) the sentence ends with what its flagged turns change."""
    tasks = tasks or list(dict.fromkeys(speed.task))
    rows = []
    for task in tasks:
        label, sentence = verdict(task, speed, overall, effect, learned, design, differences, e2e, noise)
        if degenerate is not None:
            sentence = " ".join(p for p in (sentence, degenerate_clause(degenerate, task)) if p)
        rows.append(dict(zip(VERDICT_COLUMNS, (task, label, sentence))))
    return pd.DataFrame(rows, columns=VERDICT_COLUMNS)


def degenerate_clause(table: pd.DataFrame, task: str) -> str:
    """What the task's degenerate turns change: the verdicts against `ar` that differ without them, else the largest
    move of a speedup."""
    cells = table[table.task == task]
    flagged = int(cells.flagged_turns.max()) if len(cells) else 0
    if not flagged:
        return ""
    noun = f"{flagged} degenerate turn{'s' if flagged != 1 else ''}"
    changed = cells[cells.verdict != cells.verdict_without]
    moves = [f"{r.method} {r.speedup:.2f}× → {r.speedup_without:.2f}× ({r.verdict_without})"
             for r in changed.itertuples()]
    if moves:
        return f"Without its {noun} (the target repeats itself; listed below) the verdict changes: {_join(moves)}."
    delta = (cells.speedup_without - cells.speedup).abs()
    if delta.notna().any():
        row = cells.loc[delta.idxmax()]
        return (f"Without its {noun} every verdict against `ar` stays (the largest move: {row.method} "
                f"{row.speedup:.2f}× → {row.speedup_without:.2f}×).")
    return f"Without its {noun} nothing is left to compare."


# ---- the caveat box ------------------------------------------------------------------------------------------------
def card_facts(report: dict) -> dict:
    """The training budget facts of one drafter from its training_report.json dict."""
    data = report.get("data") or {}
    init = report.get("init") or {}
    heldout = data.get("heldout") or {}
    seconds = report.get("training_seconds")
    return {"method": report.get("method"), "steps": report.get("steps"),
            "training_minutes": float(seconds) / 60 if seconds is not None else None,
            "threads": report.get("torch_threads"), "reply_tokens": data.get("reply_tokens"),
            "sequences": data.get("sequences") or data.get("prompts"),
            "warm_start": init.get("from") if isinstance(init, dict) else None,
            "data_sources": list(report.get("data_sources") or []),
            "heldout_rule": heldout.get("rule"), "heldout_trajectory_rule": heldout.get("trajectory_rule"),
            "heldout_tasks": dict(heldout.get("samples_per_task") or {})}


def read_card_facts(directory: str | Path) -> dict | None:
    """card_facts of `directory/training_report.json`, or None when the drafter has none (e.g. not trained here)."""
    path = Path(directory) / "training_report.json"
    if not path.is_file():
        return None
    return card_facts(json.loads(path.read_text()))


def _distinct(values) -> list:
    return list(dict.fromkeys(v for v in values if v not in (None, "")))


def _sample_size(config: dict) -> int | None:
    ids = config.get("sample_ids")
    return len(ids) if ids else config.get("limit")


def replay_source(config: dict, single_turn: bool = False) -> str:
    """Where the replies in each turn's context came from: run.json's `replay_source` (recorded since it existed),
    else from the replay mode and the task's source."""
    if single_turn:
        return "single-turn samples: no earlier replies in any context"
    if config.get("replay_source"):
        return str(config["replay_source"])
    if config.get("replay") == "logged":
        source = f" ({config['task_source']})" if config.get("task_source") else ""
        return f"logged replies from the task data{source}"
    return "each method's own earlier replies"


def drafter_cards(runs) -> dict[str, dict | None]:
    """{method: card_facts} for every learned drafter of the runs (a checkpoint in run.json), read from the
    checkpoint directory's training_report.json (None where there is none). The checkpoint path is resolved as
    recorded, else relative to the repository root (run.json keeps repository paths portable)."""
    cards = {}
    for run in runs:
        for method, info in (run.config.get("drafters") or {}).items():
            if method in cards or not isinstance(info, dict) or not info.get("checkpoint"):
                continue
            recorded = Path(str(info["checkpoint"])).expanduser()
            candidates = [recorded] if recorded.is_absolute() else [REPO_ROOT / recorded, recorded]
            found = next((c for c in candidates if (c / "training_report.json").is_file()), None)
            cards[method] = read_card_facts(found) if found is not None else None
            if cards[method] is not None:
                cards[method]["card"] = (found / "MODEL_CARD.md").is_file()
    return cards


def heldout_line(cards: dict[str, dict | None], tasks: list[str]) -> str | None:
    """Whether the drafters' training data held out these tasks' samples, from their training reports."""
    known = {m: c for m, c in cards.items() if c and c.get("heldout_rule")}
    if not cards:
        return None
    if not known:
        return ("Held out: no training report states which evaluation samples the drafters' training excluded, so "
                "train/test overlap is not ruled out here.")
    base = [t.split(" T=")[0].split(":")[0] for t in tasks]  # a label's task (no subset, no temperature)
    covered = [m for m, c in known.items() if all(t in c["heldout_tasks"] for t in base)]
    missing = sorted(set(cards) - set(covered))
    rules = _distinct(c["heldout_rule"] for c in known.values())
    text = (f"Held out: the training data of {', '.join(covered) or 'no drafter'} excluded every sample of "
            f"{', '.join(dict.fromkeys(base))} (rule: {'; '.join(rules)}")
    trajectory_rules = _distinct(c.get("heldout_trajectory_rule") for c in known.values())
    if trajectory_rules:
        text += f"; agent trajectories: {'; '.join(trajectory_rules)}"
    text += ")"
    if missing:
        text += f"; not stated for {', '.join(missing)}"
    return text + "."


def caveat_box(configs: list[dict], cards: dict[str, dict] | None = None,
               counts: dict[str, tuple[int, int]] | None = None, tasks: list[str] | None = None) -> list[str]:
    """Lines of the caveat box (plain text with `code` marks), from run.json dicts, {method: card_facts} and
    {task label: (trajectories, decoded turns)} as analysed."""
    lines = []
    targets = _distinct(f"{c.get('target_name') or c.get('target')} (sha256 {str(c.get('target_sha256'))[:12]}…, "
                        f"{c.get('dtype')})" for c in configs)
    lines.append("Target: " + "; ".join(targets) + ".")
    hardware = _distinct(_hardware(c) for c in configs)
    lines.append("Hardware: " + "; ".join(hardware) + ".")
    windows = _distinct(c.get("target_max_context") for c in configs)
    policies = _distinct(c.get("context_policy") for c in configs)
    budgets = _distinct(f"{c.get('task')} {c.get('max_new_tokens')}" for c in configs)
    lines.append(f"Window: {', '.join(f'{w:,}' for w in windows)} tokens (context policy {', '.join(policies)}); "
                 f"new tokens per turn: {', '.join(budgets)}; "
                 f"K = {', '.join(map(str, _distinct(c.get('k') for c in configs)))}; "
                 f"T = {', '.join(map(str, _distinct(c.get('temperature') for c in configs)))}; timing repeats "
                 f"{', '.join(map(str, _distinct(c.get('repeats', 1) for c in configs)))}.")
    sizes = []
    for c in configs:
        label = task_label(c.get("task", "?"), c.get("subset"), c.get("temperature"))  # as the tables label it
        n = _sample_size(c)
        analysed = (counts or {}).get(label)
        text = f"{label} {n} samples"
        if analysed:
            text += f" ({analysed[0]} trajectories, {analysed[1]} turns decoded per method)"
        elif c.get("max_turns"):
            text += f", up to {c.get('max_turns')} turns each"
        single = analysed is not None and analysed[0] == analysed[1]
        if single:
            text += ", single-turn (no earlier replies in any context)"
        elif c.get("replay"):
            text += f", {c.get('replay')} replay: {replay_source(c)}"
        sizes.append(text)
    lines.append("Sample size and replay: " + "; ".join(_distinct(sizes)) + ".")
    if cards:
        parts = []
        for method, facts in cards.items():
            if not facts:
                parts.append(f"{method}: no training report")
                continue
            text = f"{method} {facts['steps']:,} steps" if facts.get("steps") is not None else method
            if facts.get("training_minutes") is not None:
                threads = f" on {facts['threads']} CPU thread{'s' if facts['threads'] != 1 else ''}" \
                    if facts.get("threads") else ""
                text += f", {facts['training_minutes']:.0f} min{threads}"
            if facts.get("reply_tokens"):
                text += f", {facts['reply_tokens']:,} reply tokens"
            if facts.get("warm_start"):
                text += f" (warm-started from an earlier {facts['warm_start']} checkpoint, whose budget is not counted)"
            parts.append(text)
        lines.append("Drafter training budget: " + "; ".join(parts) + ".")
        held = heldout_line(cards, tasks or _distinct(c.get("task") for c in configs))
        if held:
            lines.append(held)
    return lines


def _hardware(config: dict) -> str:
    env = config.get("environment") or {}
    decoded_on = machines(config)
    text = ", then ".join(decoded_on) or config.get("device") or "?"
    if len(decoded_on) > 1:  # resumed on another machine
        text += " (resumed on another machine: each turn is paired with `ar` on the machine that decoded it)"
    if env.get("cuda"):
        text += f", CUDA {env['cuda']}" if isinstance(env["cuda"], str) else ""
    scaleout = config.get("scaleout") or {}
    if scaleout.get("shared_cpu"):
        text += ", CPU shared with other jobs"
    if config.get("weight_layout"):
        text += f", weights {config['weight_layout']}"
    return text
