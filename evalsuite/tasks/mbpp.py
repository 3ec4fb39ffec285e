"""MBPP sanitized test split (257 problems): single turn, the bare `prompt` as DFlash/DLite send it."""

from __future__ import annotations

from evalsuite.tasks._source import HubSpec, single_turn_trajectories, task_rows, text_field, wants_hub
from evalsuite.tasks.base import LoadOptions, Trajectory, register_task
from evalsuite.tasks.description import describe

HUB = HubSpec("google-research-datasets/mbpp", name="sanitized", split="test")
TASK = describe("mbpp")  # tasks/mbpp/task.toml: name, licence, source, data files, turns, scoring
TEST_TASK_IDS = range(11, 511)  # the upstream test split; the bundled file holds all 427 sanitized records


@register_task(TASK)
def load(options: LoadOptions) -> list[Trajectory]:
    rows = task_rows("mbpp", options, TASK.data_file(), HUB)
    items = []
    for index, (where, row) in enumerate(rows):
        task_id = row.get("task_id")
        if not wants_hub(options.data_path) and isinstance(task_id, int) and task_id not in TEST_TASK_IDS:
            continue  # the sanitized file mixes train/validation/prompt records with the test ones
        items.append((f"mbpp-{task_id if task_id is not None else index}", text_field(row, "prompt", where)))
    return single_turn_trajectories(items, options)
