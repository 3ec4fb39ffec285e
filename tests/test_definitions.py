"""Definitions: τ is the pooled ratio over verify steps, without budget-limited steps; one speedup (the report's
pooled one), and a per-turn column named as such."""

from __future__ import annotations

import pandas as pd
import pytest

from evalsuite import conventions, metrics
from evalsuite.report import stats
from evalsuite.store.records import STEP_SCHEMA, TURN_SCHEMA


def steps_frame(rows):
    return pd.DataFrame([{"run": "r", "method": "m", "task": "t", "sample_id": s, "turn": t, "num_accepted": a,
                          "budget_limited": b} for s, t, a, b in rows])


def test_tau_is_pooled_and_leaves_budget_limited_steps_out():
    steps = steps_frame([("a", 0, 3, False), ("a", 0, 0, True), ("a", 1, 1, False), ("b", 0, 0, False)])
    assert metrics.tau(steps) == pytest.approx((4 + 2 + 1) / 3)  # pooled over the three steps that could draft
    assert metrics.tau_turn_macro(steps) == pytest.approx((4 + 2 + 1) / 3)  # one step per counted turn here
    assert stats.tau_sums(steps, ["r\0a", "r\0b"]).tolist() == [[6.0, 2.0], [1.0, 1.0]]
    curve = stats.tau_curve(steps, steps.turn, seed=0, n_resamples=20)
    assert curve.set_index("key").tau.to_dict() == pytest.approx({0: 5 / 2, 1: 2.0})
    assert "pooled ratio over verify steps" in conventions.TAU and "token-weighted" not in conventions.TAU


def test_the_per_turn_speedup_column_is_named_per_turn():
    assert "speedup_turn" in TURN_SCHEMA.names and "speedup" not in TURN_SCHEMA.names
    assert "budget_limited" in STEP_SCHEMA.names
