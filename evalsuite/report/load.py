"""Read run directories and merge them into one set of tables, refusing to mix incomparable configurations.

Every row keeps a `run` column (a unique key per directory) so that each number can be traced to the run.json
that produced it. A run with a `--subset` is labelled `task:subset` (e.g. `longbench-v2:Multi-Document QA`), and a
run at T > 0 `task T=1` (e.g. `mt-bench T=1`), so subsets and temperatures of one task become separate columns of
the tables (and separate blocks of Table 1), never pooled.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from evalsuite import degenerate, metrics
from evalsuite.config import DRIFT_FIELDS, PER_METHOD_DRIFT_FIELDS, drift_value
from evalsuite.conventions import BASELINE
from evalsuite.errors import UserError
from evalsuite.store import run_store as store

# Drift fields that legitimately differ between runs of *different* tasks; they must agree only among runs of
# the same task (otherwise two rows of one table column would come from different protocols).
PER_TASK_FIELDS = ("task", "replay", "seed", "max_new_tokens", "context_policy", "max_turns", "temperature",
                   "tool_format")
# What identifies which samples a run drew; runs of one task must agree on it too.
SAMPLE_SET_FIELDS = ("subset", "data_sha256", "sample_ids", "format")
# Fields that every merged run must share, derived from the one list of drift fields.
GLOBAL_FIELDS = tuple(f for f in DRIFT_FIELDS if f not in PER_TASK_FIELDS + SAMPLE_SET_FIELDS)


@dataclass
class RunInfo:
    key: str  # unique among the merged runs (the directory name, suffixed when two share a name)
    path: Path
    config: dict

    @property
    def task_label(self) -> str:
        label = task_label(self.config.get("task", "?"), self.config.get("subset"), self.config.get("temperature"))
        return f"{label} closed" if self.config.get("replay") == "closed" else label  # live loops: own column


@dataclass
class Results:
    steps: pd.DataFrame  # StepRecord rows plus `run` and `temperature`; `task` holds the task label
    turns: pd.DataFrame  # TurnRecord rows plus `run` and `temperature`; `degenerate` filled for older runs
    runs: list[RunInfo]
    mixed: list[str] = field(default_factory=list)  # differences accepted under --allow-mixed, one line each
    notes: list[str] = field(default_factory=list)  # merge decisions the reader should know about

    @property
    def methods(self) -> list[str]:
        """Alphabetical, the `ar` baseline last."""
        return sorted(set(self.turns.method), key=lambda m: (m == BASELINE, m))

    @property
    def tasks(self) -> list[str]:
        """In the order the run directories were given."""
        return list(dict.fromkeys(r.task_label for r in self.runs))


def machines(config: dict) -> list[str]:
    """The distinct devices a run was decoded on: its first invocation's and each resume's `device_name`, in order."""
    names = [(config.get("environment") or {}).get("device_name")]
    names += [(r.get("environment") or {}).get("device_name") for r in config.get("resumes") or []]
    return list(dict.fromkeys(str(n) for n in names if n))


def task_label(task: str, subset: str | None, temperature: float | None = 0.0) -> str:
    """The column a run's rows go to: the task, its subset, and the temperature when it is not 0 (runs of one task
    at two temperatures are two columns, never pooled)."""
    label = f"{task}:{subset}" if subset else task
    return f"{label} T={float(temperature):g}" if temperature else label


def read_run(path: Path, key: str) -> tuple[RunInfo, pd.DataFrame, pd.DataFrame]:
    """One run directory through the store's reader (orphaned parts ignored, older runs' columns filled)."""
    path = Path(path)
    if not (path / "run.json").is_file():
        raise UserError(f"{path}: no run.json here; pass directories written by `evalsuite run --out DIR`")
    tables = store.read_run(path)
    info = RunInfo(key, path, tables.config)
    steps, turns = tables.steps, tables.turns
    if turns.empty:
        raise UserError(f"{path}: no finished turns in turns.parquet; finish the run with "
                        f"`evalsuite run ... --out {path} --resume`")
    _check_flags(steps, path)
    for frame in (steps, turns):
        frame["run"] = key
        frame["task"] = info.task_label
        frame["temperature"] = float(info.config.get("temperature", float("nan")))
    return info, steps, degenerate.flag_turns(turns)  # flags of runs written before the runner recorded them


def load_results(paths: list[Path], allow_mixed: bool = False, tasks: list[str] | None = None,
                 methods: list[str] | None = None, base: Path | None = None) -> Results:
    """Read and merge run directories. `tasks`/`methods` keep only those (the `ar` baseline always stays: the
    headline's ms/token and the losslessness count come from it); `base` is the report directory that paths
    in notes are written relative to."""
    results = _load_all(paths, allow_mixed, base)
    return filtered(results, tasks, methods)


def filtered(results: Results, tasks: list[str] | None, methods: list[str] | None) -> Results:
    if tasks:
        unknown = [t for t in tasks if t not in results.tasks]
        if unknown:
            raise UserError(f"--task {','.join(unknown)}: not in these runs; they hold {', '.join(results.tasks)}")
        results.runs = [r for r in results.runs if r.task_label in tasks]
        results.steps = results.steps[results.steps.task.isin(tasks)].reset_index(drop=True)
        results.turns = results.turns[results.turns.task.isin(tasks)].reset_index(drop=True)
    if methods:
        unknown = [m for m in methods if m not in results.methods]
        if unknown:
            raise UserError(f"--method {','.join(unknown)}: not in these runs; they hold "
                            f"{', '.join(results.methods)}")
        keep = metrics.with_baseline(methods)
        results.steps = results.steps[results.steps.method.isin(keep)].reset_index(drop=True)
        results.turns = results.turns[results.turns.method.isin(keep)].reset_index(drop=True)
        if results.turns.empty:
            raise UserError(f"--method {','.join(methods)}: no finished trajectories of it on these tasks")
    return results


def _load_all(paths: list[Path], allow_mixed: bool, base: Path | None) -> Results:
    if not paths:
        raise UserError("name at least one results directory (written by `evalsuite run --out DIR`)")
    runs, steps, turns = [], [], []
    for path in paths:
        key = _unique_key(Path(path).resolve().name, {r.key for r in runs})
        info, run_steps, run_turns = read_run(Path(path), key)
        runs.append(info)
        steps.append(run_steps)
        turns.append(run_turns)
    mixed = config_differences(runs)
    if mixed and not allow_mixed:
        raise UserError(f"{mixed[0]}; these runs are not comparable. Pass --allow-mixed to merge them anyway")
    steps_all = pd.concat(steps, ignore_index=True)
    turns_all = pd.concat(turns, ignore_index=True)
    notes = [note for info, run_turns in zip(runs, turns) for note in _unfinished(info, run_turns, base)]
    notes += [f"{info.key}: --replay closed at T>0, every method ran its own agent loop, so its speedup is paired "
              "with ar by turn index only (ar's decode of the same turn index saw another context)"
              for info in runs if (info.config.get("closed_loop") or {}).get("loop") == "own"]
    steps_all, turns_all = _drop_duplicate_pairs(steps_all, turns_all, runs, notes)
    return Results(steps_all, turns_all, runs, mixed, notes)


def config_differences(runs: list[RunInfo]) -> list[str]:
    """One line per drift-relevant field on which the runs disagree, naming the field, the values and the runs."""
    lines = []
    lines += _differences(runs, GLOBAL_FIELDS, scope="")
    for label in _ordered(pd.Series([r.task_label for r in runs])):
        same_task = [r for r in runs if r.task_label == label]
        lines += _differences(same_task, PER_TASK_FIELDS + SAMPLE_SET_FIELDS, scope=f" among the {label} runs")
    for name in PER_METHOD_DRIFT_FIELDS:  # compared among the runs that ran the method
        for method in sorted({m for r in runs for m in r.config.get("methods") or []}):
            having = [r for r in runs if method in (r.config.get("methods") or [])]
            values = {r.key: (r.config.get(name) or {}).get(method) for r in having}
            if len({drift_value(name, v) for v in values.values()}) > 1:
                lines.append(f"{name} of method {method} differs: " + _listing(values))
    return lines


def _differences(runs: list[RunInfo], names: tuple[str, ...], scope: str) -> list[str]:
    lines = []
    for name in names:
        values = {r.key: r.config.get(name) for r in runs}
        if len({drift_value(name, v) for v in values.values()}) > 1:
            lines.append(f"{name} differs{scope}: " + _listing(values))
    return lines


def _listing(values: dict) -> str:
    return ", ".join(f"{value!r} in {key}" for key, value in values.items())


def display_path(path: Path | str | None, base: Path | None = None) -> str:
    """A path as a report may print it: never absolute. Inside the report directory `base`: relative to it
    (./runs/x); inside the repository, or in another checkout of it (a path recorded on another machine whose
    tail exists here): relative to its root (baselines/drafters/x); elsewhere: relative to `base` (../runs/x), or
    only the final name when there is no `base`."""
    if path is None or str(path) == "":
        return "–"
    resolved = Path(path).expanduser().resolve()
    if base is not None:
        base = Path(base).resolve()
        if resolved == base or resolved.is_relative_to(base):
            return "./" + resolved.relative_to(base).as_posix() if resolved != base else "."
    if (REPO_ROOT / "pyproject.toml").is_file():
        if resolved.is_relative_to(REPO_ROOT):
            return resolved.relative_to(REPO_ROOT).as_posix()
        # recorded in another checkout of this repository (e.g. another machine's): its path inside the repository
        parts = resolved.parts
        for start in range(1, len(parts) - 1):
            inside = Path(*parts[start:])
            if len(inside.parts) >= 2 and (REPO_ROOT / inside).exists():
                return inside.as_posix()
    if base is not None:
        return Path(os.path.relpath(resolved, base)).as_posix()
    return resolved.name


REPO_ROOT = Path(__file__).resolve().parents[2]


def _unfinished(info: RunInfo, turns: pd.DataFrame, base: Path | None = None) -> list[str]:
    """A run stopped part-way holds fewer trajectories than its run.json selected; say so per method."""
    selected = set(info.config.get("sample_ids") or [])
    notes = []
    for method in info.config.get("methods") or []:
        done = set(turns[(turns.method == method) & turns["last"].astype(bool)].sample_id)
        if selected and len(done) < len(selected):
            notes.append(f"{info.key}: {method} finished {len(done)} of the {len(selected)} selected samples "
                         f"(finish it with `evalsuite run ... --out {display_path(info.path, base)} --resume`)")
    return notes


def _drop_duplicate_pairs(steps, turns, runs, notes):
    """The same (method, task, sample) measured in two runs (typically the `ar` baseline recorded twice) would be
    counted twice; keep the first run's copy and say so."""
    first_run = turns.groupby(["method", "task", "sample_id"], sort=False).run.first().rename("keep_run")
    runs_per_pair = turns.groupby(["method", "task", "sample_id"], sort=False).run.nunique()
    duplicated = runs_per_pair[runs_per_pair > 1]
    if duplicated.empty:
        return steps, turns
    for (method, task), group in duplicated.reset_index().groupby(["method", "task"], sort=False):
        kept = first_run.loc[(method, task, group.sample_id.iloc[0])]
        others = sorted(set(turns[(turns.method == method) & (turns.task == task)].run) - {kept})
        notes.append(f"{method} on {task}: {len(group)} trajectories appear in several runs; "
                     f"kept those of {kept}, ignored the copies in {', '.join(others)}")
    steps = steps.join(first_run, on=["method", "task", "sample_id"])
    turns = turns.join(first_run, on=["method", "task", "sample_id"])
    steps = steps[steps.run == steps.keep_run].drop(columns="keep_run").reset_index(drop=True)
    turns = turns[turns.run == turns.keep_run].drop(columns="keep_run").reset_index(drop=True)
    return steps, turns


def _check_flags(steps: pd.DataFrame, path: Path) -> None:
    """Per-position rates are computed from num_drafted/num_accepted; they must agree with accept_flags."""
    if steps.empty:
        return
    lengths = steps.accept_flags.map(len)
    leading = steps.accept_flags.map(_leading_true)
    bad = (lengths != steps.num_drafted) | (leading != steps.num_accepted) | (steps.num_accepted > steps.num_drafted)
    if bad.any():
        row = steps[bad].iloc[0]
        raise UserError(f"{path}: steps.parquet is inconsistent (method {row.method}, sample {row.sample_id}, "
                        f"turn {row.turn}, step {row.step}: accept_flags {list(row.accept_flags)} vs "
                        f"num_drafted {row.num_drafted}, num_accepted {row.num_accepted}); rerun that run")


def _leading_true(flags) -> int:
    count = 0
    for flag in flags:
        if not flag:
            break
        count += 1
    return count


def _unique_key(name: str, taken: set[str]) -> str:
    key, n = name, 2
    while key in taken:
        key, n = f"{name}-{n}", n + 1
    return key


def _ordered(values: pd.Series) -> list[str]:
    """Distinct values in order of first appearance."""
    return list(dict.fromkeys(values.tolist()))
