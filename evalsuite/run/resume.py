"""Continuing a run with `--resume`: the settings that must not drift, what run.json keeps, and the command to
continue an interrupted run.

A resumed run keeps the stored run.json as it was (its configuration and its original `environment`) and
appends one entry per resume to `resumes` (that invocation's environment and methods). Methods added on a
resume join `methods`, `drafters` and the per-method drift fields (`drafter_sha256`, `method_options`,
`draft_products`).
"""

from __future__ import annotations

import hashlib
import shlex
import sys
from pathlib import Path

from evalsuite.config import DRIFT_FIELDS, PER_METHOD_DRIFT_FIELDS, drift_value
from evalsuite.hashing import file_sha256


def differences(previous: dict, current: dict) -> list[str]:
    """One line per drift field on which the stored run and this invocation disagree, naming the field."""
    lines = []
    for key in DRIFT_FIELDS:
        if drift_value(key, previous.get(key)) != drift_value(key, current.get(key)):
            lines.append(f"{key} differs from the stored run ({_short(previous.get(key))} → "
                         f"{_short(current.get(key))})")
    shared = [m for m in current.get("methods") or [] if m in (previous.get("methods") or [])]
    for key in PER_METHOD_DRIFT_FIELDS:
        before, now = previous.get(key) or {}, current.get(key) or {}
        for method in shared:
            if drift_value(key, before.get(method)) != drift_value(key, now.get(method)):
                lines.append(f"{key} of method {method} differs from the stored run "
                             f"({_short(before.get(method))} → {_short(now.get(method))})")
    return lines


def resumed_config(previous: dict, current: dict) -> dict:
    """The stored run.json, with any added methods joined and this resume appended to `resumes`."""
    merged = dict(previous)
    added = [m for m in current.get("methods") or [] if m not in (previous.get("methods") or [])]
    merged["methods"] = list(previous.get("methods") or []) + added
    for key in ("drafters", *PER_METHOD_DRIFT_FIELDS):
        # the new invocation loaded every method it names (ar included): take its entries for the added ones
        entries = dict(previous.get(key) or {})
        entries.update({m: v for m, v in (current.get(key) or {}).items() if m in added or m not in entries})
        merged[key] = entries
    merged["resumes"] = list(previous.get("resumes") or []) + [{
        "methods": current.get("methods"),
        "added_methods": added,
        "environment": current.get("environment"),
    }]
    return merged


def program() -> list[str]:
    """The command the user invoked this program with (`.venv/bin/evalsuite`, `evalsuite`, or `python -m
    evalsuite.cli` with this interpreter), so that printed commands run as printed."""
    first = sys.argv[0] if sys.argv else "evalsuite"
    if first.endswith(("cli.py", "__main__.py")) or first in ("-m", "-c", ""):
        return [sys.executable, "-m", "evalsuite.cli"]
    return [first]


def resume_command(argv: list[str], run_dir: str | Path) -> str:
    """The command line that continues this run, quoted for a shell: the program as invoked, the same options,
    and `--out RUN_DIR --resume`."""
    args, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--out":
            skip = True
            continue
        if arg.startswith("--out=") or arg in ("--resume", "--no-resume"):
            continue
        args.append(arg)
    return shlex.join([*program(), *args, "--out", str(run_dir), "--resume"])


def data_hash(data_path: str | None) -> str | None:
    """sha256 of a local `--data-path` (a file, or every file under a directory with its relative path);
    `hub:<id>` for data loaded from the hub; None for the bundled copy (versioned with the code)."""
    if data_path is None:
        return None
    path = Path(data_path).expanduser()
    if not path.exists():
        return f"hub:{data_path}"
    if path.is_file():
        return file_sha256(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(path).as_posix()}\0{file_sha256(file)}\n".encode())
    return digest.hexdigest()


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "…"
