"""The checks other harnesses print, over the stored tables: the accepted-length histogram per method, the identity
τ = 1 + Σ_j marginal acceptance, τ pooled over steps beside τ averaged over requests, a task × method acceptance
matrix (SPEED-Bench style), and the report's provenance file (`command.txt`).

τ counts the bonus token (conventions.TAU); the marginal acceptance at j is P(positions 1..j all accepted) over the
steps whose budget left room for j drafts (conventions.POSITION), the conditional one P(j | 1..j-1).

**The identity.** Over a set of steps that all had the same room K, Σ_j P(accepted ≥ j) = E[accepted], so
τ = 1 + Σ_j marginal_j exactly, for any drafter (a variable-length one that drafted fewer than j counts as not
accepted at j, which keeps the identity). It is checked on the steps that had the full room K. Over all steps the
marginal at j has fewer steps behind it as j grows (the token budget shrinks the room at a turn's end), so
1 + Σ marginal differs from τ by that truncation; that gap is printed too. The convention under which
variable-length methods break the identity is the one that conditions on the drafter having proposed position j
(P(accepted ≥ j | drafted ≥ j), "acceptance per drafted position"): 1 + Σ of those overstates τ for ngram and
suffix, which often propose short drafts or none; it is printed beside them, named.

Pure functions (no model, no torch).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
import pandas as pd

from evalsuite import metrics
from evalsuite.conventions import BASELINE
from evalsuite.report import positions

IDENTITY_COLUMNS = ["task", "method", "kind", "k", "n_steps", "tau", "tau_from_marginals", "gap",
                    "n_full_room_steps", "tau_full_room", "tau_from_marginals_full_room", "gap_full_room",
                    "tau_from_drafted_conditional"]
IDENTITY_CONVENTION = (
    "τ = pooled over verify steps, the bonus token counted; 1 + Σ marginal = 1 + Σ_j P(positions 1..j all accepted) "
    "over the steps with room for j drafts; over steps that all had the full room K the two are equal by "
    "construction for any drafter (gap_full_room ≈ 0: checked); over all steps the budget shrinks the room at a "
    "turn's end, so the marginal at large j rests on fewer steps and the gap is that truncation; "
    "1 + Σ P(accepted ≥ j | drafted ≥ j) is the per-drafted-position convention, under which variable-length "
    "methods (ngram, suffix: short or empty drafts) break the identity: it overstates their τ")
HISTOGRAM_CONVENTION = (
    "accepted length = accepted drafts per verify step (the bonus token not counted: a step emits accepted + 1), "
    "over the steps τ counts (not budget-limited), pooled over the method's tasks; shares add to 100 % per row")
MATRIX_CONVENTION = (
    "τ (steps) = pooled over verify steps (Σ (accepted + 1) / steps), the report's τ; τ (requests) = each turn's τ "
    "first, then their unweighted mean over turns (every request counts equally); both count the bonus token; "
    "acceptance per drafted token = Σ accepted / Σ drafted")


def tau_from_marginals(steps: pd.DataFrame, room) -> float:
    """1 + Σ_j marginal_j over the steps with room (`metrics.per_position`)."""
    rates = metrics.per_position(steps, None, room)
    return 1.0 + float(rates.marginal.fillna(0.0).sum()) if len(rates) else float("nan")


def _drafted_conditional(steps: pd.DataFrame, room) -> float:
    room = np.asarray(room, float)
    keep = room > 0
    drafted, accepted = steps.num_drafted.to_numpy()[keep], steps.num_accepted.to_numpy()[keep]
    k = int(drafted.max(initial=0))
    total = 1.0
    for j in range(1, k + 1):
        proposed = drafted >= j
        if proposed.any():
            total += float((accepted[proposed] >= j).mean())
    return total


def identity_table(steps: pd.DataFrame, turns: pd.DataFrame, limits: dict | None = None) -> pd.DataFrame:
    """Per task × drafting method: τ against 1 + Σ marginal, over all steps with room and over the steps with the
    full room K (IDENTITY_COLUMNS; IDENTITY_CONVENTION)."""
    drafting = steps[steps.method != BASELINE]
    if drafting.empty:
        return pd.DataFrame(columns=IDENTITY_COLUMNS)
    room = metrics.draft_room(drafting, turns, limits)
    kinds = positions.method_kinds(drafting, room)
    rows = []
    for (task, method), cell in drafting.groupby(["task", "method"], sort=False):
        cell_room = room[cell.index]
        with_room = cell[(cell_room > 0).to_numpy()]
        k = int(cell_room.max()) if len(cell_room) else 0
        full = (cell_room >= k).to_numpy() & (cell_room > 0).to_numpy()
        cell_full, full_room = cell[full], cell_room[full]
        tau_all = metrics.tau(with_room)
        from_all = tau_from_marginals(with_room, cell_room[(cell_room > 0).to_numpy()])
        tau_full = metrics.tau(cell_full)
        from_full = tau_from_marginals(cell_full, full_room) if len(cell_full) else float("nan")
        rows.append({"task": task, "method": method, "kind": kinds.get(method, ""), "k": k, "n_steps": len(with_room),
                     "tau": tau_all, "tau_from_marginals": from_all, "gap": from_all - tau_all,
                     "n_full_room_steps": len(cell_full), "tau_full_room": tau_full,
                     "tau_from_marginals_full_room": from_full, "gap_full_room": from_full - tau_full,
                     "tau_from_drafted_conditional": _drafted_conditional(with_room, cell_room[(cell_room > 0)
                                                                                               .to_numpy()])})
    return pd.DataFrame(rows, columns=IDENTITY_COLUMNS)


def accepted_length_histogram(steps: pd.DataFrame, by_task: bool = False) -> pd.DataFrame:
    """Long table: per method (and task, with `by_task`) and accepted length a = 0..K: the counted steps that
    accepted exactly a drafts and their share (HISTOGRAM_CONVENTION)."""
    drafting = steps[(steps.method != BASELINE)]
    drafting = drafting[metrics.counted(drafting)]
    keys = ["task", "method"] if by_task else ["method"]
    rows = []
    if drafting.empty:
        return pd.DataFrame(columns=[*keys, "accepted", "steps", "share"])
    k = int(drafting.num_drafted.max())
    for key, cell in drafting.groupby(keys, sort=False):
        counts = np.bincount(cell.num_accepted.to_numpy(int), minlength=k + 1)
        key = key if isinstance(key, tuple) else (key,)
        for a, n in enumerate(counts):
            rows.append({**dict(zip(keys, key)), "accepted": a, "steps": int(n), "share": n / max(len(cell), 1)})
    return pd.DataFrame(rows)


def acceptance_matrix(steps: pd.DataFrame) -> pd.DataFrame:
    """Per task × drafting method: τ pooled over steps, τ averaged over requests (turns), acceptance per drafted
    token and the steps (MATRIX_CONVENTION)."""
    drafting = steps[steps.method != BASELINE]
    rows = []
    for (task, method), cell in drafting.groupby(["task", "method"], sort=False):
        counted = cell[metrics.counted(cell)]
        drafted = float(counted.num_drafted.sum())
        rows.append({"task": task, "method": method, "n_steps": len(counted), "tau_steps": metrics.tau(cell),
                     "tau_requests": metrics.tau_turn_macro(cell),
                     "accept_per_drafted": float(counted.num_accepted.sum()) / drafted if drafted else np.nan})
    return pd.DataFrame(rows, columns=["task", "method", "n_steps", "tau_steps", "tau_requests",
                                       "accept_per_drafted"])


# ---- provenance --------------------------------------------------------------------------------------------------
def _git(*args: str) -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def command_text(runs, report_argv: list[str] | None, out: Path, display) -> str:
    """The provenance file a reader can rerun: each run's exact command line, commit and versions (from its
    run.json), then the report's own command line, the commit of the code that built it (with +dirty when the tree
    had uncommitted changes) and the report-side versions. `display` maps a path to what the report may print."""
    lines = ["# Provenance of this report: the commands that made it (rerun them from the commits named).", ""]
    for run in runs:
        env = run.config.get("environment") or {}
        argv = list(env.get("argv") or [])
        if argv:
            argv[0] = "evalsuite" if argv[0].endswith("evalsuite") else argv[0]
        versions = ", ".join(f"{k} {v}" for k, v in sorted((env.get("versions") or {}).items()))
        lines += [f"## run {run.key} ({display(run.path)})",
                  f"# commit {env.get('git_commit') or 'not recorded'}; started {env.get('started_at') or '?'}; "
                  f"python {env.get('python') or '?'}; {env.get('device_name') or ''}",
                  f"# versions: {versions or 'not recorded'}",
                  shlex.join(argv) if argv else "# (command line not recorded in run.json)", ""]
    commit = _git("rev-parse", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    argv = list(report_argv) if report_argv else ["evalsuite", "report", "…", "--out", display(out)]
    if argv and argv[0].endswith("evalsuite"):
        argv[0] = "evalsuite"
    lines += ["## the report",
              f"# commit {commit or 'unknown (not a git checkout)'}{'+dirty' if dirty and commit else ''}; "
              f"python {sys.version.split()[0]}",
              "# versions: " + ", ".join(f"{n} {_version(n)}" for n in ("evalsuite", "numpy", "pandas", "pyarrow",
                                                                         "matplotlib")),
              shlex.join(argv), ""]
    lines += ["## rebuild it from the records shipped beside it",
              "# run from this report's directory: the runs' own --out paths above are where they were written,",
              "# not where they are kept now",
              shlex.join(_rebuild_argv(argv, runs, lambda path: _relative(path, out, display))), ""]
    return "\n".join(lines)


def _relative(path, out: Path, display) -> str:
    """`path` relative to the report's directory (`../run`, `./runs/x`); `display` where no relative path exists."""
    try:
        relative = os.path.relpath(Path(path).resolve(), Path(out).resolve())
    except ValueError:  # another drive
        return display(path)
    return relative if relative.startswith("..") else f"./{relative}"


def _rebuild_argv(argv: list[str], runs, display_relative) -> list[str]:
    """The report's command line from the report's directory: the runs where the report keeps them
    (`display_relative`), `--out .`, every other option kept, an existing relative path among them rewritten
    relative to the report's directory."""
    run_paths = {Path(run.path).resolve() for run in runs}
    kept, skip = [], False
    for token in argv[2:]:
        if skip:
            skip = False
            continue
        if token == "--out":
            skip = True
            continue
        if token.startswith("--out="):
            continue
        if not token.startswith("-") and Path(token).resolve() in run_paths:
            continue
        if not token.startswith("-") and not Path(token).is_absolute() and Path(token).exists():
            token = display_relative(token)  # an option's file or directory (--hardware DIR), from the report
        kept.append(token)
    return ["evalsuite", "report", *[display_relative(run.path) for run in runs], "--out", ".", *kept]
