"""LiveCodeBench code generation (release_v6, 1,055 problems): single turn in the official LCB prompt format.

The bundled file is DeepSpec's prompt set, already formatted; raw HF rows (`question_content`, `starter_code`)
are formatted here with the same template, which DFlash and DLite use (docs/methods.md §3.4).
"""

from __future__ import annotations

from evalsuite.tasks._source import HubSpec, first_turn, single_turn_trajectories, task_rows, text_field
from evalsuite.tasks.base import LoadOptions, Trajectory, register_task
from evalsuite.tasks.description import describe

SYSTEM_TEXT = ("You are an expert Python programmer. You will be given a question (problem specification) and will "
               "generate a correct Python program that matches the specification and passes all tests. You will NOT "
               "return anything except for the program")
WITH_STARTER = "### Format: Use the following code structure:"
WITHOUT_STARTER = "### Format: Write your code in the following format:"
ANSWER = "### Answer: (use the provided format with backticks)"
_BASE = "https://huggingface.co/datasets/livecodebench/code_generation_lite/resolve/main/"
HUB = HubSpec("json", split="test", data_files={"test": [_BASE + f for f in (
    "test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl", "test6.jsonl")]},
              label="livecodebench/code_generation_lite")
TASK = describe("livecodebench")  # tasks/livecodebench/task.toml: name, licence, source, files, turns, scoring


def format_prompt(question: str, starter_code: str | None) -> str:
    if starter_code:
        fmt, code = WITH_STARTER, f"```python\n{starter_code}\n```"
    else:
        fmt, code = WITHOUT_STARTER, "```python\n# YOUR CODE HERE\n```"
    return f"{SYSTEM_TEXT}\n\n### Question:\n{question}\n\n{fmt}\n{code}\n\n{ANSWER}"


@register_task(TASK)
def load(options: LoadOptions) -> list[Trajectory]:
    rows = task_rows("livecodebench", options, TASK.data_file(), HUB)
    items = []
    for index, (where, row) in enumerate(rows):
        if "question_content" in row:
            prompt = format_prompt(text_field(row, "question_content", where), row.get("starter_code"))
        else:
            prompt = first_turn(row, where, "question_content")
        items.append((f"livecodebench-{row.get('question_id') or index}", prompt))
    return single_turn_trajectories(items, options)
