"""HumanEval: single turn, the DFlash/DLite prompt format (docs/methods.md §3.4)."""

from __future__ import annotations

from evalsuite.tasks._source import HubSpec, prompt_task

PROMPT = "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{prompt}\n```"
HUB = HubSpec("openai/openai_humaneval", split="test")
# tasks/humaneval/task.toml: name, licence, source, data files, turns, scoring
load = prompt_task("humaneval", "prompt", PROMPT, HUB, lambda i, row: str(row.get("task_id") or f"humaneval-{i}"))
