"""Published numbers (`baselines/published/*.csv`) beside ours, where task, method and temperature match."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from evalsuite import conventions
from evalsuite.bundled import bundled_path
from evalsuite.errors import UserError
from evalsuite.report.load import Results
from evalsuite.report.formatting import Cell, Table

PUBLISHED_DIR = bundled_path("baselines/published")
REQUIRED = ("paper", "table", "target", "method", "task", "subset", "temperature", "metric", "value", "source")
METRICS = ("tau", "speedup")
COMPARISON_COLUMNS = ["method", "task", "temperature", "our_target", "our_tau", "our_tau_ci_low", "our_tau_ci_high",
                      "our_speedup", "our_speedup_ci_low", "our_speedup_ci_high", "their_target", "their_tau",
                      "their_speedup", "paper", "table", "source", "notes", "target_differs"]


def load_published(directory: Path = PUBLISHED_DIR) -> pd.DataFrame:
    files = sorted(Path(directory).glob("*.csv"))
    frames = []
    for path in files:
        frame = pd.read_csv(path, dtype={"subset": str}, keep_default_na=False)
        missing = [c for c in REQUIRED if c not in frame.columns]
        if missing:
            raise UserError(f"{path}: missing column(s) {', '.join(missing)}; see {directory}/README.md")
        bad = frame[~frame.metric.isin(METRICS)]
        if not bad.empty:
            raise UserError(f"{path}: metric {bad.metric.iloc[0]!r} is not one of {', '.join(METRICS)}")
        frame["file"] = path.name
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=[*REQUIRED, "file"])
    published = pd.concat(frames, ignore_index=True)
    published["temperature"] = published.temperature.astype(float)
    published["value"] = published.value.astype(float)
    return published


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(text).lower())


def matches(published: pd.DataFrame, method: str, task_label: str, temperature: float) -> pd.DataFrame:
    task, _, subset = task_label.split(" T=")[0].partition(":")
    same = (published.method == method) & (published.task == task) & \
           (published.subset.map(_norm) == _norm(subset)) & \
           ((published.temperature - temperature).abs() < 1e-9)
    return published[same]


def target_differs(our_target: str, their_target: str) -> bool:
    """Theirs is named like 'Qwen3-8B'; ours is the loaded target's name. Same model iff theirs is part of ours."""
    return _norm(their_target) not in _norm(our_target)


def comparison_table(results: Results, summary: pd.DataFrame, published: pd.DataFrame) -> Table:
    targets = {r.key: r.config.get("target_name") or r.config.get("target", "?") for r in results.runs}
    run_of = results.turns.groupby(["method", "task"]).run.first()
    rows, records, differing = [], [], set()
    for r in summary.itertuples(index=False):
        theirs = matches(published, r.method, r.task, r.temperature)
        if theirs.empty:
            continue
        ours_target = targets[run_of.loc[(r.method, r.task)]]
        keys = ["paper", "table", "target"]
        for (paper, table, their_target), group in theirs.groupby(keys, sort=False):
            values = dict(zip(group.metric, group.value))
            if target_differs(ours_target, their_target):
                differing.add((ours_target, their_target))
            rows.append([Cell(r.method), Cell(r.task), Cell(r.temperature, digits=1),
                         Cell(r.tau, r.tau_ci_low, r.tau_ci_high, int(r.trajectories)),
                         Cell(r.speedup, r.speedup_ci_low, r.speedup_ci_high, int(r.trajectories)),
                         Cell(str(their_target)), Cell(values.get("tau", float("nan"))),
                         Cell(values.get("speedup", float("nan"))), Cell(f"{paper}, Table {table}")])
            records.append({"method": r.method, "task": r.task, "temperature": r.temperature,
                            "our_target": ours_target, "our_tau": r.tau, "our_tau_ci_low": r.tau_ci_low,
                            "our_tau_ci_high": r.tau_ci_high, "our_speedup": r.speedup,
                            "our_speedup_ci_low": r.speedup_ci_low, "our_speedup_ci_high": r.speedup_ci_high,
                            "their_target": their_target, "their_tau": values.get("tau", math.nan),
                            "their_speedup": values.get("speedup", math.nan), "paper": paper, "table": table,
                            "source": group.source.iloc[0], "notes": "; ".join(sorted(set(group.get("notes", [])))),
                            "target_differs": target_differs(ours_target, their_target)})
    notes = []
    for ours in sorted({o for o, _ in differing}):
        theirs = ", ".join(sorted({t for o, t in differing if o == ours}))
        notes.append(f"THE TARGETS DIFFER: ours is {ours}, theirs is {theirs}. Different target, drafter "
                     "checkpoints, hardware and data: these numbers are shown side by side for orientation, "
                     "not as a like-for-like comparison")
    if not rows:
        available = published.groupby(["method", "temperature"]).task.apply(lambda t: ", ".join(sorted(set(t))))
        listing = "; ".join(f"{m} at T={t:g}: {tasks}" for (m, t), tasks in available.items())
        notes.append("no published number matches any (method, task, temperature) of this report"
                     + (f"; published numbers exist for {listing}" if listing else ""))
    notes += ["a published number is shown only where method, task (and LongBench v2 domain) and temperature all "
              "match ours", conventions.TAU, conventions.SPEEDUP,
              "the sources and caveats of every published row are in baselines/published/ and this table's CSV"]
    header = ["Method", "Task", "T", "our τ", "our speedup", "their target", "their τ", "their speedup", "source"]
    return Table("published_comparison", "Ours beside published numbers", header, rows, notes,
                 pd.DataFrame(records, columns=COMPARISON_COLUMNS))
