"""GSM8K: single turn, the DFlash/DLite prompt format (methods.md §3.4)."""

from __future__ import annotations

from evalsuite.tasks._source import HubSpec, single_turn_trajectories, task_rows, text_field
from evalsuite.tasks.base import DATA_DIR, LoadOptions, Trajectory, register_task

PROMPT = "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
HUB = HubSpec("openai/gsm8k", name="main", split="test")


@register_task("gsm8k", "grade-school maths word problems (1,319 test questions), one turn",
               licence="MIT", source="openai/grade-school-math test.jsonl; HF openai/gsm8k main/test")
def load(options: LoadOptions) -> list[Trajectory]:
    rows = task_rows("gsm8k", options, DATA_DIR / "gsm8k" / "test.jsonl", HUB)
    items = [(f"gsm8k-{index}", PROMPT.format(question=text_field(row, "question", where)))
             for index, (where, row) in enumerate(rows)]
    return single_turn_trajectories(items, options)
