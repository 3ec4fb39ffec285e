"""`evalsuite report` on hand-built results with known values: τ, per-position rates, speedup, bolding, bootstrap,
the mixed-configuration refusal and the published-number matching."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from evalsuite import metrics
from evalsuite.cli import app
from evalsuite.errors import UserError
from evalsuite.report import stats
from evalsuite.report.build import parse_formats, write_report
from evalsuite.report.load import load_results
from evalsuite.report.published import PUBLISHED_DIR, comparison_table, load_published
from evalsuite.report.formatting import Cell, to_latex, to_markdown
from evalsuite.report.tables import headline_tables, mark_ranked
from tests.helpers import ALPHA_GSM8K, turn, write_run

@pytest.fixture
def general_run(tmp_path):
    return write_run(tmp_path / "general", "gsm8k", {
        "alpha": ALPHA_GSM8K,
        "beta": {"s1": [turn([(3, 0), (3, 0)])], "s2": [turn([(3, 0)])]},
        "ar": {"s1": [turn([(0, 0)] * 3, decode_s=2.0)], "s2": [turn([(0, 0)] * 3, decode_s=3.0)]},
    })


@pytest.fixture
def chat_run(tmp_path):
    return write_run(tmp_path / "chat", "mt-bench", {
        "alpha": {"s1": [turn([(3, 1), (3, 0)])]},
        "beta": {"s1": [turn([(3, 2)])]},
    }, max_new_tokens=128)  # max_new_tokens may differ between tasks


# ---- exact values ----------------------------------------------------------------------------------------------
def test_tau_macro_speedup_and_skipped_are_exact(general_run):
    results = load_results([general_run])
    summary = stats.summarize(results.steps, results.turns, seed=0, n_resamples=200).set_index(["method", "task"])
    alpha = summary.loc[("alpha", "gsm8k")]
    # accepted + 1 per step: 4, 1, 2 | 3 | 2, 1  →  13 / 6 token-weighted
    assert alpha.tau == pytest.approx(13 / 6)
    # per turn: 7/3, 3, 3/2 → unweighted mean
    assert alpha.tau_turn_macro == pytest.approx(float((Fraction(7, 3) + 3 + Fraction(3, 2)) / 3))
    # pooled: AR (2 + 1 + 3) s / 25 tokens over method (1 + 1 + 1.5) s / 25 tokens; the skipped turn is left out
    assert alpha.speedup == pytest.approx((6.0 / 25) / (3.5 / 25))
    assert (alpha.turns, alpha.skipped, alpha.trajectories, alpha.steps) == (3, 1, 2, 6)
    assert np.isnan(alpha.tau_ci_low) and np.isnan(alpha.speedup_ci_high)  # two trajectories: no interval


def test_per_position_conditional_and_marginal_over_every_step_with_room(general_run):
    results = load_results([general_run])
    steps, turns = results.steps, results.turns
    alpha = steps[steps.method == "alpha"]
    # steps: (3,3) (3,0) (2,1) | (3,2) | (3,1) (0,0); every turn ends at EOS far below its budget of 64, so each
    # step had room for k = 3: the (2,1) step chose to draft 2, and the (0,0) step proposed nothing
    room = metrics.draft_room(alpha, turns, {"general": {"k": 3, "max_new_tokens": 64}})
    assert room.tolist() == [3] * 6
    table = metrics.per_position(alpha, room=room).set_index("position")
    assert list(table.room) == [6, 6, 6]
    assert list(table.drafted) == [5, 5, 4]
    assert list(table.reached) == [6, 4, 2]
    assert list(table.accepted) == [4, 2, 1]
    assert list(table.conditional) == pytest.approx([4 / 6, 2 / 4, 1 / 2])
    assert list(table.marginal) == pytest.approx([4 / 6, 2 / 6, 1 / 6])


def test_marginal_rates_sum_to_tau_minus_one_for_fixed_draft_length():
    steps = pd.DataFrame({"num_drafted": [4, 4, 4, 4], "num_accepted": [0, 4, 2, 1]})
    table = metrics.per_position(steps)
    assert table.marginal.sum() == pytest.approx(metrics.tau(steps) - 1)


def test_table1_puts_tau_and_speedup_side_by_side_per_task_with_a_mean(general_run, chat_run):
    results = load_results([general_run, chat_run])
    summary = stats.summarize(results.steps, results.turns, seed=0, n_resamples=200)
    (table,) = headline_tables(summary, results.methods, results.tasks)  # one temperature: one block
    assert table.name == "table1_T0"
    assert [name.split(" (")[0] for name, _ in table.groups] == ["", "gsm8k", "mt-bench", "Mean"]
    assert table.groups[1][0] == "gsm8k (n=2, 3 turns)"
    assert table.header == ["Method"] + ["τ", "speedup"] * 3
    rows = {row[0].value: row for row in table.rows}
    assert set(rows) == {"alpha", "beta"}  # the ar baseline is omitted
    alpha, beta = rows["alpha"], rows["beta"]
    assert alpha[1].value == pytest.approx(13 / 6) and beta[1].value == pytest.approx(1.0)
    assert alpha[2].value == pytest.approx((6.0 / 25) / (3.5 / 25))
    assert alpha[3].value == pytest.approx(1.5) and beta[3].value == pytest.approx(3.0)
    assert alpha[5].value == pytest.approx((13 / 6 + 1.5) / 2) and beta[5].value == pytest.approx(2.0)
    # mt-bench has one trajectory: value and n=1, no interval, and it is never bolded
    assert alpha[3].text() == "1.50 (n=1) †" and "±" not in beta[3].text() and "[" not in beta[3].text()
    assert not any(c.bold for c in (alpha[3], beta[3]))
    markdown = to_markdown(table)
    assert "bonus included" in markdown and "bootstrap" in markdown and "1 turn(s) skipped" in markdown
    assert "† fewer than 5 trajectories" in markdown
    latex = to_latex(table)
    assert "\\toprule" in latex and "\\multicolumn{2}{c}{gsm8k (n=2, 3 turns)}" in latex


def test_one_block_per_temperature(general_run, tmp_path):
    hot = write_run(tmp_path / "hot", "mt-bench", {"alpha": {"s1": [turn([(3, 1)])]}}, temperature=1.0)
    results = load_results([general_run, hot])
    summary = stats.summarize(results.steps, results.turns, seed=0, n_resamples=200)
    tables = headline_tables(summary, results.methods, results.tasks)
    assert [t.name for t in tables] == ["table1_T0", "table1_T1"]
    assert [g[0].split(" (")[0] for g in tables[1].groups] == ["", "mt-bench T=1", "Mean"]


def _cells(*intervals):
    return [[Cell(f"m{i}"), Cell(v, lo, hi, n)] for i, (v, lo, hi, n) in enumerate(intervals)]


def test_intervals_print_as_bounds_and_not_below_three_trajectories():
    assert Cell(2.71, 1.50, 7.56, 5).text() == "2.71 [1.50, 7.56]"  # never "2.71 ± 3.03"
    assert Cell(1.29, 1.29, 1.29, 2).text() == "1.29 (n=2) †"  # never "1.29 ± 0.00"
    assert Cell(1.06, 0.91, 1.20, 3).text() == "1.06 [0.91, 1.20] †"


def test_bold_and_ties_come_from_the_paired_ranking_not_from_overlap():
    # overlapping intervals, but the paired ranking says m0 is clearly best: bold, no tie
    rows = _cells((2.0, 1.6, 2.4, 5), (1.9, 1.7, 2.1, 5), (1.0, 0.9, 1.1, 5))
    mark_ranked(rows, 1, {"m0": "best", "m1": "behind", "m2": "behind"})
    assert [r[1].bold for r in rows] == [True, False, False] and not any(r[1].tie for r in rows)
    assert rows[0][1].text() == "2.00 [1.60, 2.40]"
    # intervals clear of each other, but the paired ranking ties the two: ≈, none bold
    rows = _cells((2.0, 1.8, 2.2, 5), (1.5, 1.4, 1.7, 5), (1.0, 0.9, 1.1, 5))
    mark_ranked(rows, 1, {"m0": "tied for best", "m1": "tied for best", "m2": "behind"})
    assert not any(r[1].bold for r in rows) and [r[1].tie for r in rows] == [True, True, False]
    assert rows[1][1].text() == "1.50 [1.40, 1.70] ≈"
    rows = _cells((3.0, float("nan"), float("nan"), 1), (1.0, 0.9, 1.1, 5))
    mark_ranked(rows, 1, {"m0": "undecided (n<3)", "m1": "undecided (n<3)"})
    assert not any(r[1].bold or r[1].tie for r in rows)
    assert rows[0][1].text() == "3.00 (n=1) †"


# ---- bootstrap -------------------------------------------------------------------------------------------------
def synthetic_steps(n_trajectories: int) -> pd.DataFrame:
    """Trajectories of four kinds (accepting 0, 1, 2 or 3 drafts per step), repeated."""
    rows = []
    for i in range(n_trajectories):
        for step in range(10):
            rows.append({"run": "r", "sample_id": f"s{i}", "num_drafted": 3, "num_accepted": i % 4})
    return pd.DataFrame(rows)


def test_bootstrap_is_deterministic_with_a_seed_and_narrows_with_more_trajectories():
    many, few = synthetic_steps(40), synthetic_steps(4)
    units_many = list(dict.fromkeys(stats.trajectory_keys(many)))
    units_few = list(dict.fromkeys(stats.trajectory_keys(few)))
    first = stats.tau_ci(many, units_many, seed=7, n_resamples=500)
    assert stats.tau_ci(many, units_many, seed=7, n_resamples=500) == first
    assert stats.tau_ci(many, units_many, seed=8, n_resamples=500) != first
    width_many = first[1] - first[0]
    low, high = stats.tau_ci(few, units_few, seed=7, n_resamples=500)
    assert high - low > 2 * width_many
    assert low <= metrics.tau(few) <= high


def test_bootstrap_resamples_trajectories_not_steps():
    # one trajectory whose steps vary a lot: resampling whole trajectories leaves nothing to vary
    steps = pd.DataFrame({"run": "r", "sample_id": "only", "num_drafted": 3, "num_accepted": [0, 3, 0, 3, 1, 2]})
    low, high = stats.tau_ci(steps, ["r\0only"], seed=0, n_resamples=300)
    assert low == high == pytest.approx(metrics.tau(steps))


def test_report_cis_are_reproducible(general_run, tmp_path):
    a = write_report([general_run], tmp_path / "a", {"csv"}, seed=3, n_resamples=300)
    b = write_report([general_run], tmp_path / "b", {"csv"}, seed=3, n_resamples=300)
    name = "tables/all_results.csv"
    pd.testing.assert_frame_equal(pd.read_csv(a.out / name), pd.read_csv(b.out / name))


# ---- merging ---------------------------------------------------------------------------------------------------
def test_runs_of_one_task_at_two_temperatures_are_two_columns_never_pooled(general_run, tmp_path):
    hot = write_run(tmp_path / "hot", "gsm8k", {"alpha": {"s1": [turn([(3, 1)])]}}, temperature=1.0)
    results = load_results([general_run, hot])  # no --allow-mixed needed: nothing is mixed
    assert results.mixed == [] and results.tasks == ["gsm8k", "gsm8k T=1"]
    summary = stats.summarize(results.steps, results.turns, seed=0, n_resamples=200).set_index(["method", "task"])
    assert summary.loc[("alpha", "gsm8k T=1"), "trajectories"] == 1  # the hot run's own trajectory only
    assert summary.loc[("alpha", "gsm8k T=1"), "temperature"] == 1.0


@pytest.mark.parametrize("field, value", [("target_sha256", "u" * 64), ("chat_template_sha256", "d" * 16),
                                          ("enable_thinking", True), ("tokenizer_sha256", "t" * 64),
                                          ("threads", 7), ("weight_layout", "row-major")])
def test_other_drift_fields_are_refused(general_run, tmp_path, field, value):
    other = write_run(tmp_path / "other", "mt-bench", {"alpha": {"s1": [turn([(3, 1)])]}}, **{field: value})
    with pytest.raises(UserError, match=f"{field} differs"):
        load_results([general_run, other])


def test_same_task_needs_the_same_protocol_but_different_tasks_need_not(general_run, chat_run, tmp_path):
    load_results([general_run, chat_run])  # max_new_tokens 64 vs 128 on different tasks: fine
    longer = write_run(tmp_path / "longer", "gsm8k", {"gamma": {"s1": [turn([(3, 1)])]}}, max_new_tokens=128)
    with pytest.raises(UserError, match="max_new_tokens differs among the gsm8k runs"):
        load_results([general_run, longer])


@pytest.mark.parametrize("field, value", [("sample_ids", ["s1", "s3"]), ("max_turns", 1), ("data_sha256", "e" * 64)])
def test_a_different_sample_set_of_one_task_is_refused(tmp_path, field, value):
    config = {"sample_ids": ["s1", "s2"], "max_turns": None, "data_sha256": "f" * 64, "subset": "x"}
    first = write_run(tmp_path / "first", "longbench-v2", {"alpha": {"s1": [turn([(3, 1)])]}}, **config)
    second = write_run(tmp_path / "second", "longbench-v2", {"beta": {"s1": [turn([(3, 1)])]}},
                       **{**config, field: value})
    with pytest.raises(UserError, match=f"^{field} differs among the longbench-v2:x runs"):
        load_results([first, second])
    # the same samples listed in another order are the same selection
    third = write_run(tmp_path / "third", "longbench-v2", {"beta": {"s1": [turn([(3, 1)])]}},
                      **{**config, "sample_ids": ["s2", "s1"]})
    load_results([first, third])


def test_per_method_options_are_compared_for_shared_methods(general_run, tmp_path):
    with_option = write_run(tmp_path / "opt", "mt-bench", {"alpha": {"s1": [turn([(3, 1)])]}},
                            method_options={"alpha": {"confidence_threshold": 0.5}})
    with pytest.raises(UserError, match="method_options of method alpha differs"):
        load_results([general_run, with_option])
    other_method = write_run(tmp_path / "gamma", "mt-bench", {"gamma": {"s1": [turn([(3, 1)])]}},
                             method_options={"gamma": {"confidence_threshold": 0.5}})
    load_results([general_run, other_method])  # no method in common: nothing to compare


def test_cli_refuses_mixed_runs_with_exit_code_2(general_run, tmp_path):
    hot = write_run(tmp_path / "hot", "gsm8k", {"gamma": {"s1": [turn([(3, 1)])]}}, k=5)
    result = CliRunner().invoke(app, ["report", str(general_run), str(hot), "--out", str(tmp_path / "rep")])
    assert result.exit_code == 2 and "k differs" in result.output
    result = CliRunner().invoke(app, ["report", str(general_run), str(hot), "--out", str(tmp_path / "rep"),
                                      "--allow-mixed", "--format", "md", "--resamples", "200"])
    assert result.exit_code == 0, result.output
    assert "MIXED CONFIGURATIONS" in (tmp_path / "rep" / "report.md").read_text()


def test_a_trajectory_in_two_runs_is_counted_once(general_run, tmp_path):
    again = write_run(tmp_path / "again", "gsm8k", {"ar": {"s1": [turn([(0, 0)] * 3)]}, "delta": {"s1": [turn([])]}},
                      sample_ids=["s1", "s2"])  # the same selection, not finished
    results = load_results([general_run, again])
    ar = results.turns[results.turns.method == "ar"]
    assert len(ar) == 2 and set(ar.run) == {"general"}
    assert any("ar on gsm8k" in note for note in results.notes)


def test_not_a_run_directory_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no run.json"):
        load_results([tmp_path])
    with pytest.raises(UserError, match="--format"):
        parse_formats("pdf")
    assert parse_formats("all") == {"md", "latex", "csv", "html"}


# ---- published numbers -----------------------------------------------------------------------------------------
def test_published_numbers_have_sources_and_known_columns():
    published = load_published()
    assert {"dlite_tables_2_3.csv", "dspark_table_1.csv"} <= set(published.file)
    assert published.source.str.len().min() > 10
    assert set(published.metric) == {"tau", "speedup"}
    assert not published.value.isna().any()


def test_published_rows_are_shown_only_where_method_task_and_temperature_match(tmp_path):
    methods = {"dspark": {"s1": [turn([(3, 2), (3, 3)])]}, "ngram": {"s1": [turn([(3, 1)])]}}
    hot = write_run(tmp_path / "hot", "gsm8k", methods, temperature=1.0)
    results = load_results([hot])
    summary = stats.summarize(results.steps, results.turns, seed=0, n_resamples=200)
    published = load_published()
    table = comparison_table(results, summary, published)
    expected = published[(published.method == "dspark") & (published.task == "gsm8k") &
                         (published.temperature == 1.0)]
    assert len(table.rows) == len(expected) > 0
    assert sorted(table.csv.their_tau) == sorted(expected.value)
    assert set(table.csv.method) == {"dspark"}  # ngram has no published number
    assert any(note.startswith("THE TARGETS DIFFER") and "SmolLM2" in note and "Qwen3" in note
               for note in table.notes)
    cold = write_run(tmp_path / "cold", "gsm8k", methods, temperature=0.0)
    results = load_results([cold])
    summary = stats.summarize(results.steps, results.turns, seed=0, n_resamples=200)
    table = comparison_table(results, summary, published)
    assert table.rows == [] and any("no published number matches" in note for note in table.notes)


def test_longbench_subset_matches_the_published_shard(tmp_path):
    run = write_run(tmp_path / "lb", "longbench-v2", {"dlite": {"s1": [turn([(3, 2)])]}}, subset="code_repo")
    results = load_results([run])
    assert results.tasks == ["longbench-v2:code_repo"]
    summary = stats.summarize(results.steps, results.turns, seed=0, n_resamples=200)
    table = comparison_table(results, summary, load_published(PUBLISHED_DIR))
    assert set(table.csv.their_target) == {"Qwen3-4B", "Qwen3-8B"}
    assert table.csv.their_speedup.notna().all() and table.csv.their_tau.isna().all()


def test_an_unfinished_run_is_named(tmp_path):
    run = write_run(tmp_path / "part", "gsm8k", {"alpha": {"s1": [turn([(3, 1)])]}},
                    sample_ids=["s1", "s2", "s3"])
    notes = load_results([run], base=tmp_path / "report").notes
    assert notes == ["part: alpha finished 1 of the 3 selected samples (finish it with `evalsuite run ... "
                     "--out ../part --resume`)"]


def test_a_run_resumed_on_another_machine_names_both_machines_and_says_its_speedups_mix_them(tmp_path):
    from evalsuite.report.build import environment_table

    first = {"device_name": "cpu: Intel(R) Xeon(R) Platinum, 2 threads", "versions": {}}
    other = {"device_name": "cpu: AMD EPYC, 2 threads", "versions": {}}
    mixed = write_run(tmp_path / "mixed", "gsm8k", {"alpha": ALPHA_GSM8K}, environment=first,
                      resumes=[{"methods": ["alpha"], "added_methods": [], "environment": first},
                               {"methods": ["alpha"], "added_methods": [], "environment": other}])
    one = write_run(tmp_path / "one", "gsm8k", {"alpha": ALPHA_GSM8K}, environment=first,
                    resumes=[{"methods": ["alpha"], "added_methods": [], "environment": first}])
    table = environment_table(load_results([mixed, one]))
    row = table.csv.set_index("run")["machines"]
    assert row["mixed"] == "cpu: Intel(R) Xeon(R) Platinum, 2 threads; cpu: AMD EPYC, 2 threads"
    assert row["one"] == "cpu: Intel(R) Xeon(R) Platinum, 2 threads"
    said = [n for n in table.notes if "more than one machine" in n]
    assert len(said) == 1 and said[0].startswith("run(s) mixed were decoded") and " one," not in said[0]
