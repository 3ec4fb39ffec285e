"""HumanEval: single turn, the DFlash/DLite prompt format (docs/methods.md §3.4)."""

from __future__ import annotations

from evalsuite.tasks._source import HubSpec, prompted, single_turn_trajectories, task_rows
from evalsuite.tasks.base import DATA_DIR, LoadOptions, Trajectory, register_task

PROMPT = "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{prompt}\n```"
HUB = HubSpec("openai/openai_humaneval", split="test")


@register_task("humaneval", "164 hand-written Python function problems, one turn",
               licence="MIT", source="openai/human-eval HumanEval.jsonl.gz; HF openai/openai_humaneval test")
def load(options: LoadOptions) -> list[Trajectory]:
    rows = task_rows("humaneval", options, DATA_DIR / "humaneval" / "HumanEval.jsonl.gz", HUB)
    items = prompted(rows, "prompt", PROMPT, lambda i, row: str(row.get("task_id") or f"humaneval-{i}"))
    return single_turn_trajectories(items, options)
