"""How close the plan's cost model comes to what a finished run recorded.

`evalsuite run` prints an estimate before it starts (evalsuite/run/plan.py): every turn's prefill priced at its
place in the context, and each decode at the target's cost per token at that context times the method's ratio to
`ar` (from the turns a resumed run has stored, else from the warm-up). This re-measures the target's costs on this
machine the way the plan does (`measure_costs`, at the run's longest decoded context) and prices each sample of a
finished run with them, beside what its rows recorded:
- prefill: the tokens between the sample's decoded turns (skipped turns included), against `prefill_s` summed over
  every row of the sample (methods share one prefix cache: each turn's prefill is paid by the first to decode it);
- `ar`: each decoded turn's repeats × the tokens it wrote, against every `ar` repeat's decode time;
- every method: the same, each method at its ratio to `ar` from the *other* samples' stored turns (leave one
  sample out, so no sample prices itself), against every repeat's decode time of every method.
With `--old`, the target's part priced as the plan did before (decode measured at 64 and 1,024 tokens and its
line extended from there; prefill at one rate per token whatever its place).

Usage: python benchmarks/plan_accuracy.py RUN_DIR [--old]
Run it on a quiet machine of the kind the run used (the run's thread count is taken from run.json).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

from evalsuite import metrics
from evalsuite.conventions import BASELINE
from evalsuite.run.plan import Costs, format_duration, measure_costs, stored_ratios
from evalsuite.store.run_store import read_run
from evalsuite.target.model import TargetModel


def prefill_s(costs: Costs, ar) -> float:
    """The estimated prefill of one sample: its decoded turns' contexts, in order, from an empty cache."""
    total, previous = 0.0, 0
    for row in ar.sort_values("turn").itertuples():
        total += costs.prefill_s(previous, max(row.context_len - previous, 0))
        previous = row.context_len
    return total


def decode_s(costs: Costs, rows) -> float:
    """The estimated decodes of `rows` (decoded turns of any method): ratio × ar's s/token × tokens × repeats."""
    return sum(costs.ratio(row.method, row.context_len) * costs.decode_s(row.context_len) * row.new_tokens
               * len(row.repeat_decode_s) for row in rows.itertuples())


def recorded_s(rows) -> float:
    return float(sum(sum(times) for times in rows.repeat_decode_s))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--old", action="store_true", help="also price the target's part as the plan did before")
    args = parser.parse_args()
    config = json.loads((args.run_dir / "run.json").read_text())
    turns = read_run(args.run_dir).turns
    decoded = metrics.decoded(turns)
    if (decoded.method == BASELINE).sum() == 0:
        raise SystemExit(f"plan_accuracy.py: {args.run_dir} has no decoded `ar` turn")
    torch.set_num_threads(int(config["threads"]))
    target = TargetModel.load(config["target"], config["device"], config["dtype"], config["weight_layout"],
                              config["kv_cache"], config["compile"], config["cuda_graphs"])
    target.prepare_blocks(int(config["k"]) + 1)  # as the engine does before the plan: weights packed for the blocks
    costs = measure_costs(target, {}, int(decoded.context_len.max()))
    old = measure_costs(target, {}, 0) if args.old else None  # the short line alone: the plan before
    print(f"# python benchmarks/plan_accuracy.py {args.run_dir.name}{' --old' if args.old else ''}: run "
          f"{config['run_id']} ({config['target']}, {config['threads']} threads, {config['repeats']} repeats, "
          f"{decoded.sample_id.nunique()} samples)")
    print(f"# plan: {costs.describe()}")
    if old:
        print(f"# old plan: {old.describe()}")
    columns = ["prefill", "ar decode", "all decodes"]
    print(f"{'sample':<36} " + " ".join(f"{c + ' s (recorded / plan' + (' / old' if old else '') + ')':>44}"
                                        for c in columns))
    totals = {key: [0.0, 0.0, 0.0] for key in columns}
    for sample, rows in decoded.groupby("sample_id", sort=True):
        ar = rows[rows.method == BASELINE]
        others = {key: list(group.itertuples(index=False)) for key, group in
                  decoded[decoded.sample_id != sample].groupby(["method", "sample_id"])}
        left_out = replace(costs, stored_ratio=stored_ratios(others))
        found = {
            "prefill": (float(turns.loc[turns.sample_id == sample, "prefill_s"].fillna(0).sum()),
                        prefill_s(costs, ar), prefill_s(old, ar) if old else float("nan")),
            "ar decode": (recorded_s(ar), decode_s(costs, ar), decode_s(old, ar) if old else float("nan")),
            "all decodes": (recorded_s(rows), decode_s(left_out, rows), float("nan")),
        }
        cells = []
        for key, values in found.items():
            totals[key] = [t + v for t, v in zip(totals[key], values)]
            shown = values if old and key != "all decodes" else values[:2]
            cells.append(" / ".join(f"{v:.0f}" for v in shown))
        print(f"{sample[-36:]:<36} " + " ".join(f"{c:>44}" for c in cells))
    for key, (recorded, plan, before) in totals.items():
        line = f"in all, {key}: recorded {format_duration(recorded)}, plan {format_duration(plan)} " \
               f"({plan / recorded:.2f}×)"
        if old and key != "all decodes":
            line += f", old plan {format_duration(before)} ({before / recorded:.2f}×)"
        print(line)


if __name__ == "__main__":
    main()
