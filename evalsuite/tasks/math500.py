"""MATH-500: single turn, the DFlash/DLite prompt format (docs/methods.md §3.4)."""

from __future__ import annotations

from evalsuite.tasks._source import HubSpec, prompt_task

PROMPT = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
HUB = HubSpec("HuggingFaceH4/MATH-500", split="test")
# tasks/math500/task.toml: name, licence, source, data files, turns, scoring
load = prompt_task("math500", "problem", PROMPT, HUB, lambda i, row: f"math500-{i}")
