"""MATH-500: single turn, the DFlash/DLite prompt format (docs/methods.md §3.4)."""

from __future__ import annotations

from evalsuite.tasks._source import HubSpec, prompted, single_turn_trajectories, task_rows
from evalsuite.tasks.base import DATA_DIR, LoadOptions, Trajectory, register_task

PROMPT = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
HUB = HubSpec("HuggingFaceH4/MATH-500", split="test")


@register_task("math500", "500 competition maths problems (MATH test subset of Let's Verify Step by Step), one turn",
               licence="MIT", source="openai/prm800k math_splits/test.jsonl; HF HuggingFaceH4/MATH-500 test")
def load(options: LoadOptions) -> list[Trajectory]:
    rows = task_rows("math500", options, DATA_DIR / "math500" / "test.jsonl", HUB)
    items = prompted(rows, "problem", PROMPT, lambda i, row: f"math500-{i}")
    return single_turn_trajectories(items, options)
