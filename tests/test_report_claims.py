"""Issue 32: every verdict sentence earned by its data. Records are planted (turns and steps frames, as
`report.load` gives them), never the statistics: paired slope differences, the design gate, the held-out policy,
τ = 1 + Σ marginal, end-to-end speedups and timing noise."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

from evalsuite import metrics
from evalsuite.report import checks, decisions, effects, noise, policy, telemetry, verdict
from evalsuite.report.breakeven import break_even_overall
from tests.helpers import frames, step_row, steps_with_tau, turn_row


def two_methods(slope_a: float, slope_b: float, n_traj: int = 10, n_turns: int = 6, growth: float = 1.35,
                noise_sd: float = 0.02, seed: int = 4, task: str = "swebench"):
    """Trajectories whose contexts grow `growth` per turn; methods a and b with planted within-trajectory log
    speedup slopes, sharing a per-(trajectory, turn) shock (what a paired test cancels) and their own small
    noise."""
    rng = np.random.default_rng(seed)
    turn_rows, step_rows = [], []
    for i in range(n_traj):
        sample = f"s{i}"
        base = 1000 * (1.3 ** i)
        for t in range(n_turns):
            context = int(base * growth ** t)
            shared = 0.15 * rng.standard_normal()  # e.g. a turn whose reply is easy for every drafter
            for method, slope in (("a", slope_a), ("b", slope_b)):
                log_sp = 0.1 + slope * np.log(context) + shared + noise_sd * rng.standard_normal()
                turn_rows.append(turn_row(method, sample, t, context, task=task, decode_s=1.0 / np.exp(log_sp)))
                step_rows += steps_with_tau(method, sample, t, context, 2.0, n_steps=8, task=task)
            turn_rows.append(turn_row("ar", sample, t, context, task=task))
    return frames(turn_rows, step_rows)


def _verdict_for(steps, turns, task="swebench"):
    effect = effects.context_effect(steps, turns, n_resamples=500)
    differences = effects.slope_differences(steps, turns, n_resamples=500)
    design = effects.context_design(turns)
    speed = decisions.speed_table(turns, 0, 300)
    overall = break_even_overall(steps, turns, n_resamples=200)
    return differences, verdict.verdict(task, speed, overall, effect, None, design, differences)[1]


def test_same_slope_difference_covers_zero_and_no_holds_while_falls_sentence():
    steps, turns = two_methods(-0.1, -0.1)
    differences, sentence = _verdict_for(steps, turns)
    row = differences[differences.measure == "log_speedup"].iloc[0]
    assert row.n_trajectories == 10 and row.measurable
    assert row.difference_lo <= 0.0 <= row.difference_hi and not row.separable
    assert "holds while" not in sentence and "trend lies above" not in sentence
    assert "no two methods' speedup trends can be told apart" in sentence


def test_planted_difference_of_0_2_is_separable_and_the_sentence_appears():
    steps, turns = two_methods(0.0, -0.2)
    differences, sentence = _verdict_for(steps, turns)
    row = differences[differences.measure == "log_speedup"].iloc[0]
    assert (row.method_a, row.method_b) == ("a", "b")
    assert row.difference == pytest.approx(0.2, abs=0.03)
    assert row.difference_lo > 0 and row.separable
    assert "a holds while b falls (slope difference +0.2" in sentence
    # the paired bootstrap is tighter than the separate intervals: the shared shock cancels in the difference
    effect = effects.context_effect(steps, turns, n_resamples=500).set_index("method")
    separate = (effect.slope_hi - effect.slope_lo).min()
    assert row.difference_hi - row.difference_lo < separate


def test_slope_difference_is_the_function_issue_31_reuses():
    x = np.log([1000, 2000, 4000, 1000, 2000, 4000, 1000, 2000, 4000])
    groups = ["p"] * 3 + ["q"] * 3 + ["r"] * 3
    fit = effects.slope_difference(x, 0.3 * x + np.repeat([0, 1, 2], 3), groups, x, 0.1 * x, groups,
                                   n_resamples=200)
    assert fit["difference"] == pytest.approx(0.2) and fit["lo"] == pytest.approx(0.2)
    assert fit["n_groups"] == 3 and fit["slope_a"] == pytest.approx(0.3)


def test_contexts_growing_1_05_are_not_measurable_here():
    steps, turns = two_methods(0.0, -0.3, growth=1.05 ** 0.25, n_turns=5)  # a trajectory grows ×1.05
    design = effects.context_design(turns).iloc[0]
    assert not design.measurable and design.n_spanning == 0
    assert "median growth ×1.05" in design.reason
    differences, sentence = _verdict_for(steps, turns)
    assert "not measurable here" in sentence and "changes with context within" not in sentence
    label, _ = verdict.verdict("swebench", decisions.speed_table(turns, 0, 200),
                               break_even_overall(steps, turns, n_resamples=100),
                               effects.context_effect(steps, turns, n_resamples=200), None,
                               effects.context_design(turns), differences)
    assert label.endswith("context effect not measurable here")
    assert "holds while" not in sentence


def test_a_bin_of_few_turns_has_its_point_and_no_interval():
    from evalsuite.report import stats

    rows, step_rows = [], []
    for i in range(4):  # 4 single-turn trajectories: one bin of 4 turns from 4 trajectories
        rows += [turn_row("m", f"s{i}", 0, 100, decode_s=0.5), turn_row("ar", f"s{i}", 0, 100)]
        step_rows += steps_with_tau("m", f"s{i}", 0, 100, 2.0, n_steps=5)
    steps, turns = frames(rows, step_rows)
    curve = stats.context_curves(steps, turns, n_resamples=100).iloc[0]
    assert curve.n_trajectories == 4 and curve.n_turns == 4
    assert np.isfinite(curve.tau) and np.isnan(curve.tau_lo) and np.isnan(curve.speedup_hi)


def two_regimes(one_best_everywhere: bool, n_traj: int = 12):
    """Short turns (1k) and long turns (8k) in every trajectory; method `short` is fast at 1k, `long` at 8k (unless
    one method is best everywhere)."""
    rng = np.random.default_rng(7)
    rows = []
    for i in range(n_traj):
        for t, context in enumerate((1000, 1100, 8000, 8800)):
            jitter = 1 + 0.02 * rng.standard_normal()
            fast_short = 0.5 * jitter
            if one_best_everywhere:
                times = {"short": 0.5 * jitter, "long": 0.8 * jitter}
            else:
                times = {"short": fast_short if context < 5000 else 1.6 * jitter,
                         "long": 1.4 * jitter if context < 5000 else 0.6 * jitter}
            for method, decode in times.items():
                rows.append(turn_row(method, f"s{i}", t, context, decode_s=decode))
            rows.append(turn_row("ar", f"s{i}", t, context))
    return pd.DataFrame(rows)


def test_policy_held_out_equals_the_best_fixed_method_when_one_is_best_everywhere():
    turns = two_regimes(one_best_everywhere=True)
    row = policy.evaluate_policy(turns, seed=0, n_resamples=300).iloc[0]
    assert row.fixed_choices == "short / short" and row.switches == 0
    assert row.gain == pytest.approx(1.0, abs=1e-12) and row.policy_speedup == pytest.approx(row.fixed_speedup)


def test_policy_beats_the_best_fixed_method_on_two_regimes_held_out():
    turns = two_regimes(one_best_everywhere=False)
    row = policy.evaluate_policy(turns, seed=0, n_resamples=300).iloc[0]
    assert row.switches > 0 and row.gain > 1.3 and row.gain_lo > 1.0
    choices = policy.best_choices(turns, n_resamples=200)
    assert list(choices.best) == ["short", "long"]
    # the split is the seed's: another seed gives other halves but the same answer on this clean design
    first, second = policy.halves(turns.sample_id.map(lambda s: f"r\0{s}"), 0, "swebench")
    assert len(first) == len(second) == 6 and not set(first) & set(second)
    assert policy.evaluate_policy(turns, seed=1, n_resamples=200).iloc[0].gain > 1.3


def test_no_drafting_is_a_candidate():
    turns = two_regimes(one_best_everywhere=True)
    turns.loc[turns.method != "ar", "decode_s"] *= 4  # every drafter slower than ar
    row = policy.evaluate_policy(turns, n_resamples=100).iloc[0]
    assert row.fixed_choices == "ar / ar" and row.gain == pytest.approx(1.0)


def test_tau_equals_one_plus_sum_of_marginals_for_a_fixed_k_method():
    rng = np.random.default_rng(3)
    rows, step_rows = [], []
    for i in range(5):
        rows.append(turn_row("m", f"s{i}", 0, 500, new_tokens=10_000, stop_reason="eos"))
        for j in range(200):
            step_rows.append(step_row("m", f"s{i}", 0, j, 500 + j, 5, int(rng.integers(0, 6))))
    steps, turns = frames(rows, step_rows)
    table = checks.identity_table(steps, turns, {"r": {"k": 5, "max_new_tokens": 10_000, "max_context": 100_000}})
    row = table.iloc[0]
    assert row.kind == "fixed" and row.n_full_room_steps == 1000
    assert abs(row.tau_from_marginals - row.tau) < 1e-9 and abs(row.gap_full_room) < 1e-9
    assert row.tau == pytest.approx(metrics.tau(steps))
    hist = checks.accepted_length_histogram(steps)
    assert hist.share.sum() == pytest.approx(1.0) and hist.steps.sum() == 1000


def test_variable_length_drafter_breaks_the_per_drafted_convention_not_the_marginal_one():
    step_rows = [step_row("v", "s0", 0, j, 100 + j, d, a) for j, (d, a) in
                 enumerate([(0, 0), (2, 2), (5, 1), (0, 0), (1, 1)] * 20)]
    rows = [turn_row("v", "s0", 0, 100, new_tokens=10_000, stop_reason="eos")]
    steps, turns = frames(rows, step_rows)
    row = checks.identity_table(steps, turns, {"r": {"k": 5, "max_new_tokens": 10_000}}).iloc[0]
    assert row.kind == "variable"
    assert abs(row.gap_full_room) < 1e-9
    assert row.tau_from_drafted_conditional > row.tau + 0.5


def test_end_to_end_speedup_includes_the_shared_prefill():
    rows = []
    for i in range(4):
        # prefill 1 s shared (the first method in the turn paid it), decode 1 s vs ar's 2 s over 10 tokens
        rows.append(turn_row("m", f"s{i}", 0, 100, new_tokens=10, decode_s=1.0, ar_decode_s=2.0, ar_new_tokens=10,
                             prefill_s=1.0, prefill_tokens=100, draft_prefill_s=0.25))
        rows.append(turn_row("ar", f"s{i}", 0, 100, new_tokens=10, decode_s=2.0, ar_decode_s=2.0,
                             ar_new_tokens=10))
    step_rows = [step_row(m, f"s{i}", 0, 0, 100, 3 if m == "m" else 0, 2 if m == "m" else 0, step_s=0.1)
                 for i in range(4) for m in ("m", "ar")]
    steps, turns = frames(rows, step_rows)
    table = telemetry.end_to_end(steps, turns, n_resamples=200).set_index("method")
    assert table.loc["m", "decode_speedup"] == pytest.approx(2.0)
    assert table.loc["m", "latency_speedup"] == pytest.approx(3.0 / 2.0)  # (1 + 2) / (1 + 1)
    assert table.loc["m", "ttft_speedup"] == pytest.approx(1.0 / 1.25)
    assert table.loc["ar", "latency_speedup"] == 1.0
    assert np.isfinite(table.loc["m", "latency_speedup_lo"])


def test_weighted_percentile_matches_numpy_on_repeated_values():
    values, weights = np.array([3.0, 1.0, 2.0, 5.0]), np.array([2, 1, 4, 1])
    repeated = np.repeat(values, weights)
    for q in (0, 10, 50, 95, 99, 100):
        assert telemetry.weighted_percentile(values, weights, q) == pytest.approx(np.percentile(repeated, q))


def test_timing_noise_from_recorded_repeats_and_unmeasured_for_old_runs():
    rows = []
    for i in range(6):
        a = turn_row("a", f"s{i}", 0, 100, decode_s=1.0)
        a["repeat_decode_s"] = [1.0, 1.1, 0.9]
        b = turn_row("b", f"s{i}", 0, 100, decode_s=1.0)
        b["repeat_decode_s"] = [1.0, 1.0, 1.0]
        rows += [a, b]
    turns = pd.DataFrame(rows)
    table = noise.noise_table(turns, {"r": 3}).set_index("method")
    assert table.loc["a", "median_cv"] == pytest.approx(0.1) and table.loc["b", "median_cv"] == 0.0
    assert table.loc["a", "status"] == "measured"
    old = noise.noise_table(turns.drop(columns="repeat_decode_s"), {"r": 2}).iloc[0]
    assert old.n_turns_measured == 0 and "unmeasured" in old.status and np.isnan(old.median_cv)
    ranked = pd.DataFrame([{"task": "swebench", "method": "a", "rank": 1, "ratio_to_best": 1.0},
                           {"task": "swebench", "method": "b", "rank": 2, "ratio_to_best": 1.05}])
    assert "a tie" in noise.tie_clause(noise.noise_table(turns, {"r": 3}), ranked, "swebench")
    # Table 1's marks: a "best" that the bootstrap separates but the clock cannot is tied for best
    ranks = pd.DataFrame([
        {"task": "swebench", "measure": "speedup", "method": "a", "rank": 1, "ratio_to_best": 1.0, "status": "best"},
        {"task": "swebench", "measure": "speedup", "method": "b", "rank": 2, "ratio_to_best": 1.05,
         "status": "behind"},
        {"task": "swebench", "measure": "tau", "method": "a", "rank": 1, "ratio_to_best": 1.0, "status": "best"}])
    tied = noise.with_noise_ties(ranks, noise.noise_table(turns, {"r": 3}))
    assert list(tied.status) == ["tied for best", "tied for best", "best"]  # τ is not a timing
    far = ranks.assign(ratio_to_best=[1.0, 1.5, 1.0])
    assert list(noise.with_noise_ties(far, noise.noise_table(turns, {"r": 3})).status) == list(far.status)
    assert noise.with_noise_ties(ranks, old.to_frame().T).equals(ranks)  # unmeasured noise changes nothing


def test_old_runs_without_the_repeats_column_still_load(tmp_path):
    from evalsuite.report.load import load_results
    from tests.helpers import ALPHA_GSM8K, write_run

    run = write_run(tmp_path / "gsm8k", "gsm8k", {"alpha": ALPHA_GSM8K})
    import pyarrow.parquet as pq

    for part in (run / "turns.parquet").glob("*.parquet"):  # as written before the column existed
        table = pq.read_table(part)
        pq.write_table(table.drop(["repeat_decode_s"]), part)
    results = load_results([run])
    assert results.turns.repeat_decode_s.isna().all()
    assert noise.noise_table(results.turns).status.str.startswith("unmeasured").all()


def test_a_report_writes_the_new_sections_and_refuses_a_bad_hardware_dir(tmp_path):
    from evalsuite.errors import UserError
    from evalsuite.report.build import write_report
    from tests.helpers import ALPHA_GSM8K, write_run

    run = write_run(tmp_path / "gsm8k", "gsm8k", {"alpha": ALPHA_GSM8K})
    (tmp_path / "profile").mkdir()
    report = write_report([run], tmp_path / "report", n_resamples=100,
                          argv=["evalsuite", "report", str(run), "--out", str(tmp_path / "report"),
                                "--resamples", "100", "--hardware", os.path.relpath(tmp_path / "profile")])
    names = {p.name for p in report.files}
    for name in ("end_to_end.md", "policy.md", "other_hardware.md", "tau_identity.md", "accepted_length.md",
                 "acceptance_matrix.md", "context_design.md", "timing_noise.md", "command.txt"):
        assert name in names, name
    command = (tmp_path / "report" / "command.txt").read_text()
    assert f"evalsuite report {run} --out {tmp_path / 'report'} --resamples 100 --hardware" in command
    assert "## run gsm8k" in command
    # the rebuild line reads the runs where the report shows them, from the report's own directory
    rebuild = command.split("## rebuild it from the records shipped beside it")[1].strip().splitlines()[-1]
    assert str(tmp_path) not in rebuild
    assert rebuild == "evalsuite report ../gsm8k --out . --resamples 100 --hardware ../profile"
    assert "ANALYTIC MODEL, not a measurement" in (tmp_path / "report" / "tables" / "other_hardware.md").read_text()
    with pytest.raises(UserError, match="not a profile directory"):
        write_report([run], tmp_path / "again", n_resamples=100, hardware_dirs=[tmp_path])


def test_policy_by_previous_span_kind_beats_fixed_when_the_kind_decides():
    """One context bin; after a code reply method `c` is fast, after a prose reply method `p`: only the
    span-kind switch can see it."""
    rng = np.random.default_rng(11)
    rows, spans = [], []
    for i in range(12):
        kinds = ["code" if (i + t) % 2 else "prose" for t in range(6)]
        for t in range(6):
            previous = kinds[t - 1] if t else "prose"
            jitter = 1 + 0.02 * rng.standard_normal()
            times = {"c": 0.5 * jitter if previous == "code" else 1.5 * jitter,
                     "p": 0.5 * jitter if previous == "prose" else 1.5 * jitter}
            for method, decode in {**times, "ar": 1.0}.items():
                rows.append(turn_row(method, f"s{i}", t, 1000, new_tokens=4, decode_s=decode))
            spans.append({"run": "r", "method": "ar", "sample_id": f"s{i}", "turn": t, "n_tokens": 4,
                          "kind": [kinds[t]] * 4, "copy_len": [0] * 4, "context_copy_len": [0] * 4,
                          "skip_reason": ""})
    turns = pd.DataFrame(rows)
    table = policy.evaluate_policy(turns, n_resamples=200, spans=pd.DataFrame(spans)).set_index("switch_by")
    assert table.loc["context"].gain == pytest.approx(1.0, abs=1e-9)  # one bin: nothing to switch on
    span = table.loc[policy.SPAN_SWITCH]
    assert span.gain > 1.5 and span.gain_lo > 1.0


def test_a_projection_outside_the_profiled_contexts_says_it_is_extrapolated():
    from evalsuite.report import hardware
    from evalsuite.report.formatting import to_markdown
    from evalsuite.report.tables import hardware_table

    assert hardware.outside_share([500, 1500, 2500, 1800], (1000.0, 2000.0)) == 0.5
    assert hardware.outside_share([500, 90000], None) == 0.0  # a model covers every context
    row = dict.fromkeys(hardware.HARDWARE_COLUMNS, 1.0)
    row.update(task="gsm8k", method="ngram", surface="profile: cpu", kind="measured profile", validation_error=0.04,
               validated_cells=3, same_machine=True, speedup_projected=1.234)
    inside = hardware_table(pd.DataFrame([{**row, "outside_share": 0.0}]), [])
    outside = hardware_table(pd.DataFrame([{**row, "outside_share": 0.75}]), [])
    assert "extrapolated" not in to_markdown(inside)
    assert "1.23 (extrapolated: 75% of steps outside the profiled contexts)" in to_markdown(outside)
