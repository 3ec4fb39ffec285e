"""Within-trajectory context effect: the fixed-effects slope recovers a planted slope and a planted
zero despite trajectory effects that confound a pooled fit, with its cluster-bootstrap interval covering the truth."""

from __future__ import annotations

import numpy as np
import pytest

from evalsuite.report import effects
from tests.helpers import frames, steps_with_tau, turn_row


def planted(slope_speedup: float, slope_tau: float, n_traj: int = 12, n_turns: int = 6, noise: float = 0.03,
            seed: int = 1, single_turn_extra: int = 0, method: str = "m"):
    """Trajectories whose base context grows with i while their speedup and τ levels fall with i (a confound: the
    pooled across-trajectory slope is strongly negative), with the planted within-trajectory slopes on top."""
    rng = np.random.default_rng(seed)
    turn_rows, step_rows = [], []
    for i in range(n_traj):
        sample = f"s{i}"
        base = 1000 * 2 ** (i / 3)  # 1k .. 16k
        level = 0.8 - 0.5 * np.log(base / 1000)  # longer trajectories are slower at every turn
        tau_level = 3.0 - 0.4 * np.log(base / 1000)
        for t in range(n_turns):
            context = int(base * 1.25 ** t)
            log_sp = level + slope_speedup * np.log(context) + noise * rng.standard_normal()
            tau = tau_level + slope_tau * np.log(context) + 10 * noise * rng.standard_normal()
            turn_rows.append(turn_row(method, sample, t, context, decode_s=1.0 / np.exp(log_sp)))
            turn_rows.append(turn_row("ar", sample, t, context))
            step_rows += steps_with_tau(method, sample, t, context, tau, n_steps=100)
    for j in range(single_turn_extra):  # one-turn trajectories: no within information
        turn_rows.append(turn_row(method, f"one{j}", 0, 3000, decode_s=0.2))
        step_rows += steps_with_tau(method, f"one{j}", 0, 3000, 6.0)
    return frames(turn_rows, step_rows)


def test_within_slope_recovers_a_planted_slope_that_a_pooled_fit_gets_wrong():
    steps, turns = planted(slope_speedup=0.3, slope_tau=0.5, single_turn_extra=2)
    table = effects.context_effect(steps, turns, seed=0, n_resamples=1000)
    assert list(table.columns[:len(effects.EFFECT_COLUMNS)]) == effects.EFFECT_COLUMNS
    row = table.set_index("method").loc["m"]
    assert row.slope_log_speedup == pytest.approx(0.3, abs=0.03)
    assert row.slope_lo <= 0.3 <= row.slope_hi and row.slope_lo > 0.2 and row.slope_hi < 0.4
    assert row.slope_tau == pytest.approx(0.5, abs=0.1)
    assert row.slope_tau_lo <= 0.5 <= row.slope_tau_hi
    # the one-turn trajectories carry no within information: not in the slope's n, but in the share
    assert row.n_trajectories == 12 and row.n_turns == 72
    assert row.n_turns_all == 74 and row.n_trajectories_all == 14
    assert row.context_span == pytest.approx(1.25 ** 5, rel=0.01)  # each trajectory's contexts grow 1.25x a turn
    # a pooled OLS over all turns (what context bins show) is pulled far from the truth by the trajectory levels
    table_turns = effects.turn_table(steps, turns)
    pooled = np.polyfit(table_turns.log_context, table_turns.log_speedup, 1)[0]
    assert pooled < 0.1


def test_within_slope_recovers_a_planted_zero_and_its_interval_covers_it():
    steps, turns = planted(slope_speedup=0.0, slope_tau=0.0, seed=3)
    row = effects.context_effect(steps, turns, seed=0, n_resamples=1000).iloc[0]
    assert abs(row.slope_log_speedup) < 0.05 and row.slope_lo <= 0.0 <= row.slope_hi
    assert abs(row.slope_tau) < 0.15 and row.slope_tau_lo <= 0.0 <= row.slope_tau_hi


def test_share_above_one_counts_turns_and_ar_gets_no_row():
    steps, turns = planted(slope_speedup=0.0, slope_tau=0.0, n_traj=12, n_turns=3, noise=0.0)
    table = effects.context_effect(steps, turns, n_resamples=200)
    assert list(table.method) == ["m"]
    # trajectory i has log speedup 0.8 - 0.5 log(base_i / 1000), the same at every turn (zero slope, no noise)
    expected = np.mean([0.8 - 0.5 * np.log(2 ** (i / 3)) > 0 for i in range(12) for _ in range(3)])
    assert 0.3 < expected < 0.7
    assert table.share_turns_above_1.iloc[0] == pytest.approx(expected)


