"""The report's answer to its question: context curves within each task with their n, the headline's summary.csv
(losslessness included), honest intervals, provenance without machine paths, tolerant loading and filters."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from evalsuite.cli import app
from evalsuite.errors import UserError
from evalsuite.report import stats
from evalsuite.report.build import write_report
from evalsuite.report.load import load_results
from tests.helpers import turn, write_run

CONTEXT_COLUMNS = ["task", "method", "context_lo", "context_hi", "n_trajectories", "n_turns", "n_steps", "tau",
                   "tau_lo", "tau_hi", "speedup", "speedup_lo", "speedup_hi"]
CSV_COLUMNS = CONTEXT_COLUMNS[:CONTEXT_COLUMNS.index("tau_hi") + 1] + ["tau_break_even"] + \
    CONTEXT_COLUMNS[CONTEXT_COLUMNS.index("tau_hi") + 1:]  # speedup_vs_context.csv: break-even τ beside τ
SUMMARY_COLUMNS = ["task", "method", "temperature", "n_trajectories", "n_turns", "tau", "speedup",
                   "ar_ms_per_token", "differs_from_ar"]


def agentic(n_samples: int, contexts=(1000, 2000, 4000, 8000), accepted=2, decode_s=1.0):
    """Trajectories of len(contexts) turns; a later turn is slower for the method, as at long contexts."""
    return {f"s{i}": [turn([(3, accepted)] * 4, decode_s=decode_s * (1 + j), context_len=c)
                      for j, c in enumerate(contexts)] for i in range(n_samples)}


@pytest.fixture
def two_tasks(tmp_path):
    short = write_run(tmp_path / "runs" / "short", "gsm8k", {
        "alpha": {f"q{i}": [turn([(3, 1)] * 3, context_len=50 + 10 * i)] for i in range(6)},
        "ar": {f"q{i}": [turn([(0, 0)] * 5, decode_s=2.0, context_len=50 + 10 * i)] for i in range(6)}})
    long = write_run(tmp_path / "runs" / "long", "swebench", {"alpha": agentic(3), "ar": {
        f"s{i}": [turn([(0, 0)] * 5, decode_s=2.0, context_len=c) for c in (1000, 2000, 4000, 8000)]
        for i in range(3)}})
    return [short, long]


def test_context_bins_stay_within_a_task_and_carry_their_n(two_tasks):
    results = load_results(two_tasks)
    curves = stats.context_curves(results.steps, results.turns, seed=0, n_resamples=200)
    assert list(curves.columns[:len(CONTEXT_COLUMNS)]) == CONTEXT_COLUMNS
    for task, contexts in (("gsm8k", range(50, 101, 10)), ("swebench", (1000, 8000))):
        cells = curves[curves.task == task]
        assert cells.context_lo.min() == min(contexts) and cells.context_hi.max() == max(contexts)
    # the gsm8k bins end below the first swebench context: no bin holds both tasks
    assert curves[curves.task == "gsm8k"].context_hi.max() < curves[curves.task == "swebench"].context_lo.min()
    swe = curves[curves.task == "swebench"].sort_values("context_lo")
    assert len(swe) == 2  # 4 distinct contexts x 3 samples: two bins of two turns per trajectory
    assert list(swe.n_trajectories) == [3, 3] and list(swe.n_turns) == [6, 6] and list(swe.n_steps) == [24, 24]
    assert swe.tau.to_numpy() == pytest.approx([3.0, 3.0])
    # AR takes 2 s per 10 tokens; the method 1+2 s, then 3+4 s over 20 tokens: pooled speedup per bin
    assert swe.speedup.to_numpy() == pytest.approx([(4 / 20) / (3 / 20), (4 / 20) / (7 / 20)])
    assert (swe.speedup_lo <= swe.speedup).all() and (swe.speedup <= swe.speedup_hi).all()
    gsm = curves[curves.task == "gsm8k"]
    assert gsm.n_turns.sum() == 6 and (gsm.n_trajectories == gsm.n_turns).all()  # one turn per trajectory
    assert "ar" not in set(curves.method)


def test_a_single_trajectory_cell_prints_its_value_and_no_interval(tmp_path):
    run = write_run(tmp_path / "one", "swebench", {"alpha": agentic(1)})
    report = write_report([run], tmp_path / "report", {"md", "csv"}, n_resamples=200)
    csv = pd.read_csv(report.out / "tables" / "speedup_vs_context.csv")
    assert list(csv.columns) == CSV_COLUMNS
    assert (csv.n_trajectories == 1).all()
    assert csv[["tau_lo", "tau_hi", "speedup_lo", "speedup_hi"]].isna().all().all()
    markdown = (report.out / "tables" / "speedup_vs_context.md").read_text()
    assert "(n=1)" in markdown and "±" not in markdown.split("\n- ")[0] and "[" not in markdown.split("\n- ")[0]
    assert "† fewer than 5 trajectories" in markdown
    summary = pd.read_csv(report.out / "tables" / "all_results.csv")
    assert summary.tau_ci_low.isna().all()  # not the degenerate "± 0.00" of a one-trajectory bootstrap


def test_summary_csv_counts_a_planted_divergence_from_ar(tmp_path):
    ar = {f"q{i}": [turn([(0, 0)] * 3, decode_s=3.0, output_ids=(7, 8, 9))] for i in range(3)}
    same = {f"q{i}": [turn([(3, 2)], output_ids=(7, 8, 9))] for i in range(3)}
    diverged = dict(same, q1=[turn([(3, 2)], output_ids=(7, 8, 10))])  # one turn differs at its last token
    run = write_run(tmp_path / "g", "gsm8k", {"good": same, "bad": diverged, "ar": ar})
    report = write_report([run], tmp_path / "report", {"csv", "md"}, n_resamples=200)
    summary = pd.read_csv(report.out / "tables" / "summary.csv")
    assert list(summary.columns) == SUMMARY_COLUMNS
    row = summary.set_index("method")
    assert row.loc["bad", "differs_from_ar"] == 1 and row.loc["good", "differs_from_ar"] == 0
    assert np.isnan(row.loc["ar", "differs_from_ar"])
    assert row.loc["good", "ar_ms_per_token"] == pytest.approx(1e3 * 9.0 / 30)
    assert row.loc["good", "n_trajectories"] == 3 and row.loc["good", "n_turns"] == 3
    page = (report.out / "report.md").read_text()
    headline = page[page.index("## Headline"):page.index("## Speedup and τ against context")]
    assert "Losslessness at T = 0: 1 of 6 drafted turns differ" in headline and "bad on gsm8k: 1 of 3" in headline
    assert "300.0 ms/token (3.3 tokens/s)" in headline


def test_no_divergence_is_counted_when_sampling(tmp_path):
    run = write_run(tmp_path / "hot", "gsm8k", {
        "alpha": {"q0": [turn([(3, 2)], output_ids=(1,))]}, "ar": {"q0": [turn([(0, 0)], output_ids=(2,))]}},
        temperature=0.7)
    summary = pd.read_csv(write_report([run], tmp_path / "r", {"csv"}, n_resamples=200).out / "tables" /
                          "summary.csv")
    assert summary.differs_from_ar.isna().all()


def test_no_file_of_a_report_holds_the_runs_absolute_directory(two_tasks, tmp_path):
    checkpoint = tmp_path / "checkpoints" / "alpha-ckpt"
    checkpoint.mkdir(parents=True)
    for run in two_tasks:  # a drafter checkpoint and a target path recorded as the runner records them
        config = json.loads((run / "run.json").read_text())
        config["drafters"] = {"alpha": {"checkpoint": str(checkpoint), "checkpoint_sha256": "a" * 64}}
        config["target"] = str(tmp_path / "target")
        (run / "run.json").write_text(json.dumps(config))
    part = write_run(tmp_path / "runs" / "part", "mt-bench", {"alpha": {"s1": [turn([(3, 1)])]}},
                     sample_ids=["s1", "s2"])  # an unfinished run: its note names the directory
    report = write_report([*two_tasks, part], tmp_path / "report", n_resamples=200)
    files = [p for p in report.out.rglob("*") if p.is_file()]
    assert len(files) > 30
    for path in files:
        text = path.read_bytes().decode("utf-8", errors="ignore")
        assert str(tmp_path) not in text, path.name
    runs = (report.out / "tables" / "runs.md").read_text()
    assert "../runs/short" in runs and "../checkpoints/alpha-ckpt" in runs
    provenance = pd.read_csv(report.out / "tables" / "provenance.csv")
    assert "a" * 64 in set(provenance.sha256) and "t" * 64 in set(provenance.sha256)


def test_a_dirty_commit_is_flagged_in_the_header(tmp_path):
    run = write_run(tmp_path / "d", "gsm8k", {"alpha": {"s1": [turn([(3, 1)])]}},
                    environment={"git_commit": "abc1234+dirty", "versions": {}})
    report = write_report([run], tmp_path / "r", {"html", "md"}, n_resamples=200)
    page = (report.out / "index.html").read_text()
    header = page[:page.index('<h2 id="headline">')]
    assert "abc1234+dirty" in header and "uncommitted changes" in header


def test_headline_comes_first_and_configuration_last(two_tasks, tmp_path):
    report = write_report(two_tasks, tmp_path / "r", {"html"}, n_resamples=200)
    page = (report.out / "index.html").read_text()
    order = [page.index(marker) for marker in ('id="headline"', 'id="table1_T0"', 'id="ar_baseline"',
                                                'id="context"', 'id="speedup_vs_context"', 'id="cost_vs_context"',
                                                'id="configuration"', 'id="runs"', 'id="environment"')]
    assert order == sorted(order)
    assert "<img" not in page[:page.index('id="context"')]  # the headline is text and tables


def _rewrite_parts(directory, change):
    for part in directory.glob("*.parquet"):
        table = change(pq.read_table(part))
        pq.write_table(table, part)


def _newer_and_renamed(table: pa.Table) -> pa.Table:
    """A later version's turns table: one column more, and the per-turn speedup under another name."""
    table = table.append_column("added_later", pa.array(["h"] * len(table)))
    return table.rename_columns(["speedup_turn" if n == "speedup" else n for n in table.column_names])


