"""GSM8K: single turn, the DFlash/DLite prompt format (docs/methods.md §3.4)."""

from __future__ import annotations

from evalsuite.tasks._source import HubSpec, prompted, single_turn_trajectories, task_rows
from evalsuite.tasks.base import LoadOptions, Trajectory, register_task
from evalsuite.tasks.description import describe

PROMPT = "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
HUB = HubSpec("openai/gsm8k", name="main", split="test")
TASK = describe("gsm8k")  # tasks/gsm8k/task.toml: name, licence, source, data files, turns, scoring


@register_task(TASK)
def load(options: LoadOptions) -> list[Trajectory]:
    rows = task_rows("gsm8k", options, TASK.data_file(), HUB)
    items = prompted(rows, "question", PROMPT, lambda index, row: f"gsm8k-{index}")
    return single_turn_trajectories(items, options)
