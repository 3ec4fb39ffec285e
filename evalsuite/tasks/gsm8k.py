"""GSM8K: single turn, the DFlash/DLite prompt format (docs/methods.md §3.4)."""

from __future__ import annotations

from evalsuite.tasks._source import HubSpec, prompted, single_turn_trajectories, task_rows
from evalsuite.tasks.base import DATA_DIR, LoadOptions, Trajectory, register_task

PROMPT = "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
HUB = HubSpec("openai/gsm8k", name="main", split="test")


@register_task("gsm8k", "grade-school maths word problems (1,319 test questions), one turn",
               licence="MIT", source="openai/grade-school-math test.jsonl; HF openai/gsm8k main/test")
def load(options: LoadOptions) -> list[Trajectory]:
    rows = task_rows("gsm8k", options, DATA_DIR / "gsm8k" / "test.jsonl", HUB)
    items = prompted(rows, "question", PROMPT, lambda index, row: f"gsm8k-{index}")
    return single_turn_trajectories(items, options)
