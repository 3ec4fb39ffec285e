"""GSM8K: single turn, the DFlash/DLite prompt format (methods.md §3.4)."""

from __future__ import annotations

from pathlib import Path

from evalsuite.errors import UserError
from evalsuite.workloads.base import TASKS_DIR, LoadOptions, Trajectory, read_jsonl, register_task, seeded_subset, \
    user_turn

PROMPT = "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}."


@register_task("gsm8k", "grade-school maths word problems (1,319 test questions), one turn",
               licence="MIT", source="openai/grade-school-math test.jsonl; HF openai/gsm8k main/test")
def load(options: LoadOptions) -> list[Trajectory]:
    path = Path(options.data_path) if options.data_path else TASKS_DIR / "gsm8k" / "test.jsonl"
    records = []
    for lineno, record in read_jsonl(path):
        question = record.get("question")
        if not isinstance(question, str) or not question.strip():
            raise UserError(f"{path}:{lineno}: record has no non-empty 'question'")
        records.append((f"gsm8k-{lineno - 1}", question))
    return [Trajectory(sample_id, [user_turn(PROMPT.format(question=q))])
            for sample_id, q in seeded_subset(records, options.limit, options.seed)]
