"""HumanEval: single turn, the DFlash/DLite prompt format (docs/methods.md §3.4)."""

from __future__ import annotations

from evalsuite.tasks._source import HubSpec, prompted, single_turn_trajectories, task_rows
from evalsuite.tasks.base import LoadOptions, Trajectory, register_task
from evalsuite.tasks.description import describe

PROMPT = "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{prompt}\n```"
HUB = HubSpec("openai/openai_humaneval", split="test")
TASK = describe("humaneval")  # tasks/humaneval/task.toml: name, licence, source, data files, turns, scoring


@register_task(TASK)
def load(options: LoadOptions) -> list[Trajectory]:
    rows = task_rows("humaneval", options, TASK.data_file(), HUB)
    items = prompted(rows, "prompt", PROMPT, lambda i, row: str(row.get("task_id") or f"humaneval-{i}"))
    return single_turn_trajectories(items, options)
