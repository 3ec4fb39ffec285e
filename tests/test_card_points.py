"""A drafter card's held-out rows per context point: τ and paired speedup over the turns decoded at each point."""

from __future__ import annotations

import pytest

from evalsuite.train.card import context_point_rows
from tests.helpers import turn, write_run


def _at(point: int, context: int, steps, decode_s: float) -> dict:
    return {**turn(steps, decode_s=decode_s, new_tokens=10, ar_decode_s=2.0, ar_new_tokens=10,
                   context_len=context), "context_point": point}


def test_rows_per_context_point(tmp_path):
    run = write_run(tmp_path / "agent", "swebench", {
        "dlite": {"a": [_at(2048, 2100, [(3, 3), (3, 1)], 1.0), _at(8192, 8300, [(3, 0)], 2.0)],
                  "b": [_at(2048, 2500, [(3, 2)], 1.0), _at(8192, 9000, [(3, 0), (3, 0)], 4.0)]},
        "ar": {"a": [_at(2048, 2100, [(0, 0)], 2.0), _at(8192, 8300, [(0, 0)], 2.0)],
               "b": [_at(2048, 2500, [(0, 0)], 2.0), _at(8192, 9000, [(0, 0)], 2.0)]}})
    rows = context_point_rows(run, "dlite", {"task": "swebench"})
    assert [r["context"] for r in rows] == ["point 2,048: 2,100–2,500 tokens", "point 8,192: 8,300–9,000 tokens"]
    assert rows[0]["tau"] == pytest.approx((4 + 2 + 3) / 3)  # bonus token counted
    assert rows[1]["tau"] == pytest.approx(1.0)
    assert rows[0]["speedup"] == pytest.approx(2.0) and rows[1]["speedup"] == pytest.approx(4.0 / 6.0)
    assert all(r["samples"] == 2 and r["task"] == "swebench" for r in rows)


def test_a_run_without_points_adds_no_rows(tmp_path):
    run = write_run(tmp_path / "gsm8k", "gsm8k", {"dlite": {"a": [turn([(3, 3)], context_len=100)]},
                                                  "ar": {"a": [turn([(0, 0)], context_len=100)]}})
    assert context_point_rows(run, "dlite", {}) == []


def test_a_row_carries_a_bootstrap_interval_over_its_samples(tmp_path):
    # three samples at one point with τ 4, 2 and 1 (bonus token counted): the pooled τ is 7/3; the interval
    # resamples whole samples, so it lies within the samples' own τ and holds the pooled value
    samples = {"a": [(3, 3)], "b": [(3, 1)], "c": [(3, 0)]}
    run = write_run(tmp_path / "agent", "swebench", {
        "dlite": {s: [_at(2048, 2100 + i, steps, 1.0)] for i, (s, steps) in enumerate(samples.items())},
        "ar": {s: [_at(2048, 2100 + i, [(0, 0)], 2.0)] for i, s in enumerate(samples)}})
    (row,) = context_point_rows(run, "dlite", {})
    low, high = row["tau_ci"]
    assert row["tau"] == pytest.approx(7 / 3)
    assert 1.0 <= low < row["tau"] < high <= 4.0
    assert context_point_rows(run, "dlite", {})[0]["tau_ci"] == [low, high]  # seeded: the same card twice


def test_no_interval_below_three_samples(tmp_path):
    run = write_run(tmp_path / "agent", "swebench", {
        "dlite": {"a": [_at(2048, 2100, [(3, 3)], 1.0)], "b": [_at(2048, 2200, [(3, 0)], 1.0)]},
        "ar": {"a": [_at(2048, 2100, [(0, 0)], 2.0)], "b": [_at(2048, 2200, [(0, 0)], 2.0)]}})
    assert context_point_rows(run, "dlite", {})[0]["tau_ci"] is None


def test_a_run_attached_again_under_another_name_replaces_its_rows(tmp_path):
    # a drafter's card with one GSM8K run attached, then the same run committed under another directory name and
    # attached: its rows are replaced (matched by the run_id it was written under), not listed twice
    import json
    import shutil
    from pathlib import Path

    from evalsuite.train.card import attach_evaluations

    shipped = Path(__file__).resolve().parents[1] / "baselines" / "drafters" / "dlite"
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    for name in ("training_report.json", "config.json"):
        shutil.copy(shipped / name, drafter / name)
    report = json.loads((drafter / "training_report.json").read_text())
    report["heldout_eval"] = []
    (drafter / "training_report.json").write_text(json.dumps(report))
    run = write_run(tmp_path / "eval" / "dlite-gsm8k", "gsm8k", {
        "dlite": {s: [turn([(3, 3), (3, 1)], context_len=100)] for s in "abc"},
        "ar": {s: [turn([(0, 0)], context_len=100)] for s in "abc"}})
    attach_evaluations(drafter, [run])
    copied = shutil.copytree(run, tmp_path / "committed" / "dlite-shipped-gsm8k")
    attach_evaluations(drafter, [copied])
    rows = json.loads((drafter / "training_report.json").read_text())["heldout_eval"]
    assert [(r["run"], r["run_id"]) for r in rows] == [("dlite-shipped-gsm8k", "dlite-gsm8k")]
    assert rows[0]["tau"] == pytest.approx(3.0)  # (4 + 2) / 2 verify steps, bonus counted
    card = (drafter / "MODEL_CARD.md").read_text()
    assert "dlite-shipped-gsm8k" in card and "| dlite-gsm8k |" not in card
