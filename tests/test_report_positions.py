"""Per-position acceptance over all verify steps (conventions.POSITION; `metrics.draft_room`, `metrics.per_position`):
a planted variable-length drafter, whose old "marginal" (conditioned on drafting >= j) would be flat at 1.0, and a
fixed-K drafter cut by its token budget; per task and per context tercile."""

from __future__ import annotations

import numpy as np
import pytest

from evalsuite import metrics
from evalsuite.report import positions
from tests.helpers import frames, step_row, turn_row

LIMITS = {"r": {"k": 7, "max_new_tokens": 128, "max_context": 8192}}


def variable_drafter(blocks: int = 4, context: int = 100):
    """Each block of four steps: drafts 1 (1 accepted), 5 (5), 0 (nothing proposed), 4 (2). The turn ends at EOS
    far below its 128-token budget, so every step had room for K = 7 drafts."""
    pattern = [(1, 1), (5, 5), (0, 0), (4, 2)]
    rows, produced = [], 1
    for i in range(blocks * 4):
        drafted, accepted = pattern[i % 4]
        rows.append(step_row("suffix", "s0", 0, i, context + produced - 1, drafted, accepted))
        produced += accepted + 1
    turn = turn_row("suffix", "s0", 0, context, new_tokens=produced, stop_reason="eos")
    return frames([turn, turn_row("ar", "s0", 0, context, new_tokens=produced, stop_reason="eos")], rows)


def test_marginal_counts_every_step_of_a_variable_length_drafter():
    steps, turns = variable_drafter()
    table = positions.position_table(steps, turns, LIMITS, by_tercile=False).set_index("position")
    assert table.room.tolist() == [16] * 7  # every step had room for all 7 positions
    assert table.marginal.loc[[1, 2, 3, 5, 6]].tolist() == pytest.approx([0.75, 0.5, 0.25, 0.25, 0.0])
    # conditioned on drafting >= j (the old definition) position 5 would be 4 of 4 = 1.0: only the 5-draft steps
    assert table.drafted.loc[5] == 4 and table.accepted.loc[5] == 4
    assert table.conditional.loc[2] == pytest.approx(0.5 / 0.75)
    assert set(table.kind) == {"variable"}
    lengths = positions.draft_length_table(steps, turns, LIMITS, by_tercile=False).iloc[0]
    assert lengths.mean_drafted == pytest.approx(2.5)
    assert lengths.accept_rate_per_drafted_token == pytest.approx(8 / 10)
    assert lengths.tau == pytest.approx(3.0) and lengths.kind == "variable"
    assert positions.acceptance_at(steps, turns, limits=LIMITS) == pytest.approx({1: 0.75, 3: 0.25, 5: 0.25})


def test_a_position_the_token_budget_forbade_is_not_a_rejection():
    # fixed K = 3, a turn of 8 tokens at its budget: step 0 has room 3 (drafts 3, all accepted, 4 tokens),
    # step 1 has room min(3, 8 - 5 - 1) = 2 (drafts 2, both accepted); position 3 was forbidden there
    rows = [step_row("dlite", "s0", 0, 0, 50, 3, 3), step_row("dlite", "s0", 0, 1, 54, 2, 2)]
    steps, turns = frames([turn_row("dlite", "s0", 0, 50, new_tokens=8)], rows)
    limits = {"r": {"k": 3, "max_new_tokens": 8, "max_context": 8192}}
    assert metrics.draft_room(steps, turns, limits).tolist() == [3, 2]
    rates = metrics.per_position(steps, room=metrics.draft_room(steps, turns, limits)).set_index("position")
    assert rates.marginal.loc[3] == pytest.approx(1.0) and rates.room.loc[3] == 1
    assert positions.draft_length_table(steps, turns, limits, by_tercile=False).kind.iloc[0] == "fixed"
    # without the run's limits K is the largest draft seen (3) and the turn's own length bounds the budget
    assert metrics.draft_room(steps, turns).tolist() == [3, 2]
    # without the turns only K bounds it: the short last draft counts as a miss at position 3
    assert metrics.draft_room(steps).tolist() == [3, 3]


def test_an_eos_turn_takes_its_budget_from_the_run_and_budget_limited_steps_have_no_room():
    rows = [step_row("m", "s0", 0, 0, 8190, 1, 1), step_row("m", "s0", 0, 1, 8192, 0, 0, budget_limited=True)]
    steps, turns = frames([turn_row("m", "s0", 0, 8190, new_tokens=3, stop_reason="eos")], rows)
    window = {"r": {"k": 7, "max_new_tokens": 64, "max_context": 8194}}  # 4 tokens left in the window
    assert metrics.draft_room(steps, turns, window).tolist() == [2, 0]


def test_terciles_split_a_task_by_turn_context_and_keep_steps_with_their_turn():
    rows, turns = [], []
    for i, context in enumerate([100, 200, 300, 400, 500, 600]):
        turns.append(turn_row("m", f"s{i}", 0, context, new_tokens=3, stop_reason="eos"))
        rows.append(step_row("m", f"s{i}", 0, 0, context, 2, 2 if context > 400 else 0))
    steps, turns = frames(turns, rows)
    table = positions.draft_length_table(steps, turns, LIMITS)
    parts = table.set_index("context_part")
    assert list(parts.index) == ["all", "T1", "T2", "T3"]
    assert parts.loc["T1", ["context_lo", "context_hi"]].tolist() == [100, 200]
    assert parts.loc["T3", ["context_lo", "context_hi"]].tolist() == [500, 600]
    assert parts.loc["T3", "tau"] == pytest.approx(3.0) and parts.loc["T1", "tau"] == pytest.approx(1.0)
    assert np.isclose(parts.loc["all", "tau"], (1 + 1 + 1 + 1 + 3 + 3) / 6)
    by_part = positions.position_table(steps, turns, LIMITS)
    assert set(by_part.context_part) == {"all", "T1", "T2", "T3"}
    assert by_part[(by_part.context_part == "T3") & (by_part.position == 2)].marginal.iloc[0] == pytest.approx(1.0)
