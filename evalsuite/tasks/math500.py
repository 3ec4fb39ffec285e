"""MATH-500: single turn, the DFlash/DLite prompt format (docs/methods.md §3.4)."""

from __future__ import annotations

from evalsuite.tasks._source import HubSpec, prompted, single_turn_trajectories, task_rows
from evalsuite.tasks.base import LoadOptions, Trajectory, register_task
from evalsuite.tasks.description import describe

PROMPT = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
HUB = HubSpec("HuggingFaceH4/MATH-500", split="test")
TASK = describe("math500")  # tasks/math500/task.toml: name, licence, source, data files, turns, scoring


@register_task(TASK)
def load(options: LoadOptions) -> list[Trajectory]:
    rows = task_rows("math500", options, TASK.data_file(), HUB)
    items = prompted(rows, "problem", PROMPT, lambda i, row: f"math500-{i}")
    return single_turn_trajectories(items, options)
