"""Alpaca instructions: single turn in the DFlash/DLite format (`instruction`, or `instruction\\n\\nInput:\\ninput`).

Bundled: the 80 Stanford Alpaca records EAGLE evaluates on (`--subset eagle`, the default) and the 805 AlpacaEval
instructions (`--subset alpaca_eval`). `--data-path hub` loads tatsu-lab/alpaca train, as the reference scripts do.
"""

from __future__ import annotations

from evalsuite.errors import UserError
from evalsuite.tasks._source import HubSpec, first_turn, read_records, single_turn_trajectories, task_rows, text_field
from evalsuite.tasks.base import DATA_DIR, LoadOptions, Trajectory, register_task

HUB = HubSpec("tatsu-lab/alpaca", split="train")
BUNDLED = {"eagle": DATA_DIR / "alpaca" / "eagle_alpaca" / "question.jsonl",
           "alpaca_eval": DATA_DIR / "alpaca" / "alpaca_eval" / "text_davinci_003" / "model_outputs.json"}


def format_prompt(instruction: str, input_text: str | None) -> str:
    return f"{instruction}\n\nInput:\n{input_text}" if input_text else instruction


@register_task("alpaca", "Stanford Alpaca instructions (80 EAGLE records; 805 AlpacaEval with --subset alpaca_eval), "
               "one turn", licence="CC BY-NC 4.0 (non-commercial use only)",
               source="SafeAILab/EAGLE eagle/data/alpaca; tatsu-lab/alpaca_eval; HF tatsu-lab/alpaca train",
               subsets=tuple(BUNDLED))
def load(options: LoadOptions) -> list[Trajectory]:
    if options.data_path:
        if options.subset is not None:
            raise UserError(f"--subset {options.subset}: alpaca's subsets pick a bundled file; with --data-path "
                            "drop --subset")
        rows = task_rows("alpaca", options, BUNDLED["eagle"], HUB)
    else:
        subset = options.subset or "eagle"
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
