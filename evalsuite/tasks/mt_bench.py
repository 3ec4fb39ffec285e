"""MT-Bench: 80 two-turn questions; turn 2 sees the model's own turn-1 answer (free-running, as DFlash/DLite)."""

from __future__ import annotations

from evalsuite.errors import UserError
from evalsuite.tasks._source import HubSpec, task_rows
from evalsuite.tasks.base import LoadOptions, Trajectory, register_task, seeded_subset, user_turn
from evalsuite.tasks.description import describe

HUB = HubSpec("HuggingFaceH4/mt_bench_prompts", split="train")
TASK = describe("mt-bench")  # tasks/mt_bench/task.toml: name, licence, source, data files, turns, scoring


@register_task(TASK)
def load(options: LoadOptions) -> list[Trajectory]:
    rows = task_rows("mt-bench", options, TASK.data_file(), HUB)
    records = []
    for index, (where, record) in enumerate(rows):
        turns = record.get("turns") or record.get("prompt")  # FastChat names them turns, the HF copy prompt
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise UserError(f"{where}: record needs 'turns', a list of non-empty strings")
        qid = record.get("question_id", index + 1)
        records.append(Trajectory(f"mt-bench-{qid}", [user_turn(t) for t in turns],
                                  meta={"category": record.get("category", "")}))
    return seeded_subset(records, options.limit, options.seed)
