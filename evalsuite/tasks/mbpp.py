"""MBPP sanitized test split (257 problems): single turn, the bare `prompt` as DFlash/DLite send it."""

from __future__ import annotations

from evalsuite.tasks._source import HubSpec, single_turn_trajectories, task_rows, text_field, wants_hub
from evalsuite.tasks.base import DATA_DIR, LoadOptions, Trajectory, register_task

HUB = HubSpec("google-research-datasets/mbpp", name="sanitized", split="test")
TEST_TASK_IDS = range(11, 511)  # the upstream test split; the bundled file holds all 427 sanitized records


@register_task("mbpp", "257 basic Python problems (sanitized test split), one turn",
               licence="CC-BY-4.0 (data), Apache-2.0 (code)",
               source="google-research mbpp/sanitized-mbpp.json; HF google-research-datasets/mbpp sanitized/test")
def load(options: LoadOptions) -> list[Trajectory]:
    rows = task_rows("mbpp", options, DATA_DIR / "mbpp" / "sanitized-mbpp.json", HUB)
    items = []
    for index, (where, row) in enumerate(rows):
        task_id = row.get("task_id")
        if not wants_hub(options.data_path) and isinstance(task_id, int) and task_id not in TEST_TASK_IDS:
            continue  # the sanitized file mixes train/validation/prompt records with the test ones
        items.append((f"mbpp-{task_id if task_id is not None else index}", text_field(row, "prompt", where)))
    return single_turn_trajectories(items, options)
