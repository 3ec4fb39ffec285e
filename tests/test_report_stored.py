"""The report's statistics on a stored run (the drafters' held-out SWE-Bench run, an older layout): invariants that
tie break-even τ, the verdict against `ar`, the draft room, the telemetry and the degenerate flags together."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from evalsuite import metrics
from evalsuite.report import breakeven, decisions, effects, positions, stats, telemetry
from evalsuite.report.load import load_results

RUN = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "default-drafters" / "swebench-k7"


@pytest.fixture(scope="module")
def stored():
    if not (RUN / "run.json").is_file():
        pytest.skip("the stored example run is not in this checkout")
    return load_results([RUN])


def test_break_even_explains_the_measured_speedup_and_shares_the_tau_bins(stored):
    steps, turns = stored.steps, stored.turns
    overall = breakeven.break_even_overall(steps, turns, n_resamples=200).set_index("method")
    speed = decisions.speed_table(turns, n_resamples=200).set_index("method")
    # τ / τ*_step predicts the paired speedup to within 3 % (the rest is the drafters' start-of-turn work)
    assert np.allclose(overall.speedup_implied, speed.speedup.reindex(overall.index), rtol=0.03)
    # a method is faster than ar exactly where its τ sits clearly above its break-even
    for method, row in overall.iterrows():
        if speed.loc[method, "verdict"] == "faster than ar":
            assert row.tau_margin_lo > 0
        if speed.loc[method, "verdict"] == "slower than ar":
            assert row.tau_margin_hi < 0
    curves = stats.context_curves(steps, turns, n_resamples=50)
    merged = breakeven.add_break_even(curves, breakeven.break_even_by_bin(steps, turns))
    assert merged.tau_break_even.notna().all()
    by_bin = breakeven.break_even_by_bin(steps, turns).set_index(["method", "context_lo"])
    assert (by_bin.n_steps == curves.set_index(["method", "context_lo"]).n_steps.reindex(by_bin.index)).all()


def test_room_telemetry_and_flags_on_stored_data(stored):
    steps, turns = stored.steps, stored.turns
    limits = positions.run_limits(stored.runs)
    drafting = steps[steps.method != "ar"]
    room = metrics.draft_room(drafting, turns, limits)
    assert (drafting.num_drafted <= room).all() and ((room == 0) == drafting.budget_limited).all()
    fixed = drafting.method.isin(["dlite", "dflash", "dspark"])
    assert (drafting.num_drafted[fixed] == room[fixed]).all()  # fixed-K drafters always draft their room
    table = telemetry.telemetry(steps, turns, limits).set_index("method")
    assert (table.n_tokens == table.n_tokens.iloc[0]).all()  # lossless at T=0: the same tokens for every method
    assert table.loc["dlite", "aux_memory_bytes"] < table.loc["eagle3", "aux_memory_bytes"]
    assert (table.ttft_ms >= table.prefill_ms).all() and (table.turn_latency_ms > table.ttft_ms).all()
    # flags computed by the reader (the run predates the column); at T=0 every method produced the same replies,
    # so a flagged turn is flagged for all seven
    per_turn = turns[turns.degenerate].groupby(["sample_id", "turn"]).method.nunique()
    assert len(per_turn) >= 1
    assert (per_turn == turns.method.nunique()).all()
    effect = effects.context_effect(steps, turns, n_resamples=200)
    assert (effect.n_trajectories == 5).all() and effect.context_span.between(2, 5).all()
