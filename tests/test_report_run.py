"""`evalsuite report` on real runs of a tiny target: every table, figure and page is produced and consistent."""

from __future__ import annotations

import html
import json
import re

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from evalsuite import metrics
from evalsuite.cli import app
from tests.helpers import load_steps, load_turns
from evalsuite.report.summary import summary_rows

cli = CliRunner()
FIGURES = ("speedup_vs_context", "tau_vs_context", "cost_vs_context", "tau_vs_turn", "per_position",
           "speedup_per_task")
TABLES = ("table1_T0", "ar_baseline", "speedup_vs_context", "context_effect", "break_even", "cost_vs_context",
          "telemetry", "degenerate_turns", "without_degenerate", "summary", "per_position", "per_position_terciles",
          "draft_length", "tau_turn_macro", "cost", "published_comparison", "all_results", "data_provenance",
          "provenance", "runs", "environment")


def expected_files(tables) -> list[str]:
    files = ["report.md", "index.html"]
    files += [f"tables/{t}.{ext}" for t in tables for ext in ("md", "tex", "csv")]
    files += [f"figures/{f}.{ext}" for f in FIGURES for ext in ("png", "svg")]
    return files


@pytest.fixture(scope="module")
def real_runs(tiny_llama_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("report-runs")
    runs = []
    for task in ("gsm8k", "mt-bench"):
        out = root / task
        result = cli.invoke(app, ["run", "--method", "ngram,ar", "--task", task, "--target", str(tiny_llama_dir),
                                  "--limit", "2", "--max-new-tokens", "24", "--k", "4", "--threads", "1", "--out", str(out)],
                            catch_exceptions=False)
        assert result.exit_code == 0, result.output
        runs.append(out)
    return runs


@pytest.fixture(scope="module")
def report_dir(real_runs, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "tiny"
    result = cli.invoke(app, ["report", *map(str, real_runs), "--out", str(out), "--resamples", "300"],
                        catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return out


def test_every_file_is_written_and_not_empty(report_dir):
    for name in expected_files(TABLES):
        path = report_dir / name
        assert path.is_file(), name
        assert path.stat().st_size > 100, name
    for figure in FIGURES:
        assert (report_dir / "figures" / f"{figure}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "<svg" in (report_dir / "figures" / f"{figure}.svg").read_text()[:2000]


def test_html_links_resolve_and_show_every_table(real_runs, report_dir):
    page = (report_dir / "index.html").read_text()
    for link in re.findall(r'(?:src|href)="([^"#]+)"', page):
        assert (report_dir / link).is_file(), link
    for table in TABLES:
        assert f'id="{table}"' in page
    target_name = json.loads((real_runs[0] / "run.json").read_text())["target_name"]
    assert html.escape(target_name) in page  # the header names the target that was actually run
    assert "torch" in page and "target_sha256" in page


def test_report_numbers_agree_with_the_records_and_the_run_summary(real_runs, report_dir):
    table = pd.read_csv(report_dir / "tables" / "all_results.csv")
    for run in real_runs:
        task = load_turns(run).task.iloc[0]
        steps = load_steps(run)
        for row in summary_rows(run):
            ours = table[(table.method == row["method"]) & (table.task == task)].iloc[0]
            assert ours.tau == pytest.approx(row["tau"])
            assert ours.tau == pytest.approx(metrics.tau(steps[steps.method == row["method"]]))
            assert ours.speedup == pytest.approx(row["speedup"])
            if row["method"] != "ar" and ours.trajectories >= 3:  # ar: 1 by construction; n < 3: no interval
                assert ours.tau_ci_low <= ours.tau <= ours.tau_ci_high
            else:
                assert np.isnan(ours.tau_ci_low)
    ar = table[table.method == "ar"]
    assert ar.tau_ci_low.isna().all() and ar.speedup_ci_low.isna().all()
    assert (ar.tau == 1.0).all() and ar.speedup.to_numpy() == pytest.approx(1.0)


def test_single_formats_write_only_their_files(real_runs, tmp_path):
    result = cli.invoke(app, ["report", str(real_runs[0]), "--out", str(tmp_path / "r"), "--format", "latex",
                              "--resamples", "200"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    written = {p.relative_to(tmp_path / "r").as_posix() for p in (tmp_path / "r").rglob("*") if p.is_file()}
    assert not any(name.endswith((".md", ".csv", ".html")) for name in written)
    assert "tables/table1_T0.tex" in written and "figures/per_position.svg" in written


def test_general_and_agentic_tasks_share_table_1(tmp_path):
    from tests.helpers import ALPHA_GSM8K, write_run
    from evalsuite.report.build import write_report

    general = write_run(tmp_path / "g", "gsm8k", {"alpha": ALPHA_GSM8K})
    swe = write_run(tmp_path / "s", "swebench", {"alpha": ALPHA_GSM8K})
    report = write_report([general, swe], tmp_path / "rep", n_resamples=200)
    # no `ar` steps: no break-even τ; every turn at one context: no terciles
    for name in expected_files([t for t in TABLES if t not in ("break_even", "per_position_terciles")]):
        assert (tmp_path / "rep" / name).is_file(), name
    assert not report.notes
    table1 = pd.read_csv(tmp_path / "rep" / "tables" / "table1_T0.csv")
    assert set(table1.task) == {"gsm8k", "swebench", "Mean"}


def test_the_runner_records_degenerate_flags_and_the_replay_source(real_runs):
    for run in real_runs:
        turns = load_turns(run)
        assert turns.degenerate.notna().all() and turns.degenerate_reason.notna().all()
        config = json.loads((run / "run.json").read_text())
        assert config["replay_source"] and "degenerate" in config["conventions"]


def test_swebench_results_split_by_repository(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from evalsuite.report.load import load_results
    from evalsuite.report.tables import repository_table
    from tests.helpers import turn, write_run

    run = write_run(tmp_path / "swe", "swebench", {
        "ngram": {"s1": [turn([(3, 3)])], "s2": [turn([(3, 0)])]},
        "ar": {"s1": [turn([(0, 0)])], "s2": [turn([(0, 0)])]}})
    for part in (run / "turns.parquet").glob("*.parquet"):  # the runner fills `repo` from the instance
        table = pq.read_table(part).to_pandas()
        table["repo"] = table.sample_id.map({"s1": "django/django", "s2": "psf/requests"})
        pq.write_table(pa.Table.from_pandas(table, preserve_index=False), part)
    results = load_results([run])
    table = repository_table(results.steps, results.turns)
    by_repo = table.csv.set_index("repo")
    assert set(by_repo.index) == {"django/django", "psf/requests"} and (by_repo.method == "ngram").all()
    assert by_repo.tau["django/django"] == 4.0 and by_repo.tau["psf/requests"] == 1.0
