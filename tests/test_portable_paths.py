"""run.json names files without the machine they ran on: repository paths relative, the home directory as ~."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from evalsuite.cli import app
from evalsuite.config import portable_paths

REPO = Path(__file__).resolve().parents[1]


def test_portable_paths_rewrites_repository_and_home_paths_everywhere():
    home = Path.home()
    value = {"argv": ["evalsuite", f"{REPO}/baselines/drafters/dlite"], "nested": {"p": f"{home}/.cache/x"},
             "n": 3, "other": "/tmp/elsewhere"}
    assert portable_paths(value) == {"argv": ["evalsuite", "baselines/drafters/dlite"],
                                     "nested": {"p": "~/.cache/x"}, "n": 3, "other": "/tmp/elsewhere"}


def test_run_json_holds_no_repository_or_home_path(tiny_llama_dir, tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "--method", "ar,dlite", "--task", "gsm8k", "--limit", "1",
                                      "--target", str(tiny_llama_dir), "--max-new-tokens", "8", "--out", str(out),
                                      "--drafter", "dlite=random"])
    assert result.exit_code == 0, result.output
    text = (out / "run.json").read_text()
    json.loads(text)
    assert str(REPO) + "/" not in text and str(Path.home()) + "/" not in text


def test_the_program_is_recorded_by_its_name_wherever_its_environment_lives(monkeypatch):
    """A run started through another checkout's virtual environment (a git worktree measuring older code with
    the main checkout's .venv) records `evalsuite`, not that environment's path."""
    from evalsuite.config import command_line, environment

    monkeypatch.setattr("sys.argv", ["/elsewhere/main/.venv/bin/evalsuite", "run", "--out", "results/x"])
    assert command_line() == ["evalsuite", "run", "--out", "results/x"]
    assert environment()["argv"][0] == "evalsuite"
