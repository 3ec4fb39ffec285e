"""`evalsuite label RUN_DIR`: span labels (evalsuite.spans) for the decoded turns of a stored run that have none.

The runner labels every turn it decodes; this labels runs written before it did. Each turn's context is rebuilt
from run.json with the tokenizer only (`replay.stored_contexts`, the same rebuild `evalsuite compare` uses), and
labelled by `spans.label_turn` as the runner labels it in memory, so both give the same rows. A turn whose rebuilt
context differs in length from the one the run recorded is a recorded skip with the reason, never labels against
the wrong context. The rows are added to the run's spans table as parts of their own (`store.write_added`, one per
sample); turns that already have labels of this labeller version are left as they are, so labelling twice adds
nothing.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from evalsuite.conventions import SKIPPED
from evalsuite.errors import UserError
from evalsuite.replay import stored_contexts
from evalsuite.report.spans import load_spans
from evalsuite.spans import (DEFAULT_THRESHOLD, LABELLER_VERSION, SPANS_SCHEMA, SPANS_TABLE, SpanRecord, label_turn,
                             skipped_turn, span_rows)
from evalsuite.store.run_store import read_run, write_added


@dataclass
class LabelSummary:
    run_dir: Path
    samples_written: int = 0
    turns_labelled: int = 0
    turns_skipped: int = 0
    turns_already_labelled: int = 0
    skip_reasons: list[str] = field(default_factory=list)  # one line per skipped turn
    notes: list[str] = field(default_factory=list)


def label_run(run_dir: str | Path, threshold: int = DEFAULT_THRESHOLD, chat=None, target: str | None = None,
              progress: Callable[[str], None] | None = None) -> LabelSummary:
    """Label every decoded turn of `run_dir` that has no labels of this labeller version yet. `chat`: the run's
    `ChatTokenizer` (default: loaded from `target`, else the target run.json names, without its weights)."""
    run_dir = Path(run_dir)
    if threshold < 1:
        raise UserError(f"--threshold {threshold}: must be >= 1 (tokens)")
    if not (run_dir / "turns.parquet").is_dir() or not (run_dir / "run.json").is_file():
        raise UserError(f"{run_dir}: not a run directory (no turns.parquet/ and run.json)")
    tables = read_run(run_dir)
    config = tables.config or {}
    decoded = tables.turns[tables.turns.stop_reason != SKIPPED]
    existing = load_spans(run_dir)
    have = set(zip(existing.method, existing.sample_id, existing.turn))
    todo = decoded[[key not in have for key in zip(decoded.method, decoded.sample_id, decoded.turn)]]
    summary = LabelSummary(run_dir, turns_already_labelled=len(decoded) - len(todo))
    recorded = sorted(set(existing.threshold.astype(int)) - {threshold})
    if recorded and len(todo):
        raise UserError(f"{run_dir}: its labels so far use copy threshold {recorded[0]}; label the rest with "
                        f"--threshold {recorded[0]} so that one run holds one threshold")
    if recorded:
        summary.notes.append(f"{summary.turns_already_labelled} turns were already labelled with copy threshold "
                             f"{', '.join(map(str, recorded))}; they keep it (labels are never rewritten; the copy "
                             "lengths are stored whole, so any threshold can be applied to them later)")
    if todo.empty:
        return summary
    if chat is None:
        from evalsuite.target.model import load_chat

        chat = load_chat(target or config.get("target") or "default")
    task = config.get("task", "")
    run_id = str(config.get("run_id") or run_dir.name)
    contexts = stored_contexts(config, tables.turns, chat, set(zip(todo.method, todo.sample_id)))
    cache: dict[tuple, SpanRecord] = {}  # methods that saw the same context and wrote the same reply share labels
    for sample, rows in todo.groupby("sample_id", sort=False):
        if progress:
            progress(sample)
        records = []
        for row in rows.sort_values(["method", "turn"]).itertuples(index=False):
            method, turn, output = row.method, int(row.turn), [int(i) for i in row.output_ids]
            context = contexts.get((method, sample, turn))
            reason = ""
            if context is None:
                reason = ("its sample is not in the task's data as loaded now" if not any(
                    k[:2] == (method, sample) for k in contexts) else "the task's data now has fewer turns for it")
            elif context.skipped:
                reason = f"the rebuilt context is a skip ({context.skip_reason}), but the run decoded this turn"
            elif len(context.ids) != int(row.context_len):
                reason = (f"the rebuilt context has {len(context.ids)} tokens, the run recorded {int(row.context_len)}"
                          " (data or template changed since the run)")
            if reason:
                records.append(skipped_turn(task=task, method=method, sample_id=sample, turn=turn, reason=reason,
                                            run_id=run_id, threshold=threshold, n_tokens=len(output),
                                            context_len=int(row.context_len)))
                summary.turns_skipped += 1
                summary.skip_reasons.append(f"{method} {sample} turn {turn}: {reason}")
                continue
            key = (tuple(context.ids), tuple(output))
            if key not in cache:
                cache[key] = label_turn(output, context.ids, chat.tokenizer, task=task, method=method,
                                        sample_id=sample, turn=turn, run_id=run_id, threshold=threshold)
            records.append(replace(cache[key], method=method, sample_id=sample, turn=turn))
            summary.turns_labelled += 1
        names = sorted(f"{r.method}\0{r.turn}" for r in records)
        part = hashlib.sha1("\0".join([LABELLER_VERSION, sample, *names]).encode()).hexdigest()[:16]
        write_added(run_dir, SPANS_TABLE, part, span_rows(records), SPANS_SCHEMA)
        summary.samples_written += 1
    return summary
