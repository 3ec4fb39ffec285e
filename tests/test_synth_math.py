"""benchmarks/synth_math_prompts.py: what counts as a usable problem, a seeded resumable draw, and the one-line stop
when a target seldom writes one (a tiny random target stands in for the real one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalsuite.testing import build_tiny_target
from tests.helpers import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "synth_math_prompts.py"


@pytest.fixture(scope="module")
def synth():
    return load_script(SCRIPT, "synth_math_prompts")


def test_clean_keeps_the_problem_and_cuts_the_solution(synth):
    problem = ("Maya bakes 24 cupcakes and sells them in boxes of 4. Each box costs $3. "
               "How much money does Maya make?")
    assert synth.clean(f"**Problem:** {problem}\n\n**Solution:** 24 / 4 = 6 boxes, 6 x 3 = 18.") == problem
    assert synth.clean(f'"{problem}"\nStep 1: divide.') == problem
    assert synth.clean(f"{problem} The answer is 18.") == problem  # cut after the question
    assert synth.clean("Maya bakes cupcakes and sells them in boxes. How much money does she make in all?") is None
    assert synth.clean("Maya bakes 24 cupcakes and sells them in boxes of 4 each at a fixed price.") is None
    assert synth.clean("How many is 2 + 2?") is None  # too short
    assert synth.clean("```python\nprint(24 / 4)\n``` How many boxes of 4 does Maya fill with 24 cupcakes "
                       "if she also bakes 12 more?") is None


def test_the_instruction_draw_is_seeded(synth):
    first = [next(iter_) for iter_ in [synth.instructions(3)] for _ in range(5)]
    again = synth.instructions(3)
    assert [next(again) for _ in range(5)] == first
    assert all("grade-school" in text and spec["name"] in text for spec, text in first)


def test_a_stopped_draw_resumes_to_the_problems_of_an_uninterrupted_one(synth, tmp_path, monkeypatch, capsys):
    target = build_tiny_target(tmp_path / "t", "llama", layers=2)
    monkeypatch.setattr(synth, "clean", lambda text: f"Problem {len(text)}: {text[:12]!r}?")  # keep (almost) all
    common = ["--target", str(target), "--batch", "3", "--max-new-tokens", "6", "--threads", "1"]
    assert synth.main([str(tmp_path / "whole.jsonl"), "--count", "6", *common]) == 0
    assert synth.main([str(tmp_path / "part.jsonl"), "--count", "2", *common]) == 0  # one batch of 3
    assert synth.main([str(tmp_path / "part.jsonl"), "--count", "6", *common]) == 0
    whole = [json.loads(line) for line in (tmp_path / "whole.jsonl").read_text().splitlines()]
    part = [json.loads(line) for line in (tmp_path / "part.jsonl").read_text().splitlines()]
    assert part == whole and len({r["id"] for r in whole}) == len(whole) >= 6
    assert json.loads((tmp_path / "part.jsonl.progress.json").read_text())["drawn"] == 6
    # a copy of the problems without the progress file (a fresh checkout of the committed ones) goes on alike
    (tmp_path / "copy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in whole[:3]))
    assert synth.main([str(tmp_path / "copy.jsonl"), "--count", "6", *common]) == 0
    assert [json.loads(line) for line in (tmp_path / "copy.jsonl").read_text().splitlines()] == whole

    monkeypatch.setattr(synth, "clean", lambda text: None)  # a target that never writes a usable problem
    assert synth.main([str(tmp_path / "none.jsonl"), "--count", "2", "--max-draws", "6", *common]) == 1
    assert "stopped after 6 draws (--max-draws) with 0 of 2 problems kept" in capsys.readouterr().err
