"""GSM8K: single turn, the DFlash/DLite prompt format (docs/methods.md §3.4)."""

from __future__ import annotations

from evalsuite.tasks._source import HubSpec, prompt_task

PROMPT = "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
HUB = HubSpec("openai/gsm8k", name="main", split="test")
# tasks/gsm8k/task.toml: name, licence, source, data files, turns, scoring
load = prompt_task("gsm8k", "question", PROMPT, HUB, lambda index, row: f"gsm8k-{index}")
