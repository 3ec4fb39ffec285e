"""Break-even τ from planted costs, in the τ/speedup view's own turn bins; the cost view has its own bins."""

from __future__ import annotations

import numpy as np
import pytest

from evalsuite.report import breakeven, stats
from tests.helpers import frames, step_row, turn_row

# turn context -> (ar decode s, method draft s, method verify s, accepted per step)
SHORT, LONG = 1000, 1400
COSTS = {SHORT: (0.050, 0.005, 0.070, 1), LONG: (0.080, 0.020, 0.140, 0)}  # τ* 1.5 and 2.0; τ 2 and 1


def planted(n_traj: int = 4, turn_contexts=(SHORT, SHORT + 20, LONG, LONG + 20), n_steps: int = 30):
    turn_rows, step_rows = [], []
    for i in range(n_traj):
        for t, context in enumerate(turn_contexts):
            ar_s, draft_s, verify_s, accepted = COSTS[SHORT if context < LONG else LONG]
            step_rows += [step_row("ar", f"s{i}", t, j, context + 20 * j, 0, 0, verify_s=ar_s) for j in range(n_steps)]
            # the steps run 20 tokens a step past the turn's context (up to context + 580, past the next bin's lower
            # edge), but they belong to their turn's bin
            step_rows += [step_row("m", f"s{i}", t, j, context + 20 * j, 7, accepted, draft_s=draft_s,
                                   verify_s=verify_s, step_s=draft_s + verify_s + 0.001) for j in range(n_steps)]
            turn_rows += [turn_row("ar", f"s{i}", t, context, decode_s=n_steps * ar_s, new_tokens=n_steps + 1),
                          turn_row("m", f"s{i}", t, context, decode_s=n_steps * (draft_s + verify_s),
                                   new_tokens=n_steps * (accepted + 1) + 1, ar_decode_s=n_steps * ar_s,
                                   ar_new_tokens=n_steps + 1)]
    return frames(turn_rows, step_rows)


def test_break_even_tau_from_planted_costs_per_turn_bin():
    steps, turns = planted()
    table = breakeven.break_even_by_bin(steps, turns)
    assert list(table.columns) == breakeven.BIN_COLUMNS
    assert len(table) == 2 and set(table.method) == {"m"}
    short, long = table.iloc[0], table.iloc[1]
    assert short.tau_break_even == pytest.approx((5 + 70) / 50) and long.tau_break_even == pytest.approx(160 / 80)
    assert short.tau == pytest.approx(2.0) and long.tau == pytest.approx(1.0)
    assert short.ar_decode_ms == pytest.approx(50) and long.verify_ms == pytest.approx(140)
    assert short.tau_break_even_step == pytest.approx(76 / 50)  # whole steps: +1 ms of bookkeeping on our side
    assert short.speedup_implied == pytest.approx(2.0 / (76 / 50))
    # the cost rows carry the τ/speedup rows' labels and hold the same steps, although steps ran past the edge
    curves = stats.context_curves(steps, turns, n_resamples=100)
    merged = breakeven.add_break_even(curves, table)
    assert list(merged.columns[:merged.columns.get_loc("tau_break_even")]) == list(curves.columns[:10])
    assert merged.tau_break_even.tolist() == pytest.approx([1.5, 2.0])
    assert table.n_steps.tolist() == curves.n_steps.tolist() == [4 * 2 * 30] * 2
    assert (table.step_context_hi > table.context_hi).iloc[0]  # steps saw contexts past the bin's turn edges
    costs = stats.cost_curves(steps, turns)  # the cost view bins steps by their own context, with its own labels
    cost_bins = costs[costs.method == "m"]
    assert list(cost_bins.columns[2:4]) == ["step_context_lo", "step_context_hi"]
    assert cost_bins.step_context_hi.max() >= steps.context_len.max()  # its labels cover the contexts its steps saw
    assert cost_bins.n_steps.sum() == table.n_steps.sum()


def test_overall_margin_and_the_headline_piece():
    steps, turns = planted(turn_contexts=(SHORT, SHORT + 20))  # short turns only: τ 2 against τ* 1.5
    overall = breakeven.break_even_overall(steps, turns, n_resamples=200)
    row = overall.iloc[0]
    assert row.tau_break_even == pytest.approx(1.5) and row.tau_margin == pytest.approx(0.5)
    assert row.tau_margin_lo == pytest.approx(0.5) and row.tau_margin_hi == pytest.approx(0.5)
    sentence = breakeven.break_even_sentence(overall, "swebench")
    assert sentence.startswith("On swebench, m τ 2.00 sits 0.50 above its break-even 1.50")
    few = breakeven.break_even_overall(*planted(n_traj=2, turn_contexts=(LONG,)), n_resamples=200).iloc[0]
    assert few.tau_margin == pytest.approx(-1.0) and np.isnan(few.tau_margin_lo)
    assert "sits 1.00 below" in breakeven.break_even_phrase(few) and "no interval" in breakeven.break_even_phrase(few)