def _older(table: pa.Table) -> pa.Table:
    """An earlier version's table: without the columns added since (the report fills them)."""
    return table.drop([c for c in ("draft_history_bytes", "worker_host", "dropped_messages")
                       if c in table.column_names])


def test_the_loader_tolerates_new_columns_and_older_runs_without_some(two_tasks):
    short = two_tasks[0]
    _rewrite_parts(short / "turns.parquet", _newer_and_renamed)
    _rewrite_parts(short / "steps.parquet", _older)
    _rewrite_parts(two_tasks[1] / "turns.parquet", _older)
    results = load_results(two_tasks)
    assert "added_later" in results.turns.columns and "speedup_turn" in results.turns.columns
    summary = stats.summarize(results.steps, results.turns, n_resamples=200).set_index(["method", "task"])
    assert summary.loc[("alpha", "gsm8k"), "speedup"] == pytest.approx(2.0)  # pooled, not the per-turn column
    _rewrite_parts(short / "steps.parquet", lambda t: t.drop(["num_accepted"]))
    with pytest.raises(UserError, match="'num_accepted' is missing"):
        load_results(two_tasks)


def test_report_filters_by_task_and_method(two_tasks, tmp_path):
    out = tmp_path / "filtered"
    result = CliRunner().invoke(app, ["report", *map(str, two_tasks), "--out", str(out), "--task", "swebench",
                                      "--method", "alpha", "--format", "csv", "--resamples", "200"])
    assert result.exit_code == 0, result.output
    summary = pd.read_csv(out / "tables" / "summary.csv")
    assert set(summary.task) == {"swebench"} and set(summary.method) == {"alpha", "ar"}
    result = CliRunner().invoke(app, ["report", *map(str, two_tasks), "--out", str(out), "--task", "mt-bench"])
    assert result.exit_code == 2 and "--task mt-bench: not in these runs" in result.output
    result = CliRunner().invoke(app, ["report", *map(str, two_tasks), "--out", str(out), "--method", "zeta"])
    assert result.exit_code == 2 and "--method zeta" in result.output


def test_cost_against_context_takes_the_decode_from_ar(two_tasks):
    results = load_results(two_tasks)
    costs = stats.cost_curves(results.steps, results.turns)
    swe = costs[costs.task == "swebench"]
    assert set(swe.method) == {"alpha", "ar"}
    assert list(swe.ar_decode_ms) == pytest.approx([10.0] * len(swe))  # the test records' verify_s: 0.01 s per step
    assert swe[swe.method == "alpha"].draft_ms.notna().all() and swe.n_steps.sum() == 3 * 4 * 4 + 3 * 4 * 5
