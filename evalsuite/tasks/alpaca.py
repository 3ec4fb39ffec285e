"""Alpaca instructions: single turn in the DFlash/DLite format (`instruction`, or `instruction\\n\\nInput:\\ninput`).

Bundled: the 80 Stanford Alpaca records EAGLE evaluates on (`--subset eagle`, the default) and the 805 AlpacaEval
instructions (`--subset alpaca_eval`). `--data-path hub` loads tatsu-lab/alpaca train, as the reference scripts do.
"""

from __future__ import annotations

from evalsuite.errors import UserError
from evalsuite.tasks._source import HubSpec, first_turn, read_records, single_turn_trajectories, task_rows, text_field
from evalsuite.tasks.base import LoadOptions, Trajectory, register_task
from evalsuite.tasks.description import describe

HUB = HubSpec("tatsu-lab/alpaca", split="train")
TASK = describe("alpaca")  # tasks/alpaca/task.toml: name, licence, source, subsets and their files, turns, scoring
BUNDLED = {subset: TASK.data_file(subset) for subset in TASK.subset_names}


def format_prompt(instruction: str, input_text: str | None) -> str:
    return f"{instruction}\n\nInput:\n{input_text}" if input_text else instruction


@register_task(TASK)
def load(options: LoadOptions) -> list[Trajectory]:
    if options.data_path:
        if options.subset is not None:
            raise UserError(f"--subset {options.subset}: alpaca's subsets pick a bundled file; with --data-path "
                            "drop --subset")
        rows = task_rows("alpaca", options, TASK.data_file(), HUB)
    else:
        subset = options.subset or TASK.default_subset
        if subset not in BUNDLED:
            raise UserError(f"--subset {subset}: alpaca has subsets {', '.join(BUNDLED)}")
        rows = read_records(BUNDLED[subset])
    items = []
    for index, (where, row) in enumerate(rows):
        if "instruction" in row:
            prompt = format_prompt(text_field(row, "instruction", where), row.get("input"))
        else:
            prompt = first_turn(row, where, "instruction")
        items.append((f"alpaca-{row.get('question_id', index)}", prompt))
    return single_turn_trajectories(items, options)
