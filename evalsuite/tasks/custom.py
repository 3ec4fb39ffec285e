"""`--task custom --data-path FILE.jsonl`: your own trajectories, one JSON object per line.

- `{"id": ..., "messages": [...], "tools": [...]?}`: OpenAI-style chat messages (roles system, user, assistant,
  tool; assistant `tool_calls` and `tool` results allowed). Turn k is the k-th assistant message, replayed
  from the logged prefix under `--replay logged` (the default); messages after the last assistant message
  make a final turn where the model speaks without a logged reply.
- `{"id": ..., "prompt_ids": [...]}`: raw token ids, sent to the target as they are, with no chat template
  (replay mode "raw").

See docs/tasks.md for the full format and examples.
"""

from __future__ import annotations

from evalsuite.errors import UserError
from evalsuite.tasks._conversation import conversation_trajectory
from evalsuite.tasks._source import local_path, read_records
from evalsuite.tasks.base import LoadOptions, Trajectory, Turn, register_task, seeded_subset
from evalsuite.tasks.description import describe


def _sample_id(row: dict, where: str) -> str:
    value = row.get("id")
    if isinstance(value, bool) or not isinstance(value, (str, int)) or str(value).strip() == "":
        raise UserError(f"{where}: record needs an 'id' (a non-empty string or an integer)")
    return str(value)


def _raw_trajectory(sample_id: str, ids, where: str) -> Trajectory:
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                       for i in ids):
        raise UserError(f"{where}: 'prompt_ids' must be a non-empty list of non-negative integers")
    return Trajectory(sample_id, [Turn(new_messages=[], prompt_ids=list(ids))])


TASK = describe("custom")  # tasks/custom/task.toml: name, licence, source, subsets, turns, scoring


@register_task(TASK)
def load(options: LoadOptions) -> list[Trajectory]:
    if not options.data_path:
        raise UserError("--task custom needs --data-path FILE.jsonl with {\"id\", \"messages\"} or "
                        "{\"id\", \"prompt_ids\"} records (docs/tasks.md)")
    path = local_path(options.data_path)
    trajectories, seen = [], set()
    for where, row in read_records(path):
        sample_id = _sample_id(row, where)
        if sample_id in seen:
            raise UserError(f"{where}: id {sample_id!r} repeats an earlier record; ids must be unique")
        seen.add(sample_id)
        has_messages, has_ids = "messages" in row, "prompt_ids" in row
        if has_messages == has_ids:
            raise UserError(f"{where}: record needs exactly one of 'messages' or 'prompt_ids'")
        if has_ids:
            trajectories.append(_raw_trajectory(sample_id, row["prompt_ids"], where))
            continue
        tools = row.get("tools")
        if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
            raise UserError(f"{where}: 'tools' must be a list of function schemas (objects)")
        trajectories.append(conversation_trajectory(sample_id, row["messages"], where, trailing_turn=True,
                                                    tools=tools or None))
    if not trajectories:
        raise UserError(f"{path}: no records")
    return seeded_subset(trajectories, options.limit, options.seed)
