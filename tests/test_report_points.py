"""The long-context answer of a run decoded at context points (issue 31, item 4): one bin per point, where each
method's speedup crosses 1.0, the published curves beside ours, and the three questions answered only from the
within-trajectory slopes and their paired differences. Records are planted; the statistics are computed."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from evalsuite.report import effects, points, stats
from evalsuite.report.build import write_report
from evalsuite.report.load import load_results
from tests.helpers import turn, write_run

POINTS = (2048, 4096, 8192, 16384)


def _turns(accepted: list[int], decode_s: list[float], sample: int, below: bool = False) -> list[dict]:
    """One trajectory decoded at every point: accepted drafts per step (two steps per turn, K = 3)."""
    out = []
    for i, (point, a, d) in enumerate(zip(POINTS, accepted, decode_s)):
        wobble = (sample + i) % 2  # a little spread between trajectories, so the intervals are not degenerate
        steps = [(3, a), (3, max(0, min(3, a - wobble)))]
        context = point - 8 if below else point + 40 * (sample + 1)
        out.append({**turn(steps, decode_s=d * (1 + 0.01 * sample), new_tokens=10, ar_decode_s=2.0,
                           ar_new_tokens=10, context_len=context, output_ids=[sample, i, 7]),
                    "context_point": point})
    return out


@pytest.fixture
def study(tmp_path):
    samples = [f"s{i}" for i in range(6)]
    methods = {
        "ar": {s: _turns([0, 0, 0, 0], [2.0] * 4, i) for i, s in enumerate(samples)},
        "eagle3": {s: _turns([3, 2, 1, 0], [1.0, 1.5, 2.5, 3.0], i) for i, s in enumerate(samples)},
        "eagle3:window=2048": {s: _turns([2, 2, 2, 2], [1.2] * 4, i) for i, s in enumerate(samples)},
        "dlite": {s: _turns([2, 2, 2, 2], [1.0] * 4, i) for i, s in enumerate(samples)},
    }
    return write_run(tmp_path / "points", "swebench", methods, context_points=list(POINTS))


def test_points_are_the_bins_and_the_crossing_is_interpolated(study):
    results = load_results([study])
    curves = stats.context_curves(results.steps, results.turns, 0, 200)
    assert points.point_tasks(results.turns) == ["swebench"]
    eagle = curves[curves.method == "eagle3"].sort_values("context_lo")
    assert list(eagle.context_lo) == list(POINTS)  # one bin per point, labelled by the point
    table = points.crossings(curves, ["swebench"]).set_index("method")
    s4, s8 = eagle.speedup.iloc[1], eagle.speedup.iloc[2]
    expected = math.exp(math.log(4096) + math.log(2) * (s4 - 1) / (s4 - s8))
    assert table.loc["eagle3", "crossing_context"] == pytest.approx(expected)
    assert table.loc["eagle3", "crossing"].startswith("falls below 1.0 at ≈ ")
    assert "between 4,096 and 8,192" in table.loc["eagle3", "crossing"]
    assert table.loc["dlite", "crossing"] == "above 1.0 at every point: not within 16,384 tokens"
    assert math.isnan(table.loc["dlite", "crossing_context"])


def test_a_document_cut_below_its_point_stays_in_its_points_bin(tmp_path):
    samples = [f"s{i}" for i in range(3)]
    run = write_run(tmp_path / "lb", "longbench-v2", {
        "ar": {s: _turns([0] * 4, [2.0] * 4, i, below=True) for i, s in enumerate(samples)},
        "dlite": {s: _turns([2] * 4, [1.0] * 4, i, below=True) for i, s in enumerate(samples)}})
    results = load_results([run])
    curves = stats.context_curves(results.steps, results.turns, 0, 100)
    assert list(curves.sort_values("context_lo").context_lo) == list(POINTS)
    assert (curves.n_turns == 3).all()


def test_findings_answer_the_three_questions_from_the_paired_differences(study):
    results = load_results([study])
    steps, turns = results.steps, results.turns
    curves = stats.context_curves(steps, turns, 0, 300)
    effect = effects.context_effect(steps, turns, 0, 300)
    methods = ["eagle3", "eagle3:window=2048", "dlite"]
    differences = effects.slope_differences(steps, turns, 0, 300,
                                            [(a, b) for i, a in enumerate(methods) for b in methods[i + 1:]])
    lines = points.findings(effect, differences, curves, ["swebench"], points.load_curves())
    assert len(lines) == 1
    text = lines[0]
    assert "EAGLE-3's τ falls with context here" in text and "so as published" in text
    assert "2.29 at 2,048 → 1.08 at 20,480" in text  # one source's curve, not two sources joined
    assert "eagle3:window=2048: τ holds" in text and "the window stops the fall" in text
    assert "DLite's τ holds" in text and "it holds where eagle3 (" in text


def test_same_slopes_give_no_holds_where_sentence(tmp_path):
    """DLite falling exactly as EAGLE-3 does: no "holds where … falls" and no "stops the fall"."""
    samples = [f"s{i}" for i in range(6)]
    run = write_run(tmp_path / "same", "swebench", {
        "ar": {s: _turns([0] * 4, [2.0] * 4, i) for i, s in enumerate(samples)},
        "eagle3": {s: _turns([3, 2, 1, 0], [1.0] * 4, i) for i, s in enumerate(samples)},
        "dlite": {s: _turns([3, 2, 1, 0], [1.0] * 4, i) for i, s in enumerate(samples)}})
    results = load_results([run])
    curves = stats.context_curves(results.steps, results.turns, 0, 200)
    effect = effects.context_effect(results.steps, results.turns, 0, 200)
    differences = effects.slope_differences(results.steps, results.turns, 0, 200, [("dlite", "eagle3")])
    text = points.findings(effect, differences, curves, ["swebench"])[0]
    assert "DLite's τ falls" in text and "holds where" not in text
    assert "not separable from that of eagle3" in text


def test_published_curves_beside_ours_and_the_report_section(study, tmp_path):
    published = points.load_curves()
    assert {"eagle3", "dspark", "dlite"} <= set(published.method)
    assert np.isfinite(published.value).all()
    results = load_results([study])
    curves = stats.context_curves(results.steps, results.turns, 0, 100)
    beside = points.published_beside(curves, published, ["swebench"])
    window = beside[(beside.variant == "sliding window") & (beside.context == 16384)].iloc[0]
    assert window.our_method == "eagle3:window=2048" and window.our_point == 16384
    full = beside[(beside.variant == "full attention") & (beside.context == 2048)].iloc[0]
    assert full.our_method == "eagle3" and full.our_tau == pytest.approx(
        curves[(curves.method == "eagle3") & (curves.context_lo == 2048)].tau.iloc[0])
    far = beside[(beside.method == "eagle3") & (beside.context == 98304)].iloc[0]
    assert pd.isna(far.our_method) and np.isnan(far.our_tau)  # our points stop at 16k: 6× away
    report = write_report([study], tmp_path / "report", n_resamples=100, analytic=False)
    page = (tmp_path / "report" / "report.md").read_text()
    assert "The long-context answer: context points" in page and "EAGLE-3's τ falls" in page
    names = {p.name for p in report.files}
    assert {"context_crossing.md", "published_context.md"} <= names


def test_runs_without_points_get_no_section(tmp_path):
    run = write_run(tmp_path / "plain", "gsm8k", {"ar": {"a": [turn([(0, 0)])]}, "dlite": {"a": [turn([(3, 2)])]}})
    assert points.point_tasks(load_results([run]).turns) == []