def test_no_interval_below_three_trajectories_and_no_slope_without_within_information():
    steps, turns = planted(slope_speedup=0.2, slope_tau=0.0, n_traj=2, n_turns=4)
    row = effects.context_effect(steps, turns, n_resamples=200).iloc[0]
    assert row.n_trajectories == 2 and np.isfinite(row.slope_log_speedup)
    assert np.isnan(row.slope_lo) and np.isnan(row.slope_hi) and np.isnan(row.slope_tau_lo)
    steps, turns = planted(slope_speedup=0.2, slope_tau=0.0, n_traj=0, single_turn_extra=5)
    row = effects.context_effect(steps, turns, n_resamples=200).iloc[0]
    assert row.n_trajectories == 0 and np.isnan(row.slope_log_speedup) and row.n_turns_all == 5


def test_within_slope_is_invariant_to_trajectory_levels():
    x = np.log([1000, 2000, 4000, 1000, 2000, 4000, 8000, 16000, 32000])
    y = 0.5 * x + np.array([0, 0, 0, 5, 5, 5, -3, -3, -3])
    groups = ["a"] * 3 + ["b"] * 3 + ["c"] * 3
    fit = effects.within_slope(x, y, groups, n_resamples=200)
    assert fit["slope"] == pytest.approx(0.5) and fit["lo"] == pytest.approx(0.5) and fit["hi"] == pytest.approx(0.5)
    assert effects.per_doubling(1.0) == pytest.approx(1.0)


def test_the_context_effect_figure_draws_each_trajectory_and_the_pooled_slope():
    from evalsuite.report.figures import context_effect_figure

    steps, turns = planted(slope_speedup=0.3, slope_tau=0.0, n_traj=4, n_turns=3, single_turn_extra=1)
    table = effects.context_effect(steps, turns, n_resamples=200)
    figure = context_effect_figure(steps, turns, table)
    ax = figure.axes[0]
    trajectories = [line for line in ax.lines if line.get_label() == "_trajectory"]
    assert len(trajectories) == 5  # four multi-turn trajectories and the one-turn one (a single point)
    pooled = [line for line in ax.lines if line.get_label() == "m"]
    assert len(pooled) == 1
    x, y = pooled[0].get_data()
    assert np.log(y[-1] / y[0]) / np.log(x[-1] / x[0]) == pytest.approx(table.slope_log_speedup.iloc[0])
    single = planted(0.0, 0.0, n_traj=0, single_turn_extra=3)
    assert context_effect_figure(*single, effects.context_effect(*single, n_resamples=50)) is None


def test_a_trajectory_timed_on_two_machines_keeps_each_machines_speedup_level_apart():
    """A study resumed on slower hardware: every trajectory's later (longer) turns were decoded on a machine where
    the speedup is 30 % lower at every context. With no context effect on either machine the speedup slope is 0
    (a trajectory-only fixed effect would read the machine change as a fall with context); τ is unaffected; the
    clusters are still the trajectories."""
    rng = np.random.default_rng(3)
    turn_rows, step_rows = [], []
    for i in range(10):
        sample = f"s{i}"
        for t in range(6):
            context = int(2000 * 2 ** (i / 4) * 1.3 ** t)
            machine = "cpu (Intel)" if t < 3 else "cpu (AMD EPYC)"
            log_sp = 0.1 + (0.0 if t < 3 else np.log(0.7)) + 0.01 * rng.standard_normal()
            for method, decode_s in (("m", 1.0 / np.exp(log_sp)), ("ar", 1.0)):
                row = turn_row(method, sample, t, context, decode_s=decode_s)
                row["worker_host"], row["worker_device"] = "vm", machine
                turn_rows.append(row)
            step_rows += steps_with_tau("m", sample, t, context, 2.0, n_steps=50)
    steps, turns = frames(turn_rows, step_rows)
    row = effects.context_effect(steps, turns, n_resamples=200).iloc[0]
    assert abs(row.slope_log_speedup) < 0.03 and row.slope_lo < 0 < row.slope_hi
    assert row.n_trajectories == 10  # clusters: the trajectories, not their machine halves
    mixed = turns.assign(worker_device="cpu")  # the same turns without the machine recorded
    naive = effects.context_effect(steps, mixed, n_resamples=200).iloc[0]
    assert naive.slope_log_speedup < -0.3 and naive.slope_hi < 0
    # the difference of two methods' slopes uses the same cells
    ones = turns[turns.method == "m"].assign(method="n")
    steps_n = steps[steps.method == "m"].assign(method="n")
    import pandas as pd
    diff = effects.slope_differences(pd.concat([steps, steps_n]), pd.concat([turns, ones]), n_resamples=200)
    speed = diff[diff.measure == "log_speedup"].iloc[0]
    assert speed.slope_a == pytest.approx(row.slope_log_speedup) and speed.difference == pytest.approx(0.0)
