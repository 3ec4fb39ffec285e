"""MT-Bench: 80 two-turn questions; turn 2 sees the model's own turn-1 answer (free-running, as DFlash/DLite)."""

from __future__ import annotations

from pathlib import Path

from evalsuite.errors import UserError
from evalsuite.workloads.base import TASKS_DIR, LoadOptions, Trajectory, read_jsonl, register_task, seeded_subset, \
    user_turn


@register_task("mt-bench", "80 two-turn chat questions in 8 categories; turn 2 follows the model's own answer",
               licence="Apache-2.0", source="lm-sys/FastChat llm_judge question.jsonl; HF HuggingFaceH4/mt_bench_prompts")
def load(options: LoadOptions) -> list[Trajectory]:
    path = Path(options.data_path) if options.data_path else TASKS_DIR / "mt_bench" / "question.jsonl"
    records = []
    for lineno, record in read_jsonl(path):
        turns = record.get("turns") or record.get("prompt")
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise UserError(f"{path}:{lineno}: record needs 'turns', a list of non-empty strings")
        qid = record.get("question_id", lineno)
        records.append(Trajectory(f"mt-bench-{qid}", [user_turn(t) for t in turns],
                                  meta={"category": record.get("category", "")}))
    return seeded_subset(records, options.limit, options.seed)
