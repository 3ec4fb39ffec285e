"""Honest comparisons: "faster than ar" only with the interval clear of 1; best and ties by a
paired bootstrap over shared trajectories, on planted data where the marginal intervals overlap but the paired
ratio is clear, and where it is not."""

from __future__ import annotations

import numpy as np
import pytest

from evalsuite.report import decisions, stats
from tests.helpers import frames, steps_with_tau, turn_row


def paired_run(speedups: dict[str, np.ndarray], turns_per_traj: int = 2):
    """Trajectory i, method m: every turn at speedup speedups[m][i] against an ar whose speed varies by trajectory;
    τ planted equal to the speedup + 0.5 (so τ ranks like the speedup)."""
    n = len(next(iter(speedups.values())))
    turn_rows, step_rows = [], []
    for i in range(n):
        ar_s = 2.0 + 0.3 * i
        for t in range(turns_per_traj):
            turn_rows.append(turn_row("ar", f"s{i}", t, 1000 + 500 * t, decode_s=ar_s))
            for method, values in speedups.items():
                turn_rows.append(turn_row(method, f"s{i}", t, 1000 + 500 * t, decode_s=ar_s / values[i],
                                          ar_decode_s=ar_s))
                step_rows += steps_with_tau(method, f"s{i}", t, 1000 + 500 * t, values[i] + 0.5, n_steps=200)
    return frames(turn_rows, step_rows)


def marginal_ci(turns, method):
    cell = turns[turns.method == method]
    units = list(dict.fromkeys(stats.trajectory_keys(cell)))
    return stats.speedup_ci(cell, units, 0, 1000)


def test_overlapping_intervals_but_a_clear_paired_ratio_gives_a_clear_best():
    rng = np.random.default_rng(0)
    base = rng.uniform(1.2, 2.6, 10)  # trajectories differ a lot; both methods share that
    steps, turns = paired_run({"a": base, "b": base * 0.93 * (1 + 0.01 * rng.standard_normal(10))})
    (a_lo, a_hi), (b_lo, b_hi) = marginal_ci(turns, "a"), marginal_ci(turns, "b")
    assert a_lo < b_hi  # the marginal intervals overlap: the old rule called this a tie
    ranked = decisions.rank_methods(steps, turns, "speedup", n_resamples=1000).set_index("method")
    assert ranked.loc["a", "status"] == "best" and ranked.loc["b", "status"] == "behind"
    assert ranked.loc["b", "ratio_to_best"] == pytest.approx(1 / 0.93, rel=0.02)
    assert ranked.loc["b", "ratio_lo"] > 1.0
    assert "clearly ahead of b" in decisions.best_sentence(ranked.reset_index(), "swebench")
    tau = decisions.rank_methods(steps, turns, "tau", n_resamples=1000).set_index("method")
    assert tau.loc["a", "status"] == "best" and tau.loc["b", "ratio_lo"] > 1.0


def test_overlapping_intervals_and_an_unclear_paired_ratio_give_a_tie():
    rng = np.random.default_rng(1)
    base = rng.uniform(1.2, 2.6, 10)
    # b is about as fast on average, but trajectory by trajectory it is up to 20 % faster or slower
    ratio = np.array([0.8, 1.2, 0.85, 1.15, 0.9, 1.1, 0.95, 1.05, 1.0, 0.98])
    steps, turns = paired_run({"a": base, "b": base * ratio})
    ranked = decisions.rank_methods(steps, turns, "speedup", n_resamples=1000).set_index("method")
    best = ranked.index[ranked["rank"] == 1][0]
    assert set(ranked.status) == {"tied for best"}
    other = [m for m in ranked.index if m != best][0]
    assert ranked.loc[other, "ratio_lo"] <= 1.0 <= ranked.loc[other, "ratio_hi"]
    assert "not separable from" in decisions.best_sentence(ranked.reset_index(), "swebench")


def test_faster_than_ar_only_when_the_interval_is_clear_of_one():
    rng = np.random.default_rng(2)
    spread = np.array([0.85, 1.35, 0.9, 1.3, 0.95, 1.25, 1.0, 1.2])  # point estimate above 1, interval across it
    steps, turns = paired_run({"straddle": spread, "clear": 1.3 + 0.05 * rng.standard_normal(8),
                               "slow": 0.8 + 0.02 * rng.standard_normal(8)})
    table = decisions.speed_table(turns, n_resamples=1000).set_index("method")
    assert table.loc["straddle", "speedup"] > 1.0 and table.loc["straddle", "speedup_lo"] < 1.0
    assert table.loc["straddle", "verdict"] == "not separable from ar"
    assert table.loc["clear", "verdict"] == "faster than ar" and table.loc["clear", "speedup_lo"] > 1.0
    assert table.loc["slow", "verdict"] == "slower than ar"
    # the interval is the summary table's (same cell seed)
    summary = stats.summarize(steps, turns, n_resamples=1000).set_index("method")
    assert table.loc["clear", "speedup_lo"] == pytest.approx(summary.loc["clear", "speedup_ci_low"])
    few_steps, few_turns = paired_run({"clear": np.array([1.3, 1.4])})
    few = decisions.speed_table(few_turns, n_resamples=200).iloc[0]
    assert few.verdict == "no interval (n<3)" and np.isnan(few.speedup_lo)
    ranked = decisions.rank_methods(*paired_run({"x": np.array([1.3, 1.4]), "y": np.array([1.0, 1.1])}),
                                  n_resamples=200)
    assert set(ranked.status) == {"undecided (n<3)"}


def test_intervals_print_as_bounds_and_not_below_three_trajectories():
    assert decisions.format_estimate(2.71, 1.50, 7.56, 5, unit="×") == "2.71× [1.50, 7.56]"
    assert decisions.format_estimate(1.29, 1.29, 1.29, 2, unit="×") == "1.29× (n=2)"
    assert "±" not in decisions.format_estimate(1.06, 0.91, 1.20, 10)
    assert decisions.format_interval(np.nan, 1.0) == ""


def test_ties_follow_the_runner_up_rule():
    ok = {"lo": 1.05, "hi": 1.2}
    unclear = {"lo": 0.9, "hi": 1.3}
    # best clearly ahead of the runner-up: bold best, every other behind (whatever a later pairing says)
    status = decisions._statuses("a", ["b", "c"], {"b": ok, "c": unclear}, 3)
    assert status == {"a": "best", "b": "behind", "c": "behind"}
    # a tie with the runner-up extends down the ranking until the first method clearly behind
    status = decisions._statuses("a", ["b", "c", "d"], {"b": unclear, "c": ok, "d": unclear}, 3)
    assert status == {"a": "tied for best", "b": "tied for best", "c": "behind", "d": "behind"}
    nan = {"lo": float("nan"), "hi": float("nan")}
    assert set(decisions._statuses("a", ["b"], {"b": nan}, 3).values()) == {"undecided (n<3)"}
